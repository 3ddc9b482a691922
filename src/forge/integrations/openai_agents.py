"""FORGE memory for the OpenAI Agents SDK: function tools, a session and learning run hooks, over a Memory or a Client.

    from agents import Agent, Runner
    from forge.integrations.openai_agents import ForgeRunHooks, ForgeSession, forge_function_tools
    agent = Agent(name="ops", instructions="...", tools=forge_function_tools(mem))
    hooks = ForgeRunHooks(kind="ops")
    result = Runner.run_sync(agent, "The worker is stuck", session=ForgeSession("chat-42", mem), hooks=hooks)
    hooks.report(mem, success=False, feedback="the restart did not help", agent="ops")   # learn from the run

- ``forge_function_tools(memory)``: ``recall_memory(query)`` (hybrid recall, 0-1 scores, the
  reasons) and ``remember(content, kind)`` (through admission: its answer says added /
  merged into X / updated X), for long-term memory the agent reads and writes itself.
- ``ForgeSession(session_id, memory)``: the SDK's conversation history kept as FORGE units
  (kind ``episode``, tagged ``session:<id>``, stored as given: a history keeps repeats), so a
  conversation is audited, exported and erasable like any memory.
- ``ForgeRunHooks()``: the SDK's ``RunHooks``, recording a run as a learning trace (the task,
  the model's replies, each local tool call with its arguments and its answer, the final
  output); ``report(memory, success=..., score=..., feedback=...)`` sends it with its outcome
  to FORGE's learning entry (``POST /v1/learn`` over a client, as a job; :meth:`forge.Memory.learn`
  over a memory, as ``agent``). The SDK tells the model only "An error occurred while running
  the tool." when a tool raises; give the tool ``failure_error_function=hooks.tool_failed`` and
  the trace keeps the exception (the model is told the same as before).

The Agents SDK sends traces to OpenAI unless told not to (``agents.set_tracing_disabled(True)``
or ``OPENAI_AGENTS_DISABLE_TRACING=1``); FORGE sends nothing.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from agents import (
    Agent,
    FunctionTool,
    ModelResponse,
    RunContextWrapper,
    RunHooks,
    Tool,
    function_tool,
)
from agents.memory import SessionABC
from agents.tool import default_tool_error_function
from agents.tool_context import ToolContext
from openai.types.responses import ResponseOutputMessage, ResponseOutputText

from forge.integrations._learn import Reporting, TraceRecorder
from forge.integrations._port import ForgeMemory
from forge.model import Context, Status, Unit, Viewer
from forge.store import Filter

__all__ = ["ForgeRunHooks", "ForgeSession", "forge_function_tools"]


def _remote(memory: ForgeMemory) -> bool:
    from forge.client import Client

    return isinstance(memory, Client)


def forge_function_tools(memory: ForgeMemory, *, viewer: Viewer | None = None, actor: str = "agents", k: int = 5,
                         min_score: float = 0.1) -> list[FunctionTool]:
    """``recall_memory`` and ``remember`` as the SDK's function tools (a blocking memory or client
    runs in a worker thread, off the agent's event loop)."""

    def recall(query: str) -> str:
        kw: dict[str, Any] = {"k": k, "min_score": min_score}
        if not _remote(memory):
            kw["viewer"] = viewer or Viewer.admin()
        hits = memory.recall(query, **kw)
        if not hits:
            return "No memory matches."
        return "\n".join(f"- [{r.unit.kind.value}] {r.unit.content} (score {r.score:.2f}; {'; '.join(r.reasons)})" for r in hits)

    def store(content: str, kind: str) -> str:
        unit = Unit(content, kind=kind)  # type: ignore[arg-type]
        if _remote(memory):
            d = memory.admit(unit)[0]
        else:
            from forge.curate.admission import admit

            d = admit(memory, unit, actor=actor)[0]
        return f"{d.summary} ({d.unit_id})"

    @function_tool
    async def recall_memory(query: str) -> str:
        """Search long-term memory for what is known about the query; the best memories, with why."""
        return await asyncio.to_thread(recall, query)

    @function_tool
    async def remember(content: str, kind: str = "fact") -> str:
        """Store something worth remembering (kind: fact, rule, preference, lesson); a duplicate merges."""
        return await asyncio.to_thread(store, content, kind)

    return [recall_memory, remember]


