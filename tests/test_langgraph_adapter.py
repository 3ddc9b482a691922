"""forge.integrations.langgraph's learning node with the real LangGraph: a graph whose agent
step recalls from FORGE, calls a tool that fails and answers, then ends in ``learn_node``,
which reports the run's messages as a trace with the outcome a judge reads from the state: to
a Memory (reflecting with the scripted test LLM), and to the service through a Client and an
AsyncClient (a learning job, credited recall)."""

from __future__ import annotations

import asyncio
import operator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest

pytest.importorskip("langgraph")

from langchain_core.messages import AIMessage, AnyMessage, HumanMessage, ToolMessage  # noqa: E402
from langgraph.graph import END, START, StateGraph  # noqa: E402
from langgraph.graph.message import add_messages  # noqa: E402

from forge.engine.embed import HashingEmbedder  # noqa: E402
from forge.engine.memory import Memory  # noqa: E402
from forge.integrations.langgraph import learn_node  # noqa: E402
from forge.learn.trace import Outcome  # noqa: E402
from forge.llm.testing import ScriptedLLM  # noqa: E402
from forge.model import Unit, Viewer  # noqa: E402
from forge.store import SQLiteStore  # noqa: E402

RULE = ('{"rules": [{"when": "the disk is full and the cleanup tool is denied", "avoid": "running cleanup without sudo", '
        '"prefer": "rotate the logs first"}]}')


class State(TypedDict, total=False):
    messages: Annotated[list[AnyMessage], add_messages]
    recall_ids: Annotated[list[str], operator.add]
    resolved: bool
    learned: dict[str, Any]


def graph(memory: Any, recall: Any, **kw: Any) -> Any:
    """An agent step (recall, a failing tool call, an answer), then the learning node."""

    def act(state: State) -> State:
        rid = recall(state["messages"][0].content)
        return {"recall_ids": [rid] if rid else [], "resolved": False, "messages": [
            AIMessage("", tool_calls=[{"name": "cleanup", "args": {"path": "/var/log"}, "id": "t1"}]),
            ToolMessage("PermissionDenied: cleanup needs root", tool_call_id="t1", name="cleanup", status="error"),
            AIMessage("I could not free space: cleanup was denied."),
        ]}

    def judge(state: State) -> Outcome:
        return Outcome(success=state["resolved"], feedback="rotate the logs before cleanup")

    g = StateGraph(State)
    g.add_node("act", act)
    g.add_node("learn", learn_node(memory, outcome=judge, kind="disk-full", result_key="learned", **kw))
    g.add_edge(START, "act")
    g.add_edge("act", "learn")
    g.add_edge("learn", END)
    return g.compile()


def test_the_learning_node_reports_the_run_to_a_memory(tmp_path: Path) -> None:
    mem = Memory(SQLiteStore(tmp_path / "lg.db"), HashingEmbedder(128), llm=ScriptedLLM([RULE]))
    mem.add([Unit("When the disk is full, check the log directory first.", kind="rule")])
    bot = Viewer.of("ops-bot")
    out = graph(mem, lambda q: mem.context(q, viewer=bot).recall_id, agent="ops-bot").invoke(
        {"messages": [HumanMessage("The disk on the build host is full.")]})
    asked = mem.llm.last_request.messages[-1].content
    assert "The disk on the build host is full." in asked and "cleanup" in asked and "PermissionDenied" in asked and "FAILED" in asked
    learned = out["learned"]
    assert [u["rule"]["prefer"] for u in learned["learned"] if u["kind"] == "rule"] == [["rotate the logs first"]]
    assert len(learned["credited"]) == 1  # the rule the agent step's recall showed
    assert any(u["kind"] == "lesson" for u in learned["learned"])  # the judge's feedback
    mem.close()


def test_the_learning_node_over_the_service(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from forge.client import AsyncClient, Client
    from forge.server.testing import running
    from server_support import make_setup

    setup = make_setup(tmp_path, llm=ScriptedLLM([RULE, RULE], repeat_last=True))
    setup.memory.add([Unit("When the disk is full, check the log directory first.", kind="rule")])
    with running(setup.app) as url:
        with Client(url, setup.alice) as client:
            out = graph(client, lambda q: client.context(q).recall_id, wait=True).invoke(
                {"messages": [HumanMessage("The disk on the build host is full.")]})
        job = out["learned"]
        assert job["status"] == "done", job
        assert any(u["kind"] == "rule" for u in job["result"]["learned"]) and len(job["result"]["credited"]) == 1

        async def main() -> dict[str, Any]:
            async with AsyncClient(url, setup.alice) as aclient:
                return await graph(aclient, lambda q: "").ainvoke({"messages": [HumanMessage("The disk on the CI host is full.")]})

        queued = asyncio.run(main())["learned"]
        assert queued["status"] in ("queued", "running", "done") and queued["job_id"]
        with Client(url, setup.alice) as client:
            assert client.job(queued["job_id"])["job_id"] == queued["job_id"]
    setup.memory.close()
