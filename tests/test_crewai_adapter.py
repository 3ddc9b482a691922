"""forge.integrations.crewai with the real crewai: a minimal Crew whose agent is driven by a
scripted LLM written on crewai's own BaseLLM (no network, telemetry and tracing off),
remembering a task's result through ForgeStorage and reading it back into the next task's
prompt; crewai's Memory API on the same storage (scopes, categories, privacy, duplicates,
forget); the storage over the service's Client; and ForgeCrewTrace recording a crew's run
(a tool call, its result, the task's output) through crewai's step and task callbacks,
reported with its outcome to a Memory reflecting with the scripted test LLM."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

for _name, _value in {"CREWAI_DISABLE_TELEMETRY": "true", "CREWAI_TRACING_ENABLED": "false", "CREWAI_TESTING": "true"}.items():
    os.environ.setdefault(_name, _value)  # before crewai is imported: it reads them then

pytest.importorskip("crewai")

from crewai import Agent, Crew, Task  # noqa: E402
from crewai.llms.base_llm import BaseLLM  # noqa: E402
from crewai.utilities.i18n import I18N_DEFAULT  # noqa: E402
from pydantic import Field  # noqa: E402

from forge.engine.embed import HashingEmbedder  # noqa: E402
from forge.engine.memory import Memory  # noqa: E402
from forge.errors import ConfigError  # noqa: E402
from forge.integrations.crewai import ForgeCrewTrace, ForgeStorage  # noqa: E402
from forge.llm.testing import ScriptedLLM as ForgeScriptedLLM  # noqa: E402
from forge.model import Status, Viewer  # noqa: E402
from forge.store import Filter, SQLiteStore  # noqa: E402

STALL = "The worker stalls when the queue exceeds 10k jobs."
# crewai's Agent reads its own deprecated fields while it sets itself up (crewai 1.15): its
# deprecations, raised inside crewai, are not this project's
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:crewai")


class ScriptedLLM(BaseLLM):
    """An LLM on crewai's own base class: the agent's turns from a script, and crewai's memory
    prompts (extract, analyse for save, consolidate, explore) answered by what they ask."""

    answers: list[str] = Field(default_factory=list)
    prompts: list[str] = Field(default_factory=list)  # every prompt, in order
    agent_prompts: list[str] = Field(default_factory=list)  # those the agent's turns answered

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None, available_functions: Any = None,
             from_task: Any = None, from_agent: Any = None, response_model: Any = None, **kw: Any) -> str:
        msgs = [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
        system = next((str(m["content"]) for m in msgs if m.get("role") == "system"), "")
        text = "\n".join(str(m.get("content", "")) for m in msgs)
        self.prompts.append(text)
        memory = I18N_DEFAULT.memory
        if system == memory("extract_memories_system"):  # the task's result, as one memory
            result = text.split("Result:", 1)[1].split("Extract memory statements")[0]
            return json.dumps({"memories": [result.split("Final Answer:")[-1].strip()]})
        if system == memory("save_system"):
            return json.dumps({"suggested_scope": "/ops", "categories": ["incidents"], "importance": 0.8})
        if system == memory("consolidation_system"):  # crewai's own merge: keep both, FORGE decides
            return json.dumps({"actions": [], "insert_new": True})
        if system == memory("query_system"):
            raise AssertionError("short queries skip query analysis")
        if "Relevant memory excerpts" in text:
            return "The excerpts answer the query."
        self.agent_prompts.append(text)
        return f"Thought: I know this now.\nFinal Answer: {self.answers.pop(0)}"

    def supports_function_calling(self) -> bool:
        return False

    def supports_stop_words(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 8192


@pytest.fixture
def mem(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))  # crewai's own files (task outputs), not ~/.local
    m = Memory(SQLiteStore(tmp_path / "crew.db"), HashingEmbedder(128))
    yield m
    m.close()


def _agent(llm: ScriptedLLM) -> Agent:
    return Agent(role="ops engineer", goal="keep the workers running", backstory="on call", llm=llm, max_iter=2)


def _crewai_units(mem: Memory, **kw: Any) -> list[Any]:
    return mem.list(viewer=Viewer.admin(), filter=Filter.make(tags_all=["crewai"], **kw))


def test_a_crew_remembers_a_result_and_reads_it_into_the_next_prompt(mem) -> None:
    llm = ScriptedLLM(model="scripted", answers=[STALL, STALL])
    storage = ForgeStorage(mem)
    crew_memory = storage.crew_memory(llm=llm)
    try:
        task = Task(description="Find out why the worker stalls.", expected_output="The cause.", agent=_agent(llm))
        first = Crew(agents=[task.agent], tasks=[task], memory=crew_memory, tracing=False).kickoff()
        assert first.raw == STALL
        assert len(llm.agent_prompts) == 1 and "Relevant memories" not in llm.agent_prompts[0]  # nothing known yet

        # crewai extracted the result as a memory, analysed it into /ops, and FORGE admitted it.
        [unit] = _crewai_units(mem)
        assert unit.content == STALL and unit.kind.value == "fact" and unit.importance == 0.8
        assert {"crewai:/ops", "crewai-category:incidents"} <= set(unit.context.tags)
        assert unit.meta["crewai"]["scope"] == "/ops" and storage.last_admissions[0].action == "add"

        llm.agent_prompts.clear()
        again = Task(description="The worker is stuck again; what do we know?", expected_output="What is known.", agent=_agent(llm))
        second = Crew(agents=[again.agent], tasks=[again], memory=crew_memory, tracing=False).kickoff()
        assert second.raw == STALL
        # FORGE's recall reached the agent's prompt, through crewai's recall flow.
        [task_prompt] = llm.agent_prompts
        assert "The worker is stuck again" in task_prompt and "Relevant memories:" in task_prompt and STALL in task_prompt

        # The second result repeats the first: admission merged it, one unit, corroborated.
        assert storage.last_admissions[0].action == "noop" and storage.last_admissions[0].unit_id == unit.id
        [kept] = _crewai_units(mem)
        assert kept.id == unit.id and kept.meta["merges"] == 1
    finally:
        crew_memory.close()


def test_crewai_memory_api_on_forge_scopes_categories_privacy_duplicates(mem) -> None:
    llm = ScriptedLLM(model="scripted")
    storage = ForgeStorage(mem)
    cm = storage.crew_memory(llm=llm)
    try:
        given = {"categories": ["process"], "importance": 0.6}  # every field given: crewai asks its LLM nothing
        deploys = cm.remember("Deploys happen on Tuesdays after the standup.", scope="/ops", **given)
        cm.remember("The cafeteria closes at 3pm on Fridays.", scope="/office", categories=["facilities"], importance=0.6)
        cm.remember("Tuesdays the standup is at 10am.", scope="/ops/team", **given)
        cm.remember("Alice's deploy key lives in the vault.", scope="/ops", source="alice", private=True, **given)
        assert not llm.prompts

        assert sorted(cm.list_scopes("/")) == ["/office", "/ops"] and cm.list_scopes("/ops") == ["/ops/team"]
        assert cm.info("/ops").record_count == 3 and cm.list_categories() == {"process": 3, "facilities": 1}

        def recalled(query: str, **kw: Any) -> list[Any]:
            return cm.recall(query, depth="shallow", **kw)

        ops = recalled("when do deploys happen on tuesdays", scope="/ops")
        assert ops[0].record.content.startswith("Deploys happen on Tuesdays") and ops[0].record.id == deploys.id
        assert all(m.record.scope.startswith("/ops") for m in ops) and 0 < ops[0].score <= 1
        assert [m.record.content for m in recalled("cafeteria closes", categories=["facilities"])] == ["The cafeteria closes at 3pm on Fridays."]
        # crewai's privacy, on the fields FORGE kept: alice's record only for alice's source.
        assert not any("vault" in m.record.content for m in recalled("deploy key vault", scope="/ops"))
        assert any("vault" in m.record.content for m in recalled("deploy key vault", scope="/ops", source="alice"))

        # A repeat in the same crewai scope merges (the record comes back with the unit's id);
        # the same words in another scope are another memory.
        again = cm.remember("Deploys happen on Tuesdays after the standup.", scope="/ops", **given)
        assert again.id == deploys.id and storage.last_admissions[0].action == "noop"
        elsewhere = cm.remember("Deploys happen on Tuesdays after the standup.", scope="/office", **given)
        assert elsewhere.id != deploys.id and storage.last_admissions[0].action == "add"
        assert len(_crewai_units(mem)) == 5

        # forget archives (history stays in FORGE), and only under the scope asked.
        assert cm.forget(scope="/office") == 2
        assert cm.info("/office").record_count == 0 and cm.info("/ops").record_count == 3
        archived = _crewai_units(mem, status=["archived"])
        assert len(archived) == 2 and all(u.status is Status.ARCHIVED for u in archived)
        # Every crewai memory is a FORGE unit: the engine's own recall finds it, with reasons.
        hit = mem.recall("deploys tuesdays", viewer=Viewer.admin(), k=1)[0]
        assert hit.unit.id == deploys.id and hit.reasons
    finally:
        cm.close()


def test_search_names_the_fix_when_the_vector_is_not_the_storages(mem) -> None:
    storage = ForgeStorage(mem)
    with pytest.raises(ConfigError, match="embedder=storage.embedder"):
        storage.search([0.1] * 256)
    [vec] = storage.embedder(["worker stalls"])
    assert storage.search(vec) == []  # known text, empty store


def test_the_storage_over_the_service(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from forge.client import Client
    from forge.server.testing import running
    from server_support import make_setup

    setup = make_setup(tmp_path, mcp=False)  # crewai pins mcp<2; the service's /mcp needs 2.x and is not used here
    try:
        with running(setup.app) as url, Client(url, setup.alice) as client:
            storage = ForgeStorage(client)
            cm = storage.crew_memory(llm=ScriptedLLM(model="scripted"))
            try:
                first = cm.remember(STALL, scope="/ops", categories=["incidents"], importance=0.7)
                again = cm.remember(STALL, scope="/ops", categories=["incidents"], importance=0.7)
                assert again.id == first.id and storage.last_admissions[0].action == "noop"  # the service admitted
                [hit] = cm.recall("worker stalls queue", scope="/ops", depth="shallow", limit=3)
                assert hit.record.content == STALL and hit.record.categories == ["incidents"]
                assert cm.forget(record_ids=[first.id]) == 1 and cm.recall("worker stalls", depth="shallow") == []
            finally:
                cm.close()
        assert [u.content for u in setup.memory.list(viewer=Viewer.admin(), filter=Filter.make(status=["archived"]))] == [STALL]
    finally:
        setup.memory.close()


class TurnsLLM(BaseLLM):
    """An LLM on crewai's own base class that replies with whole ReAct turns, in order."""

    turns: list[str] = Field(default_factory=list)

    def call(self, messages: Any, tools: Any = None, callbacks: Any = None, available_functions: Any = None,
             from_task: Any = None, from_agent: Any = None, response_model: Any = None, **kw: Any) -> str:
        return self.turns.pop(0)

    def supports_function_calling(self) -> bool:
        return False

    def supports_stop_words(self) -> bool:
        return False

    def get_context_window_size(self) -> int:
        return 8192