class ForgeSession(SessionABC):
    """An Agents SDK session whose items are FORGE units (see the module docstring)."""

    def __init__(self, session_id: str, memory: ForgeMemory, *, owner: str = "", scope: str = "global") -> None:
        self.session_id = session_id
        self.memory = memory
        self.owner = owner
        self.scope = scope
        self.tag = f"session:{session_id}"
        self.session_settings = None

    def _units(self) -> list[Unit]:
        f = Filter.make(tags_all=[self.tag], kinds=["episode"])
        out: list[Unit] = []
        while True:
            kw: dict[str, Any] = {"filter": f, "limit": 1000, "offset": len(out)}
            if not _remote(self.memory):
                kw["viewer"] = Viewer.admin() if not self.owner else Viewer.of(self.owner)
            page = self.memory.list(**kw)
            out += page
            if len(page) < 1000:
                return sorted(out, key=lambda u: (u.meta.get("session_seq", 0), u.created_at))

    def _get(self, limit: int | None) -> list[Any]:
        items = [json.loads(u.meta["item"]) for u in self._units()]
        return items[-limit:] if limit else items

    def _add(self, items: list[Any]) -> None:
        start = len(self._units())
        units = [Unit(_text(item), kind="episode", scope=self.scope, owner=self.owner,  # type: ignore[arg-type]
                      context=Context(tags=(self.tag,)), meta={"item": json.dumps(item, default=str), "session_seq": start + i})
                 for i, item in enumerate(items)]
        if units:
            if _remote(self.memory):
                self.memory.add(units, admit=False)
            else:
                self.memory.add(units, actor=self.owner or "agents-session")

    def _pop(self) -> Any:
        units = self._units()
        if not units:
            return None
        last = units[-1]
        self.memory.set_status(last.id, Status.ARCHIVED, reason=f"popped from session {self.session_id}")
        return json.loads(last.meta["item"])

    def _clear(self) -> None:
        for u in self._units():
            self.memory.set_status(u.id, Status.ARCHIVED, reason=f"session {self.session_id} cleared")

    async def get_items(self, limit: int | None = None) -> list[Any]:
        return await asyncio.to_thread(self._get, limit)

    async def add_items(self, items: list[Any]) -> None:
        await asyncio.to_thread(self._add, list(items))

    async def pop_item(self) -> Any:
        return await asyncio.to_thread(self._pop)

    async def clear_session(self) -> None:
        await asyncio.to_thread(self._clear)


def _text(item: Any) -> str:
    """What an item says, as the unit's content (what recall and the dashboard show)."""
    if isinstance(item, dict):
        content = item.get("content")
        if isinstance(content, str) and content.strip():
            return f"{item.get('role', item.get('type', 'item'))}: {content}"[:16_000]
        if isinstance(content, list):
            texts = [c.get("text", "") for c in content if isinstance(c, dict) and c.get("text")]
            if texts:
                return f"{item.get('role', 'item')}: {' '.join(texts)}"[:16_000]
        for key in ("output", "arguments", "name"):
            if isinstance(item.get(key), str) and item[key].strip():
                return f"{item.get('type', 'item')}: {item[key]}"[:16_000]
    return json.dumps(item, default=str)[:16_000] or "item"


# -- learning -------------------------------------------------------------------------------


def _said(item: Any) -> tuple[str, str]:
    """(role, text) of an input item that is a message; ("", "") for any other item."""
    if not isinstance(item, dict) or item.get("type", "message") != "message":
        return "", ""
    content = item.get("content")
    if isinstance(content, list):
        content = " ".join(c.get("text", "") for c in content if isinstance(c, dict) and c.get("text"))
    return str(item.get("role", "")), content if isinstance(content, str) else ""


class ForgeRunHooks(Reporting, RunHooks):
    """The Agents SDK's run hooks recording a run as a learning trace (see the module
    docstring); one hooks object is one run: ``reset()`` it, or make a new one, for the next."""

    def __init__(self, *, task: str = "", kind: str = "") -> None:
        self.recorder = TraceRecorder(task=task, kind=kind)
        self._failed: dict[str, str] = {}  # tool call id -> the exception, from tool_failed
        self._seen_input = False

    def reset(self, task: str = "") -> None:
        self.recorder.reset(task)
        self._failed.clear()
        self._seen_input = False

    def tool_failed(self, ctx: RunContextWrapper[Any], error: Exception) -> str:
        """A ``failure_error_function`` for function tools: keeps the exception for the trace,
        and tells the model what the SDK's default does."""
        if isinstance(ctx, ToolContext):
            self._failed[ctx.tool_call_id] = f"{type(error).__name__}: {error}"
        return default_tool_error_function(ctx, error)

    async def on_llm_start(self, context: RunContextWrapper[Any], agent: Agent[Any], system_prompt: str | None,
                           input_items: list[Any]) -> None:
        if self._seen_input:
            return
        self._seen_input = True  # the first call's input ends with this run's task (a session puts history before it)
        asked = [text for role, text in map(_said, input_items) if role == "user" and text.strip()]
        if asked:
            self.recorder.message("user", asked[-1])

    async def on_llm_end(self, context: RunContextWrapper[Any], agent: Agent[Any], response: ModelResponse) -> None:
        for item in response.output:
            if isinstance(item, ResponseOutputMessage):
                text = " ".join(c.text for c in item.content if isinstance(c, ResponseOutputText))
                self.recorder.message("assistant", text)

    async def on_tool_start(self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool) -> None:
        if isinstance(context, ToolContext):
            self.recorder.tool(context.tool_name, context.tool_arguments)
        else:
            self.recorder.tool(tool.name)

    async def on_tool_end(self, context: RunContextWrapper[Any], agent: Agent[Any], tool: Tool, result: Any) -> None:
        error = self._failed.pop(context.tool_call_id, "") if isinstance(context, ToolContext) else ""
        if not error and result == default_tool_error_function(context, RuntimeError()):
            error = str(result)  # the SDK's default failure message: the tool raised
        name = context.tool_name if isinstance(context, ToolContext) else tool.name
        self.recorder.observation(result if isinstance(result, str) else json.dumps(result, default=str), tool=name, error=error)

    async def on_agent_end(self, context: RunContextWrapper[Any], agent: Agent[Any], output: Any) -> None:
        self.recorder.finish(output if isinstance(output, str) else json.dumps(output, default=str))
