"""FORGE memory for LangChain: a retriever, tools and a learning callback, over a Memory, a Client or an AsyncClient.

    from forge.integrations.langchain import ForgeRetriever, ForgeTraceHandler, forge_tools
    retriever = ForgeRetriever(memory=Memory.open("team.db"), viewer=Viewer.of("planner"), k=5, min_score=0.1)
    docs = retriever.invoke("why does the worker stall?")      # Documents, with score and reasons in metadata
    tools = forge_tools(Client(url, key))                       # recall_memory, remember: for any tool-calling agent

    handler = ForgeTraceHandler(kind="ops")                     # records a run: messages, tool calls, the answer
    agent.invoke({"messages": [...]}, config={"callbacks": [handler]})
    handler.report(Client(url, key), success=False, feedback="the restart did not help")   # learn from it

A retrieved ``Document`` is a unit: ``page_content`` its content, ``metadata`` its id, kind,
scope, score (0-1) and the reasons it was recalled. ``remember`` goes through admission, and
its answer says what was done (added / merged into X / updated X). Over a client, the key
is the viewer; over a memory, ``viewer`` (default: the operator's).

``ForgeTraceHandler`` is a LangChain callback handler (for any runnable: a chain, an agent, a
LangGraph graph) that records what the run did as a learning trace: the user's messages,
the model's replies, each tool call with its arguments and what it returned or the error it
raised, and the final answer. ``report(memory, success=..., score=..., feedback=...)`` sends
it with its outcome to FORGE's learning entry (``POST /v1/learn`` over a client, as a job;
:meth:`forge.Memory.learn` over a memory, as ``agent``), which credits the recalls named with
``recalled(recall_id)`` and reflects on the trace; ``areport`` is the same for async code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any
from uuid import UUID

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    BaseCallbackHandler,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, LLMResult
from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import ConfigDict

from forge.integrations._learn import Reporting, TraceRecorder
from forge.integrations._port import ForgeMemory
from forge.model import Unit, Viewer
from forge.store import Filter

__all__ = ["ForgeRetriever", "ForgeTraceHandler", "forge_tools", "record_messages"]


def _is_async(memory: ForgeMemory) -> bool:
    from forge.client import AsyncClient

    return isinstance(memory, AsyncClient)


def _is_remote(memory: ForgeMemory) -> bool:
    from forge.client import AsyncClient, Client

    return isinstance(memory, Client | AsyncClient)


def _document(r: Any) -> Document:
    u = r.unit
    return Document(page_content=u.content, id=u.id, metadata={
        "id": u.id, "kind": u.kind.value, "scope": str(u.scope), "owner": u.owner, "score": round(float(r.score), 6),
        "reasons": list(r.reasons), "source": u.provenance.source,
    })


class ForgeRetriever(BaseRetriever):
    """FORGE's hybrid recall as a LangChain retriever (sync and async)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    memory: ForgeMemory
    viewer: Viewer | None = None
    k: int = 5
    min_score: float = 0.0
    filter: Filter = Filter()

    def _recall_kw(self) -> dict[str, Any]:
        kw: dict[str, Any] = {"k": self.k, "filter": self.filter, "min_score": self.min_score}
        if not _is_remote(self.memory):
            kw["viewer"] = self.viewer or Viewer.admin()
        elif self.viewer is not None:
            kw["viewer"] = self.viewer  # checked against the key
        return kw

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        if _is_async(self.memory):
            raise TypeError("this retriever is over an AsyncClient: use ainvoke / aget_relevant_documents")
        return [_document(r) for r in self.memory.recall(query, **self._recall_kw())]

    async def _aget_relevant_documents(self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun) -> list[Document]:
        if _is_async(self.memory):
            return [_document(r) for r in await self.memory.recall(query, **self._recall_kw())]
        return await asyncio.to_thread(lambda: [_document(r) for r in self.memory.recall(query, **self._recall_kw())])


def forge_tools(memory: ForgeMemory, *, viewer: Viewer | None = None, actor: str = "langchain", k: int = 5,
                min_score: float = 0.1) -> list[BaseTool]:
    """Two tools for a tool-calling agent: ``recall_memory(query)`` and ``remember(content, kind)``."""
    retriever = ForgeRetriever(memory=memory, viewer=viewer, k=k, min_score=min_score)

    def shown(docs: list[Document]) -> str:
        if not docs:
            return "No memory matches."
        return "\n".join(f"- [{d.metadata['kind']}] {d.page_content} (score {d.metadata['score']:.2f}; id {d.metadata['id']})" for d in docs)

    def recall_memory(query: str) -> str:
        """Search long-term memory for what is known about the query; returns the best memories."""
        return shown(retriever.invoke(query))

    async def arecall_memory(query: str) -> str:
        return shown(await retriever.ainvoke(query))

    def said(decision: Any) -> str:
        return f"{decision.summary} ({decision.unit_id})"

    def remember(content: str, kind: str = "fact") -> str:
        """Store something worth remembering (kind: fact, rule, preference, lesson). Duplicates merge."""
        unit = Unit(content, kind=kind)  # type: ignore[arg-type]
        if _is_remote(memory):
            return said(memory.admit(unit)[0])
        from forge.curate.admission import admit

        return said(admit(memory, unit, actor=actor)[0])

    async def aremember(content: str, kind: str = "fact") -> str:
        if _is_async(memory):
            return said((await memory.admit(Unit(content, kind=kind)))[0])  # type: ignore[arg-type]
        return await asyncio.to_thread(remember, content, kind)

    return [
        StructuredTool.from_function(func=None if _is_async(memory) else recall_memory, coroutine=arecall_memory, name="recall_memory",
                                     description=recall_memory.__doc__ or ""),
        StructuredTool.from_function(func=None if _is_async(memory) else remember, coroutine=aremember, name="remember",
                                     description=remember.__doc__ or ""),
    ]


