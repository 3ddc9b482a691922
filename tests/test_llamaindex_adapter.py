"""forge.integrations.llamaindex with the real llama-index-core and its own MockLLM (which
answers with the prompt it was given, so what FORGE recalled is seen in the answer): the
retriever inside a RetrieverQueryEngine, over a Memory, a Client and an AsyncClient; and
ForgeMemoryBlock inside LlamaIndex's Memory under a SimpleChatEngine, where turns flushed out
of the chat history go to FORGE through admission and come back into a later prompt; and
ForgeAgentTrace recording a FunctionAgent's run (on LlamaIndex's MockFunctionCallingLLM, with
a tool that fails) as a learning trace, reported with its outcome to a Memory reflecting with
the scripted test LLM, and to the service through an AsyncClient."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytest.importorskip("llama_index.core")

from llama_index.core.base.llms.types import ChatMessage  # noqa: E402
from llama_index.core.chat_engine import SimpleChatEngine  # noqa: E402
from llama_index.core.llms import MockLLM  # noqa: E402
from llama_index.core.memory import Memory as ChatMemory  # noqa: E402
from llama_index.core.query_engine import RetrieverQueryEngine  # noqa: E402
from llama_index.core.schema import NodeWithScore  # noqa: E402
from sqlalchemy.ext.asyncio import create_async_engine  # noqa: E402
from sqlalchemy.pool import NullPool  # noqa: E402

from forge.engine.embed import HashingEmbedder  # noqa: E402
from forge.engine.memory import Memory  # noqa: E402
from forge.integrations.llamaindex import ForgeAgentTrace, ForgeMemoryBlock, ForgeRetriever  # noqa: E402
from forge.llm.testing import ScriptedLLM  # noqa: E402
from forge.model import Unit, Viewer  # noqa: E402
from forge.store import Filter, SQLiteStore  # noqa: E402

STALL = "The worker stalls when the queue exceeds 10k jobs."
FACTS = ["Restart the worker before clearing the cache.", STALL,
         *(f"Inventory note {i}: shelf {i} holds crate {i}." for i in range(10))]


def conversation() -> list[ChatMessage]:
    """30 words: over a history of 15, the first turn is flushed to the memory blocks."""
    return [
        ChatMessage(role="user", content="My name is Ann and I run the night shift."),
        ChatMessage(role="assistant", content="Noted, Ann runs the night shift."),
        ChatMessage(role="user", content="The printer on floor two jams every Monday."),
        ChatMessage(role="assistant", content="Thanks, I will remember the printer."),
    ]


def words(text: str) -> list[str]:  # a tokenizer for the chat memory's budget (no tiktoken files)
    return text.split()


@pytest.fixture
def mem(tmp_path: Path):
    m = Memory(SQLiteStore(tmp_path / "li.db"), HashingEmbedder(128))
    m.add([Unit(f, kind="rule" if f.startswith("Restart") else "fact") for f in FACTS])
    yield m
    m.close()


def test_the_retriever_inside_a_query_engine(mem) -> None:
    nodes = ForgeRetriever(mem, k=3).retrieve("why does the worker stall")
    assert isinstance(nodes[0], NodeWithScore) and nodes[0].node.get_content() == STALL
    meta = nodes[0].node.metadata
    assert {"id", "kind", "score", "reasons"} <= set(meta) and 0 < nodes[0].score <= 1 and meta["reasons"]
    assert nodes[0].node.node_id == meta["id"] and meta["kind"] == "fact"
    assert all(n.score >= 0.5 for n in ForgeRetriever(mem, k=10, min_score=0.5).retrieve("worker stall"))
    rules = ForgeRetriever(mem, k=5, filter=Filter.make(kinds=["rule"])).retrieve("worker")
    assert [n.node.get_content() for n in rules] == ["Restart the worker before clearing the cache."]
    assert asyncio.run(ForgeRetriever(mem, k=3).aretrieve("why does the worker stall"))[0].node.get_content() == STALL

    engine = RetrieverQueryEngine.from_args(ForgeRetriever(mem, k=2), llm=MockLLM())
    answer = engine.query("Why does the worker stall?")
    assert STALL in str(answer)  # the recalled unit reached the LLM's prompt
    assert "Inventory note" not in str(answer)  # k=2: only the two best
    assert "vector #" not in str(answer) and "kind: fact" in str(answer)  # reasons kept out of the prompt, the kind in
    assert answer.source_nodes[0].node.node_id == nodes[0].node.node_id


def test_the_retriever_over_the_service(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from forge.client import AsyncClient, Client
    from forge.server.testing import running
    from server_support import make_setup

    setup = make_setup(tmp_path)
    setup.memory.add([Unit(f) for f in FACTS])
    try:
        with running(setup.app) as url:
            with Client(url, setup.alice) as client:
                nodes = ForgeRetriever(client, k=2).retrieve("worker stall queue")
                assert nodes[0].node.get_content() == STALL and len(nodes) == 2

            async def main() -> list[NodeWithScore]:
                async with AsyncClient(url, setup.alice) as aclient:
                    return await ForgeRetriever(aclient, k=2).aretrieve("worker stall queue")

            assert asyncio.run(main())[0].node.get_content() == STALL
    finally:
        setup.memory.close()


def _chat_memory(session: str, block: ForgeMemoryBlock, db: Path) -> ChatMemory:
    # The chat history in an SQLite file whose every use opens and closes its connection
    # (the default in-memory store keeps one open until it is garbage, a ResourceWarning).
    engine = create_async_engine(f"sqlite+aiosqlite:///{db}", poolclass=NullPool)
    return ChatMemory.from_defaults(session_id=session, token_limit=30, chat_history_token_ratio=0.5, token_flush_size=5,
                                    memory_blocks=[block], tokenizer_fn=words, async_engine=engine)


def _mine(mem: Memory) -> list[Unit]:
    return mem.list(viewer=Viewer.admin(), filter=Filter.make(tags_all=["llamaindex"]))


def test_the_memory_block_flushes_turns_through_admission_and_recalls_them(mem, tmp_path: Path) -> None:
    block = ForgeMemoryBlock(memory=mem, k=3)
    chat = _chat_memory("chat-42", block, tmp_path / "chat.db")
    chat.put_messages(conversation())
    # The first turn left the history for the block: two episodes in FORGE, tagged with the session.
    stored = {u.content: u for u in _mine(mem)}
    assert set(stored) == {"user: My name is Ann and I run the night shift.", "assistant: Noted, Ann runs the night shift."}
    assert all(u.kind.value == "episode" and "session:chat-42" in u.context.tags for u in stored.values())
    assert [d.action for d in block.last_admissions] == ["add", "add"]

    # A chat engine over that memory: the question is answered with FORGE's recall in the prompt.
    engine = SimpleChatEngine.from_defaults(llm=MockLLM(), memory=chat)
    answer = engine.chat("Who runs the night shift?")
    assert "My name is Ann and I run the night shift." in answer.response  # MockLLM answers with its prompt

    # The same conversation in another session: the flushed turns merge, nothing is stored twice.
    before = len(_mine(mem))  # the chat flushed the second turn too
    again = ForgeMemoryBlock(memory=mem, k=3)
    _chat_memory("chat-43", again, tmp_path / "chat.db").put_messages(conversation())
    assert [d.action for d in again.last_admissions] == ["noop", "noop"]
    assert {d.unit_id for d in again.last_admissions} == {u.id for u in stored.values()}
    assert len(_mine(mem)) == before


def test_the_memory_block_reads_as_its_viewer(mem) -> None:
    mem.add([Unit("Alice's locker code is 4321.", scope="private", owner="alice")])
    question = [ChatMessage(role="user", content="What is the locker code?")]

    def recalled(viewer: Viewer) -> str:
        return asyncio.run(ForgeMemoryBlock(memory=mem, viewer=viewer).aget(question))

    assert "4321" in recalled(Viewer.of("alice")) and "4321" not in recalled(Viewer.of("bob"))
    assert asyncio.run(ForgeMemoryBlock(memory=mem).aget([])) == ""


def test_the_memory_block_can_extract_facts_with_the_memorys_llm(tmp_path: Path) -> None:
    reply = json.dumps({"memories": [
        {"kind": "fact", "content": "Ann runs the night shift.", "why": "who is on nights", "turns": [1, 2]},
    ]})
    with Memory(SQLiteStore(tmp_path / "x.db"), HashingEmbedder(128), llm=ScriptedLLM([reply], capabilities=["json_schema"])) as m:
        block = ForgeMemoryBlock(memory=m, extract=True)
        _chat_memory("chat-7", block, tmp_path / "chat.db").put_messages(conversation())
        [decision] = block.last_admissions
        assert decision.action == "add"
        [fact] = m.list(viewer=Viewer.admin(), filter=Filter.make(kinds=["fact"]))
        assert fact.content == "Ann runs the night shift." and fact.meta["extracted"]["turns"] == [1, 2]


RULE = ('{"rules": [{"when": "the worker is stuck and the cache is locked", "avoid": "clearing the cache first", '
        '"prefer": "restart the worker before clearing the cache"}]}')


# llama-index's workflows list an agent's steps with inspect.getmembers, which reads every
# attribute of the (pydantic) agent, pydantic's deprecated ones too: llama-index's warnings
AGENT_WARNINGS = pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecationWarning")


def _agent_run(rec: ForgeAgentTrace) -> str:
    """A FunctionAgent that calls a failing tool, then answers; its run recorded by ``rec``."""
    from llama_index.core.agent.workflow import FunctionAgent
    from llama_index.core.base.llms.types import ToolCallBlock
    from llama_index.core.llms import MockFunctionCallingLLM
    from llama_index.core.tools import FunctionTool

    def clear_cache(worker: str) -> str:
        """Clear a worker's cache."""
        raise RuntimeError("CacheLocked: the worker holds the cache")

    def script(messages: list[ChatMessage], **kw: object) -> ChatMessage:
        if any(m.role.value == "tool" for m in messages):
            return ChatMessage(role="assistant", content="The cache is locked; restart the worker first.")
        return ChatMessage(role="assistant", blocks=[ToolCallBlock(tool_call_id="t1", tool_name="clear_cache", tool_kwargs={"worker": "w-7"})])

    agent = FunctionAgent(tools=[FunctionTool.from_defaults(clear_cache)], llm=MockFunctionCallingLLM(response_generator=script))

    async def main() -> str:
        return str(await rec.watch(agent.run(user_msg="The worker is stuck; fix it.")))

    return asyncio.run(main())


