"""forge.integrations.openai_agents with the real OpenAI Agents SDK: a minimal Agent run by the
SDK's Runner on a scripted Model (no network: tracing off), calling remember then
recall_memory, with its conversation kept in a ForgeSession across two runs; and ForgeRunHooks
recording a run whose tool fails as a learning trace, reported with its outcome to a Memory
reflecting with the scripted test LLM, and to the service through a Client."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, Model, ModelResponse, Runner, Usage, function_tool, set_tracing_disabled  # noqa: E402
from openai.types.responses import (  # noqa: E402
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)

from forge.engine.embed import HashingEmbedder  # noqa: E402
from forge.engine.memory import Memory  # noqa: E402
from forge.integrations.openai_agents import ForgeRunHooks, ForgeSession, forge_function_tools  # noqa: E402
from forge.llm.testing import ScriptedLLM  # noqa: E402
from forge.model import Unit, Viewer  # noqa: E402
from forge.store import Filter, SQLiteStore  # noqa: E402

set_tracing_disabled(True)  # the SDK would send traces to OpenAI


class Scripted(Model):
    """A model that answers from a script and keeps what it was given."""

    def __init__(self, replies: list[Any]) -> None:
        self.replies = list(replies)
        self.inputs: list[Any] = []

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs, tracing, **kw) -> ModelResponse:
        self.inputs.append(input)
        return ModelResponse(output=[self.replies.pop(0)], usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kw: Any):  # not used here
        raise NotImplementedError


def call(name: str, args: dict[str, Any], cid: str) -> ResponseFunctionToolCall:
    return ResponseFunctionToolCall(type="function_call", name=name, arguments=json.dumps(args), call_id=cid, id=f"fc_{cid}")


def say(text: str) -> ResponseOutputMessage:
    return ResponseOutputMessage(type="message", id="msg_1", role="assistant", status="completed",
                                 content=[ResponseOutputText(type="output_text", text=text, annotations=[])])


@pytest.fixture
def mem(tmp_path: Path):
    m = Memory(SQLiteStore(tmp_path / "oa.db"), HashingEmbedder(128))
    m.add([Unit("Restart the worker before clearing the cache.", kind="rule")])
    yield m
    m.close()


def _tool_outputs(model: Scripted) -> dict[str, str]:
    out = {}
    for given in model.inputs:
        for item in given if isinstance(given, list) else []:
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                out[item["call_id"]] = item["output"]
    return out


def test_an_agent_remembers_and_recalls_through_its_tools_and_session(mem) -> None:
    model = Scripted([
        call("remember", {"content": "The worker stalls when the queue exceeds 10k jobs.", "kind": "fact"}, "c1"),
        call("recall_memory", {"query": "worker stalls restart"}, "c2"),
        say("Restart the worker; it stalls past 10k jobs."),
        call("remember", {"content": "The worker stalls when the queue exceeds 10k jobs.", "kind": "fact"}, "c3"),
        say("Already known."),
    ])
    agent = Agent(name="ops", instructions="Use your memory.", tools=forge_function_tools(mem), model=model)
    session = ForgeSession("chat-42", mem)
    first = asyncio.run(Runner.run(agent, "The worker is stuck; what do we know?", session=session))  # run_sync leaves its loop open
    assert first.final_output == "Restart the worker; it stalls past 10k jobs."
    outputs = _tool_outputs(model)
    assert outputs["c1"] == f"added ({outputs['c1'].split('(')[1]}"  # "added (<id>)"
    assert "Restart the worker before clearing the cache." in outputs["c2"] and "score" in outputs["c2"]

    second = asyncio.run(Runner.run(agent, "Remember the stall threshold.", session=session))
    assert second.final_output == "Already known."
    assert _tool_outputs(model)["c3"].startswith("merged into")  # admission: one unit for one fact
    facts = mem.list(viewer=Viewer.admin(), filter=Filter.make(kinds=["fact"]))
    assert [u.content for u in facts] == ["The worker stalls when the queue exceeds 10k jobs."]

    # The second run saw the first run's conversation, read back from FORGE units.
    history = [i for i in model.inputs[3] if isinstance(i, dict)]
    assert any("The worker is stuck" in json.dumps(i) for i in history)
    items = session._get(None)
    assert items[0]["content"] == "The worker is stuck; what do we know?" and len(items) >= 6
    episodes = mem.list(viewer=Viewer.admin(), filter=Filter.make(kinds=["episode"], tags_all=["session:chat-42"]))
    assert len(episodes) == len(items)
    assert asyncio.run(session.pop_item()) == items[-1] and len(session._get(None)) == len(items) - 1
    asyncio.run(session.clear_session())
    assert session._get(None) == []


RULE = ('{"rules": [{"when": "the worker is stuck and the cache is locked", "avoid": "clearing the cache first", '
        '"prefer": "restart the worker before clearing the cache"}]}')


def _failing_run(hooks: ForgeRunHooks, mem: Any) -> Any:
    @function_tool(failure_error_function=hooks.tool_failed)
    def clear_cache(worker: str) -> str:
        """Clear a worker's cache."""
        raise RuntimeError("CacheLocked: the worker holds the cache")

    @function_tool
    def restart(worker: str) -> str:
        """Restart a worker."""
        raise RuntimeError("hidden from the model")  # the SDK's default failure message only

    model = Scripted([
        call("recall_memory", {"query": "worker stuck"}, "c1"),
        call("clear_cache", {"worker": "w-7"}, "c2"),
        call("restart", {"worker": "w-7"}, "c3"),
        say("The cache is locked and the restart failed."),
    ])
    agent = Agent(name="ops", instructions="Use your memory.", tools=[*forge_function_tools(mem), clear_cache, restart], model=model)
    return asyncio.run(Runner.run(agent, "The worker is stuck; fix it.", hooks=hooks))


