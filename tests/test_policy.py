"""Acting agents: constrained choice, memory from the engine, a stable prompt prefix."""

from __future__ import annotations

import dataclasses

from forge.engine.memory import Memory
from forge.envs import make_env
from forge.envs.situation import summarize_observation
from forge.errors import ConfigError
from forge.learn.policy import ANALYST_TOOLS, FlatPolicy, make_policy, strip_map
from forge.learn.prompt import recollect
from forge.llm.testing import ScriptedLLM
from forge.model import Kind, Unit, Viewer


def test_summarize_observation_is_one_short_sentence():
    env = make_env("frozenlake-4x4")
    obs = env.reset(seed=0)
    assert summarize_observation(obs) == "You are at row 0, col 0, on a start tile"
    assert "Map" not in strip_map(obs) and "Next to you" in strip_map(obs) and "Last step" in strip_map(obs)


# frozenlake-4x4's start as its rules name it (EnvSpec.situation): surroundings, no coordinates
START = "on the start tile; left: edge; down: frozen; right: frozen; up: edge; goal: down-right at distance 6"


def _memory(*units: Unit) -> Memory:
    mem = Memory.open(":memory:", embedder="hash")
    mem.add(list(units))
    return mem


def test_flat_policy_uses_constrained_choice_and_memory():
    env = make_env("frozenlake-4x4")
    llm = ScriptedLLM()  # obeys: first option
    rule = Unit(f"when {START}, do not left; down was safe there", kind=Kind.RULE, owner="a", scope="private")
    with _memory(rule) as mem:
        obs = env.reset(seed=0)
        rec = recollect(mem, viewer=Viewer.of("a"), query=obs, role="actor", valid_actions=env.valid_actions())
        policy = FlatPolicy(llm=lambda role: llm, spec=env.spec)
        d = policy.act(observation=obs, valid_actions=env.valid_actions(), history=[], memory={"actor": rec})
        assert d.action == "left"
        assert list(llm.last_request.choices) == ["left", "down", "right", "up"]
        assert "## Rules" in llm.last_request.messages[0].content
        # the rule for this exact situation is repeated next to the question
        assert "Memory for this situation:" in llm.last_request.messages[-1].content
        assert d.shown == (rule.id,) and d.now == (rule.id,)
        guarded = FlatPolicy(llm=lambda role: llm, spec=env.spec, rule_guard=True)
        d = guarded.act(observation=obs, valid_actions=env.valid_actions(), history=[], memory={"actor": rec})
        assert d.action == "down"
        # the guard offers what the rule names as safe, as the prompt's "Choose one of" does
        assert list(llm.last_request.choices) == ["down"]


def test_the_guard_without_a_named_safe_action_excludes_only_the_forbidden():
    env = make_env("frozenlake-4x4")
    llm = ScriptedLLM()
    rule = Unit(f"when {START}, do not left", kind=Kind.RULE, owner="a", scope="private")
    with _memory(rule) as mem:
        obs = env.reset(seed=0)
        rec = recollect(mem, viewer=Viewer.of("a"), query=obs, role="actor", valid_actions=env.valid_actions())
        guarded = FlatPolicy(llm=lambda role: llm, spec=env.spec, rule_guard=True)
        assert guarded.act(observation=obs, valid_actions=env.valid_actions(), history=[], memory={"actor": rec}).action == "down"
        assert list(llm.last_request.choices) == ["down", "right", "up"]


def test_system_prompt_is_identical_across_steps():
    """The memory block is written once per episode: the prefix llama.cpp caches holds."""
    env = make_env("frozenlake-4x4")
    llm = ScriptedLLM()
    rules = [Unit(f"when you are at row {r}, col 0, on a frozen tile, do not down", kind=Kind.RULE) for r in range(3)]
    with _memory(*rules) as mem:
        obs = env.reset(seed=0)
        rec = recollect(mem, viewer=Viewer.of("a"), query=obs, role="actor", valid_actions=env.valid_actions())
        policy = FlatPolicy(llm=lambda role: llm, spec=env.spec)
        systems = []
        for _ in range(3):
            policy.act(observation=obs, valid_actions=env.valid_actions(), history=[], memory={"actor": rec})
            systems.append(llm.last_request.messages[0].content)
            obs = env.step("down").observation
        assert len(set(systems)) == 1


