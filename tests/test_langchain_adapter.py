"""forge.integrations.langchain with the real langchain-core: the retriever over a Memory, a
Client and an AsyncClient, and the tools inside a minimal LangGraph ReAct agent whose chat
model is LangChain's own fake (it calls remember, then recall_memory, then answers); and the
learning callback recording such a run (its tool calls, a tool's error, the answer) and
reporting it with its outcome, to a Memory reflecting with the scripted test LLM."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("langchain_core")

from langchain_core.documents import Document  # noqa: E402
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel  # noqa: E402
from langchain_core.messages import AIMessage, ToolMessage  # noqa: E402

from forge.engine.embed import HashingEmbedder  # noqa: E402
from forge.engine.memory import Memory  # noqa: E402
from forge.integrations.langchain import ForgeRetriever, ForgeTraceHandler, forge_tools  # noqa: E402
from forge.llm.testing import ScriptedLLM  # noqa: E402
from forge.model import Unit, Viewer  # noqa: E402
from forge.store import SQLiteStore  # noqa: E402

FACTS = ["Restart the worker before clearing the cache.", "The worker stalls when the queue exceeds 10k jobs.",
         *(f"Inventory note {i}: shelf {i} holds crate {i}." for i in range(10))]


@pytest.fixture
def mem(tmp_path: Path):
    m = Memory(SQLiteStore(tmp_path / "lc.db"), HashingEmbedder(128))
    m.add([Unit(f, kind="rule" if f.startswith("Restart") else "fact") for f in FACTS])
    yield m
    m.close()


def test_retriever_over_a_memory(mem) -> None:
    r = ForgeRetriever(memory=mem, k=3)
    docs = r.invoke("why does the worker stall")
    assert isinstance(docs[0], Document) and "worker" in docs[0].page_content
    meta = docs[0].metadata
    assert {"id", "kind", "score", "reasons"} <= set(meta) and 0 < meta["score"] <= 1 and meta["reasons"]
    assert all(d.metadata["score"] >= 0.5 for d in ForgeRetriever(memory=mem, k=10, min_score=0.5).invoke("worker stall"))
    assert ForgeRetriever(memory=mem, viewer=Viewer.of("bob"), k=3).invoke("worker")  # global units: visible to bob
    assert asyncio.run(r.ainvoke("worker stall"))[0].page_content == docs[0].page_content


def test_retriever_over_the_service(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from forge.client import AsyncClient, Client
    from forge.server.testing import running
    from server_support import make_setup

    setup = make_setup(tmp_path)
    setup.memory.add([Unit(f) for f in FACTS])
    with running(setup.app) as url:
        with Client(url, setup.alice) as client:
            docs = ForgeRetriever(memory=client, k=2).invoke("worker stall queue")
            assert "stalls" in docs[0].page_content and len(docs) == 2

        async def main() -> list[Document]:
            async with AsyncClient(url, setup.alice) as aclient:
                return await ForgeRetriever(memory=aclient, k=2).ainvoke("worker stall queue")

        assert "stalls" in asyncio.run(main())[0].page_content
    setup.memory.close()


class _ToolCaller(GenericFakeChatModel):
    """LangChain's scripted chat model, accepting tools as a tool-calling model does."""

    def bind_tools(self, tools: Any, **kw: Any) -> _ToolCaller:
        return self


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")  # its successor is in `langchain`, not installed here
def test_the_tools_inside_a_react_agent(mem) -> None:
    from langgraph.prebuilt import create_react_agent

    model = _ToolCaller(messages=iter([
        AIMessage("", tool_calls=[{"name": "remember", "args": {"content": "The worker stalls when the queue exceeds 10k jobs."}, "id": "c1"}]),
        AIMessage("", tool_calls=[{"name": "recall_memory", "args": {"query": "worker stalls queue"}, "id": "c2"}]),
        AIMessage("Restart the worker first; it stalls past 10k jobs."),
    ]))
    agent = create_react_agent(model, forge_tools(mem, k=3))
    out = agent.invoke({"messages": [("user", "The worker is stuck, what do we know?")]})
    tools = {m.tool_call_id: m.content for m in out["messages"] if isinstance(m, ToolMessage)}
    assert tools["c1"].startswith("merged into")  # admission: it was already known, one unit
    assert "stalls when the queue exceeds 10k" in tools["c2"] and "score" in tools["c2"]
    assert out["messages"][-1].content.startswith("Restart the worker")
    assert mem.count(viewer=Viewer.admin()) == len(FACTS)


RULE = ('{"rules": [{"when": "the worker is stuck and the cache tool fails", "avoid": "clearing the cache first", '
        '"prefer": "restart the worker before clearing the cache"}]}')


@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")
def test_the_trace_handler_records_a_run_and_reports_its_outcome(mem) -> None:
    from langchain_core.tools import ToolException, tool
    from langgraph.prebuilt import create_react_agent

    @tool
    def clear_cache(worker: str) -> str:
        """Clear a worker's cache."""
        raise ToolException("CacheLocked: the worker holds the cache")

    model = _ToolCaller(messages=iter([
        AIMessage("", tool_calls=[{"name": "recall_memory", "args": {"query": "worker stuck"}, "id": "c1"}]),
        AIMessage("", tool_calls=[{"name": "clear_cache", "args": {"worker": "w-7"}, "id": "c2"}]),
        AIMessage("The cache is locked; restart the worker first."),
    ]))
    clear_cache.handle_tool_error = True  # the agent sees the error as the tool's answer
    agent = create_react_agent(model, [*forge_tools(mem, k=3), clear_cache])
    handler = ForgeTraceHandler(kind="ops")
    agent.invoke({"messages": [("user", "The worker is stuck, fix it.")]}, config={"callbacks": [handler]})

    trace = handler.trace()
    assert trace["task"] == "The worker is stuck, fix it." and trace["kind"] == "ops"
    tools = [s for s in trace["steps"] if s["type"] == "tool"]
    assert [(s["tool"], s["args"]) for s in tools] == [("recall_memory", {"query": "worker stuck"}), ("clear_cache", {"worker": "w-7"})]
    assert "CacheLocked" in tools[1]["error"] and not tools[0]["error"]
    assert any(s["type"] == "observation" and "Restart the worker" in s["content"] for s in trace["steps"])
    assert trace["answer"] == "The cache is locked; restart the worker first."

    mem.llm = ScriptedLLM([RULE])
    ctx = mem.context("worker stuck", viewer=Viewer.of("ops-bot"))
    handler.recalled(ctx.recall_id)
    got = handler.report(mem, success=False, feedback="restart first", agent="ops-bot")
    asked = mem.llm.last_request.messages[-1].content
    assert "clear_cache" in asked and "CacheLocked" in asked and "FAILED" in asked  # the run reached reflection
    [rule] = [u for u in got["learned"] if u["kind"] == "rule"]
    assert rule["rule"]["prefer"] == ["restart the worker before clearing the cache"]
    assert set(got["credited"]) == {u.id for u in ctx.units} and ctx.units
    assert mem.get(rule["id"], viewer=Viewer.of("ops-bot")).owner == "ops-bot"

    handler.reset()
    assert handler.trace()["steps"] == [] and handler.trace()["recall_ids"] == []