# -- learning -------------------------------------------------------------------------------


def record_messages(recorder: TraceRecorder, messages: Sequence[BaseMessage]) -> TraceRecorder:
    """Add a conversation's messages to ``recorder`` as trace steps: a human's message (the
    first is the task), the model's replies and tool calls (with their arguments), each tool's
    answer (an error if the tool message says so); the model's last reply without a tool call
    is the answer. System prompts are left out (they are the agent's, not the task's)."""
    names: dict[str, str] = {}
    for m in messages:
        if isinstance(m, SystemMessage):
            continue
        if isinstance(m, HumanMessage):
            recorder.message("user", m.text)
        elif isinstance(m, AIMessage):
            recorder.message("assistant", m.text)
            for call in m.tool_calls:
                names[call.get("id") or ""] = call["name"]
                recorder.tool(call["name"], call.get("args"))
            if not m.tool_calls and m.text.strip():
                recorder.finish(m.text)
        elif isinstance(m, ToolMessage):
            tool = m.name or names.get(m.tool_call_id, "")
            recorder.observation(m.text, tool=tool, error=m.text if m.status == "error" else "")
        else:
            recorder.message(m.type, m.text)
    return recorder


class ForgeTraceHandler(Reporting, BaseCallbackHandler):
    """Records a LangChain run as a learning trace (see the module docstring); one handler is
    one run: ``reset()`` it, or make a new one, for the next task."""

    raise_error = True  # a bug in recording is not hidden by LangChain's callback manager

    def __init__(self, *, task: str = "", kind: str = "") -> None:
        self.recorder = TraceRecorder(task=task, kind=kind)
        self._tools: dict[UUID, str] = {}
        self._seen_input = False

    def reset(self, task: str = "") -> None:
        self.recorder.reset(task)
        self._tools.clear()
        self._seen_input = False

    # -- the callbacks ----------------------------------------------------------------------
    def on_chat_model_start(self, serialized: dict[str, Any], messages: list[list[BaseMessage]], *, run_id: UUID,
                            parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        if not self._seen_input and messages:  # later calls repeat the conversation: the replies come from on_llm_end
            self._seen_input = True
            record_messages(self.recorder, [m for m in messages[0] if isinstance(m, HumanMessage)])

    def on_llm_start(self, serialized: dict[str, Any], prompts: list[str], *, run_id: UUID, parent_run_id: UUID | None = None,
                     **kwargs: Any) -> None:
        if not self._seen_input and prompts:
            self._seen_input = True
            self.recorder.message("user", prompts[0])

    def on_llm_end(self, response: LLMResult, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        if not response.generations or not response.generations[0]:
            return
        out = response.generations[0][0]
        if isinstance(out, ChatGeneration) and isinstance(out.message, AIMessage):
            reply = out.message
            self.recorder.message("assistant", reply.text)
            if not reply.tool_calls and reply.text.strip():
                self.recorder.finish(reply.text)
        elif out.text.strip():
            self.recorder.message("assistant", out.text)
            self.recorder.finish(out.text)

    def on_tool_start(self, serialized: dict[str, Any], input_str: str, *, run_id: UUID, parent_run_id: UUID | None = None,
                      inputs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        name = (serialized or {}).get("name") or kwargs.get("name") or "tool"
        self._tools[run_id] = name
        self.recorder.tool(name, inputs if inputs is not None else input_str)

    def on_tool_end(self, output: Any, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        text = output.text if isinstance(output, BaseMessage) else output
        failed = isinstance(output, ToolMessage) and output.status == "error"  # a ToolException the tool handled
        self.recorder.observation(text, tool=self._tools.pop(run_id, ""), error=text if failed else "")

    def on_tool_error(self, error: BaseException, *, run_id: UUID, parent_run_id: UUID | None = None, **kwargs: Any) -> None:
        said = f"{type(error).__name__}: {error}"
        self.recorder.observation(said, tool=self._tools.pop(run_id, ""), error=said)

    # -- reporting --------------------------------------------------------------------------