def test_sampling_temperature_and_seed_reach_the_llm():
    env = make_env("frozenlake-4x4")
    llm = ScriptedLLM()
    policy = FlatPolicy(llm=lambda role: llm, spec=env.spec, temperature=0.4, seed=7)
    policy.act(observation=env.reset(seed=0), valid_actions=env.valid_actions(), history=[], memory={})
    first = llm.last_request
    policy.act(observation=env.reset(seed=0), valid_actions=env.valid_actions(), history=[], memory={})
    assert first.temperature == 0.4 and first.seed is not None and llm.last_request.seed != first.seed


def test_unknown_policy():
    import pytest

    with pytest.raises(ConfigError):
        make_policy("swarm", llm=lambda r: ScriptedLLM(), spec=make_env("frozenlake-4x4").spec)


def test_a_guarded_policy_reads_its_rules_against_this_rooms_commands():
    """A recollection made in the first room (TextWorld) still forbids, in a later room, an
    exit the first room lacked, and offers that room's own commands."""
    first = ["go north", "go south", "look"]
    here = ["go east", "go north", "go south", "look"]
    obs = "Room: a hall.\nCame in from: north."
    situation = "in a room; exits north, south, east; go north: the way back"
    rule = Unit("when go north: the way back, do not go north; go east was safe there", kind=Kind.RULE)
    spec = dataclasses.replace(make_env("frozenlake-4x4").spec, situation=lambda o: situation)
    llm = ScriptedLLM()  # first option
    with _memory(rule) as mem:
        rec = recollect(mem, viewer=Viewer.of("a"), query="a hall", role="actor", valid_actions=first)
        policy = FlatPolicy(llm=lambda role: llm, spec=spec, rule_guard=True)
        d = policy.act(observation=obs, valid_actions=here, history=[], memory={"actor": rec})
        assert list(llm.last_request.choices) == ["go east"] and d.action == "go east" and d.followed is True
        assert "Choose one of: go east." in llm.last_request.messages[-1].content


# -- returns: advice that led back is not the only offer ---------------------------------------

# learned on a training map of the quick demo; bound to held-out map 10002 it named "right" at
# row 2, col 0 and, its actions swapped, "left" at row 2, col 1
SHUTTLE_RULE = "when down: hole; right: frozen, do not down; right was safe there"


def _heeds_choose_one_of(request) -> str:
    """A stand-in for the 1.5B as the demo's records show it: it takes the first action the
    prompt's "Choose one of" line offers, and otherwise prefers down, then right."""
    user = request.messages[-1].content
    _, said, rest = user.partition("Choose one of: ")
    if said:
        return rest.split(".")[0].split(", ")[0]
    return next(a for a in ("down", "right", "up", "left") if a in request.choices)


def _play_map_10002(policy: FlatPolicy, mem: Memory) -> list[str]:
    """Ten steps on held-out map 10002 (S F F F / F H F F / F F H F / H H F G); the places."""
    env = make_env("frozenlake-random-4x4")
    obs, places = env.reset(seed=10002), []
    rec = recollect(mem, viewer=Viewer.of("a"), query=obs, role="actor", valid_actions=env.valid_actions())
    history: list[str] = []
    for _ in range(10):
        places.append(env.spec.place(obs))
        d = policy.act(observation=obs, valid_actions=env.valid_actions(), history=history, memory={"actor": rec})
        history.append(d.action)
        result = env.step(d.action)
        obs = result.observation
        if result.done:
            break
    return places