@AGENT_WARNINGS
def test_an_agents_run_is_recorded_and_reported(mem) -> None:
    rec = ForgeAgentTrace(kind="ops")
    answer = _agent_run(rec)
    trace = rec.trace()
    assert trace["task"] == "The worker is stuck; fix it." and trace["kind"] == "ops"
    [tool] = [s for s in trace["steps"] if s["type"] == "tool"]
    assert (tool["tool"], tool["args"]) == ("clear_cache", {"worker": "w-7"})
    assert tool["error"] == "RuntimeError: CacheLocked: the worker holds the cache"
    assert trace["answer"] == answer == "The cache is locked; restart the worker first."

    mem.llm = ScriptedLLM([RULE])
    ctx = mem.context("worker stuck", viewer=Viewer.of("ops-bot"))
    rec.recalled(ctx.recall_id)
    got = rec.report(mem, success=False, agent="ops-bot")
    asked = mem.llm.last_request.messages[-1].content
    assert "clear_cache" in asked and "CacheLocked" in asked and "FAILED" in asked
    assert [u["rule"]["prefer"] for u in got["learned"] if u["kind"] == "rule"] == [["restart the worker before clearing the cache"]]
    assert set(got["credited"]) == {u.id for u in ctx.units}
    rec.reset()
    assert rec.trace()["steps"] == []


@AGENT_WARNINGS
def test_an_agents_run_is_reported_to_the_service(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from forge.client import AsyncClient
    from forge.server.testing import running
    from server_support import make_setup

    setup = make_setup(tmp_path, llm=ScriptedLLM([RULE], repeat_last=True))
    rec = ForgeAgentTrace(kind="ops")
    _agent_run(rec)
    with running(setup.app) as url:
        async def main() -> dict:
            async with AsyncClient(url, setup.alice) as client:
                return await rec.areport(client, success=False, feedback="restart first", wait=True)

        job = asyncio.run(main())
    assert job["status"] == "done", job
    assert [u["rule"]["prefer"] for u in job["result"]["learned"] if u["kind"] == "rule"] == [["restart the worker before clearing the cache"]]
    setup.memory.close()