RULE = ('{"rules": [{"when": "the worker is stuck and the queue is full", "avoid": "restarting the worker first", '
        '"prefer": "drain the queue before restarting the worker"}]}')


# crewai warns that a bound method's callback is not saved in its checkpoints: a recorder is
# one run's, and a restored run is not recorded (the module docstring says so)
@pytest.mark.filterwarnings("ignore:A method callback cannot be saved in a checkpoint:UserWarning")
def test_a_crews_run_is_recorded_and_reported(mem) -> None:
    from crewai.tools import tool

    @tool("queue_depth")
    def queue_depth(worker: str) -> str:
        """How many jobs wait in a worker's queue."""
        return "12000 jobs waiting"

    llm = TurnsLLM(model="scripted", turns=[
        'Thought: I should look at the queue.\nAction: queue_depth\nAction Input: {"worker": "w-7"}',
        "Thought: I know this now.\nFinal Answer: The queue is full; drain it before restarting.",
    ])
    rec = ForgeCrewTrace(kind="ops")
    ops = Agent(role="ops engineer", goal="keep the workers running", backstory="on call", llm=llm, tools=[queue_depth], max_iter=3,
                step_callback=rec.step_callback)
    task = Task(description="The worker is stuck; find out why.", expected_output="The cause.", agent=ops)
    out = Crew(agents=[ops], tasks=[task], task_callback=rec.task_callback, tracing=False).kickoff()

    trace = rec.trace()
    assert trace["task"] == "The worker is stuck; find out why." and trace["kind"] == "ops"
    [call] = [s for s in trace["steps"] if s["type"] == "tool"]
    assert (call["tool"], call["args"]) == ("queue_depth", {"worker": "w-7"})
    assert any(s["type"] == "observation" and "12000 jobs waiting" in s["content"] for s in trace["steps"])
    assert trace["answer"] == out.raw == "The queue is full; drain it before restarting."

    mem.llm = ForgeScriptedLLM([RULE])
    got = rec.report(mem, success=False, feedback="drain first", agent="ops-bot")
    asked = mem.llm.last_request.messages[-1].content
    assert "queue_depth" in asked and "The worker is stuck" in asked and "FAILED" in asked
    assert [u["rule"]["prefer"] for u in got["learned"] if u["kind"] == "rule"] == [["drain the queue before restarting the worker"]]
    rec.reset()
    assert rec.trace()["steps"] == []
