"""A deterministic toy "model" for protocol tests, and checks that it behaves as designed.

It plays FrozenLake greedily (down until the last row, then right) and obeys rules of the
form "when <situation>, do not <action>" found in its prompt (parsed by forge.learn.rules), where
the situation is FrozenLake's own (``frozenlake_situation``: surroundings, no coordinates), so memory written by
reflection really changes its behaviour. Reflection requests get ``reflection`` (garbage by
default, so the fallback path is exercised). Module-level and picklable: worker processes
and subprocess runs import it by name.
"""

from __future__ import annotations

import functools
import json
import re

from forge.envs.gym import frozenlake_situation
from forge.learn import rules
from forge.llm.base import Request
from forge.llm.testing import ScriptedLLM

MOVES = ("left", "down", "right", "up")


def _user(request: Request) -> str:
    return next((m.content for m in reversed(request.messages) if m.role == "user"), "")


def _situation(request: Request) -> str:
    return frozenlake_situation(_user(request))


def _banned(request: Request, situation: str) -> set[str]:
    return rules.forbidden_in((m.content for m in request.messages), situation, MOVES)


def answer(request: Request, *, reflection: str = "I think you should be careful.") -> str:
    if request.choices is None and request.json_schema is None and "reflection agent" not in request.messages[0].content:
        return "Keep going."  # analyst notes / thoughts
    if request.json_schema is not None or "reflection agent" in request.messages[0].content:
        if reflection == "valid-rules":
            sit = re.search(r"in the situation '([^']+)' the action '(\w+)'", request.messages[-1].content)
            if sit:
                when, act = sit.group(1), sit.group(2)
                rule = f"when {when[:1].lower() + when[1:]}, then do not {act}"
                role = "actor" if "Rules of actor" in request.messages[-1].content else "planner"
                return json.dumps({"edits": [{"role": role, "delete": [], "add": [rule, "when lost, then call teleport_home()"]}]})
        return reflection
    options = list(request.choices)
    if not set(options) <= set(MOVES):
        return options[0]  # analyst tools, proposals
    situation = _situation(request)
    banned = _banned(request, situation)
    row = re.search(r"You are at row (\d+)", _user(request))
    prefs = ["down", "right", "left", "up"] if not row or int(row.group(1)) < 3 else ["right", "down", "up", "left"]
    for p in prefs:
        if p in options and p not in banned:
            return p
    return options[0]


def toy_llm(reflection: str = "I think you should be careful.") -> ScriptedLLM:
    return ScriptedLLM(functools.partial(answer, reflection=reflection), capabilities=("choices",))


def toy_factory() -> ScriptedLLM:
    return toy_llm()


def valid_factory() -> ScriptedLLM:
    return toy_llm("valid-rules")


def test_toy_llm_obeys_rules_in_its_prompt():
    from forge.envs import make_env
    from forge.llm.base import Message

    env = make_env("frozenlake-4x4")
    env.reset(seed=0)
    env.step("down")
    obs = env.step("down").observation  # row 2, col 0: the hole is below
    assert frozenlake_situation(obs) == "on a frozen tile; left: edge; down: hole; right: frozen; up: frozen; goal: down-right at distance 4"
    plain = Request(messages=[Message("system", "x"), Message("user", obs)], choices=MOVES)
    ruled = Request(messages=[Message("system", "## Rules\n[0] when left: edge; down: hole, then do not down"), Message("user", obs)], choices=MOVES)
    assert answer(plain) == "down"
    assert answer(ruled) == "right"