def test_run_hooks_record_a_failing_run_and_report_it(mem) -> None:
    hooks = ForgeRunHooks(kind="ops")
    result = _failing_run(hooks, mem)
    trace = hooks.trace()
    assert trace["task"] == "The worker is stuck; fix it." and trace["kind"] == "ops"
    tools = [s for s in trace["steps"] if s["type"] == "tool"]
    assert [(s["tool"], s["args"]) for s in tools] == [("recall_memory", {"query": "worker stuck"}), ("clear_cache", {"worker": "w-7"}),
                                                       ("restart", {"worker": "w-7"})]
    assert not tools[0]["error"] and tools[1]["error"] == "RuntimeError: CacheLocked: the worker holds the cache"
    assert tools[2]["error"] == "An error occurred while running the tool."  # no failure function: the SDK's default
    assert any(s["type"] == "observation" and "Restart the worker" in s["content"] for s in trace["steps"])
    assert trace["answer"] == result.final_output == "The cache is locked and the restart failed."

    mem.llm = ScriptedLLM([RULE])
    ctx = mem.context("worker stuck", viewer=Viewer.of("ops-bot"))
    hooks.recalled(ctx.recall_id)
    got = hooks.report(mem, success=False, agent="ops-bot")
    asked = mem.llm.last_request.messages[-1].content
    assert "clear_cache" in asked and "CacheLocked" in asked and "FAILED" in asked
    assert [u["rule"]["prefer"] for u in got["learned"] if u["kind"] == "rule"] == [["restart the worker before clearing the cache"]]
    assert set(got["credited"]) == {u.id for u in ctx.units}
    hooks.reset()
    assert hooks.trace()["steps"] == []


def test_run_hooks_report_to_the_service(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from forge.client import Client
    from forge.server.testing import running
    from server_support import make_setup

    setup = make_setup(tmp_path, llm=ScriptedLLM([RULE], repeat_last=True))
    with running(setup.app) as url, Client(url, setup.alice) as client:
        client.add(Unit("Restart the worker before clearing the cache.", kind="rule"))
        hooks = ForgeRunHooks(kind="ops")
        hooks.recalled(client.context("worker stuck").recall_id)
        _failing_run(hooks, client)
        job = hooks.report(client, success=False, feedback="restart first", wait=True)
        assert job["status"] == "done", job
        assert any(u["kind"] == "rule" for u in job["result"]["learned"]) and job["result"]["credited"]
    setup.memory.close()