def test_a_return_is_not_offered_only_the_advice_that_led_back():
    """Without the episode's returns, the rule and its mirror walked the agent between two
    tiles to the step limit (the demo's held-out map 10002, 3 of 8 episodes); with them, the
    second time at row 2, col 0 it is offered what it has not done there, and climbs out."""
    rule = Unit(SHUTTLE_RULE, kind=Kind.RULE, owner="a", scope="private")
    with _memory(rule) as mem:
        llm = ScriptedLLM(_heeds_choose_one_of, capabilities=("choices",))
        blind = FlatPolicy(llm=lambda role: llm, spec=dataclasses.replace(make_env("frozenlake-random-4x4").spec, place=None))
        shuttle = _play_map_10002(blind, mem)
        assert shuttle[2:] == ["row 2, col 0", "row 2, col 1"] * 4  # the defect, as it was
        llm = ScriptedLLM(_heeds_choose_one_of, capabilities=("choices",))
        seeing = FlatPolicy(llm=lambda role: llm, spec=make_env("frozenlake-random-4x4").spec)
        places = _play_map_10002(seeing, mem)
        assert places[:4] == ["row 0, col 0", "row 1, col 0", "row 2, col 0", "row 2, col 1"]
        # back at row 2, col 0: offered the untried move the situation reads as the advice did
        # ("up: frozen" like "right: frozen"), not the edge (left) and never the forbidden down
        back = next(r.messages[-1].content for r in llm.requests[4:] if "row 2, col 0" in r.messages[-1].content)
        assert "Already done here this time: right. Choose one of: up." in back
        assert places[4:6] == ["row 2, col 0", "row 1, col 0"]  # it climbed out of the pair



def test_visits_follow_the_loops_record_and_start_again_with_a_new_episode():
    from forge.learn.policy import Visits

    visits = Visits(lambda obs: obs.split("|")[0])
    assert visits.tried("A|1", []) == ()
    visits.took("right")
    assert visits.tried("B|2", ["right"]) == ()
    visits.took("left")
    assert visits.tried("A|3", ["right", "left"]) == ("right",)  # back where right was taken
    visits.took("up")
    assert visits.tried("A|0", []) == ()  # a new episode: nothing was done yet
    # steps it did not choose (another policy's) leave their places unknown, not misread
    assert visits.tried("A|9", ["right", "left"]) == ()
    assert Visits(None).tried("A|1", ["right"]) == ()


def test_the_goals_way_stays_offered_however_often_it_was_taken():
    from forge.learn.prompt import Recollection

    situation = "in a room; go east: the goal's way; go west: the way back"
    rule = Unit("when go west: the way back, do not go west; go east was safe there", kind=Kind.RULE)
    actions = ["go east", "go west", "look"]
    with _memory(rule) as mem:
        rec: Recollection = recollect(mem, viewer=Viewer.of("a"), query="a room", role="actor", valid_actions=actions)
        assert rec.offered(situation) == ["go east"]
        assert rec.offered(situation, tried=["go east"]) == ["go east"]
        assert rec.offered(situation, tried=["look"]) == ["go east"]
        # with no rule forbidding anything here, returns change nothing: memory narrowed nothing
        assert rec.offered("in a room; go north: an exit", ["go north", "look"], tried=["go north"]) == ["go north", "look"]


def test_the_hierarchical_policy_and_the_guard_see_returns_too():
    """The same map with the paper's analyst, chooser and planner behind the rule guard: the
    guard's offer is where the pair of tiles would hold it, and it lets go on the return."""
    from forge.learn.policy import HierarchicalPolicy

    def stand_in(request) -> str:
        if not request.choices:
            return "Mind the hole below."
        return _heeds_choose_one_of(request) if request.choices != list(ANALYST_TOOLS) else request.choices[0]

    rule = Unit(SHUTTLE_RULE, kind=Kind.RULE, owner="a", scope="private")
    env = make_env("frozenlake-random-4x4")
    with _memory(rule) as mem:
        obs, places, history = env.reset(seed=10002), [], []
        recs = {role: recollect(mem, viewer=Viewer.of("a"), query=obs, role=role, valid_actions=env.valid_actions())
                for role in ("planner", "action_chooser", "analyst")}
        llm = ScriptedLLM(stand_in, capabilities=("choices",))
        policy = HierarchicalPolicy(llm=lambda role: llm, spec=env.spec, proposals=1, rule_guard=True)
        for _ in range(6):
            places.append(env.spec.place(obs))
            d = policy.act(observation=obs, valid_actions=env.valid_actions(), history=history, memory=recs)
            history.append(d.action)
            obs = env.step(d.action).observation
        assert places == ["row 0, col 0", "row 1, col 0", "row 2, col 0", "row 2, col 1", "row 2, col 0", "row 1, col 0"]
