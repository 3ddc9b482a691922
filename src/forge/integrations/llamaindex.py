"""FORGE memory for LlamaIndex: a retriever, a memory block and an agent's learning trace, over a Memory, a Client or an AsyncClient.

    from llama_index.core.memory import Memory as ChatMemory
    from llama_index.core.query_engine import RetrieverQueryEngine
    from forge.integrations.llamaindex import ForgeMemoryBlock, ForgeRetriever
    engine = RetrieverQueryEngine.from_args(ForgeRetriever(mem, k=5), llm=llm)    # answers from FORGE's recall
    chat = ChatMemory.from_defaults(session_id="chat-42", memory_blocks=[ForgeMemoryBlock(memory=mem)])

- ``ForgeRetriever`` is a LlamaIndex ``BaseRetriever``: each ``NodeWithScore`` is a unit (its
  ``TextNode`` has the unit's id and content; metadata its kind, scope, owner, 0-1 score and
  the reasons it was recalled, all but the kind kept out of what the LLM reads).
- ``ForgeMemoryBlock`` is a long-term memory block for LlamaIndex's ``Memory``: when the chat
  history outgrows its token limit, the turns flushed out of it go to FORGE through admission
  (a repeated turn merges into the unit that holds it; kind ``episode``, tagged ``llamaindex``
  and ``session:<id>``), or with ``extract=True`` through :meth:`forge.Memory.add_messages`
  (the memory's LLM extracts facts, preferences and rules, then admission); and each time the
  memory is read, the block recalls what FORGE knows about the latest user message (every
  kind, from every door the viewer may see) into the prompt.

- ``ForgeAgentTrace`` records an agent workflow's run (``FunctionAgent``, ``ReActAgent``,
  ``AgentWorkflow``) from the events it streams: the task, the model's replies, each tool
  call with its arguments and its output or error, the final answer.
  ``report(memory, success=..., score=..., feedback=...)`` sends it with its outcome to
  FORGE's learning entry (``POST /v1/learn`` over a client, as a job; :meth:`forge.Memory.learn`
  over a memory, as ``agent``)::

      rec = ForgeAgentTrace(kind="ops")
      result = await rec.watch(agent.run(user_msg="The worker is stuck"))
      await rec.areport(client, success=False, feedback="the restart did not help")

Over a client, the key is the viewer; over a memory, ``viewer`` (default: the operator's).
"""

from __future__ import annotations

import asyncio
from typing import Any

from llama_index.core.agent.workflow import AgentInput, AgentOutput, ToolCallResult
from llama_index.core.base.base_retriever import BaseRetriever
from llama_index.core.base.llms.types import ChatMessage, TextBlock
from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr
from llama_index.core.callbacks import CallbackManager
from llama_index.core.memory import BaseMemoryBlock
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from forge.curate.admission import Admitted
from forge.integrations._learn import Reporting, TraceRecorder
from forge.integrations._port import ForgeMemory
from forge.model import Context, Provenance, Unit, Viewer
from forge.store import Filter

__all__ = ["ForgeAgentTrace", "ForgeMemoryBlock", "ForgeRetriever"]

MARK = "llamaindex"  # tag on every unit this door writes
_HIDDEN = ["id", "scope", "owner", "score", "reasons", "source"]  # metadata the LLM and embedders do not read


def _is_async(memory: ForgeMemory) -> bool:
    from forge.client import AsyncClient

    return isinstance(memory, AsyncClient)


def _is_remote(memory: ForgeMemory) -> bool:
    from forge.client import AsyncClient, Client

    return isinstance(memory, Client | AsyncClient)


def _recall_kw(memory: ForgeMemory, viewer: Viewer | None, k: int, min_score: float, f: Filter) -> dict[str, Any]:
    kw: dict[str, Any] = {"k": k, "filter": f, "min_score": min_score}
    if not _is_remote(memory):
        kw["viewer"] = viewer or Viewer.admin()
    elif viewer is not None:
        kw["viewer"] = viewer  # checked against the key
    return kw


async def _arecall(memory: ForgeMemory, query: str, kw: dict[str, Any]) -> list[Any]:
    if _is_async(memory):
        return await memory.recall(query, **kw)
    return await asyncio.to_thread(lambda: memory.recall(query, **kw))


def _node(r: Any) -> NodeWithScore:
    u = r.unit
    node = TextNode(
        id_=u.id, text=u.content,
        metadata={"id": u.id, "kind": u.kind.value, "scope": str(u.scope), "owner": u.owner, "score": round(float(r.score), 6),
                  "reasons": list(r.reasons), "source": u.provenance.source},
        excluded_llm_metadata_keys=list(_HIDDEN), excluded_embed_metadata_keys=list(_HIDDEN),
    )
    return NodeWithScore(node=node, score=float(r.score))


class ForgeRetriever(BaseRetriever):
    """FORGE's hybrid recall as a LlamaIndex retriever (``retrieve`` and ``aretrieve``)."""

    def __init__(self, memory: ForgeMemory, *, viewer: Viewer | None = None, k: int = 5, min_score: float = 0.0,
                 filter: Filter = Filter(), callback_manager: CallbackManager | None = None) -> None:
        super().__init__(callback_manager=callback_manager)
        self.memory, self.viewer, self.k, self.min_score, self.filter = memory, viewer, k, min_score, filter

    def _kw(self) -> dict[str, Any]:
        return _recall_kw(self.memory, self.viewer, self.k, self.min_score, self.filter)

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        if _is_async(self.memory):
            raise TypeError("this retriever is over an AsyncClient: use aretrieve (or a query engine's aquery)")
        return [_node(r) for r in self.memory.recall(query_bundle.query_str, **self._kw())]

    async def _aretrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        return [_node(r) for r in await _arecall(self.memory, query_bundle.query_str, self._kw())]


def _text(message: ChatMessage) -> str:
    return " ".join(b.text for b in message.blocks if isinstance(b, TextBlock) and b.text.strip()).strip()


class ForgeMemoryBlock(BaseMemoryBlock[str]):
    """A long-term memory block of LlamaIndex's ``Memory`` kept in FORGE (see the module docstring)."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    name: str = Field(default="forge_memory", description="The name of the memory block.")
    memory: ForgeMemory = Field(exclude=True, description="A forge Memory, Client or AsyncClient.")
    viewer: Viewer | None = Field(default=None, description="Who reads, over a Memory (default: the operator).")
    k: int = Field(default=5, description="How many memories to recall into the prompt.")
    min_score: float = Field(default=0.1, description="The least recall score (0-1) a memory needs.")
    filter: Filter = Field(default_factory=Filter, description="What recall may return (kinds, tags, scopes...).")
    kind: str = Field(default="episode", description="The kind flushed turns are stored as.")
    scope: str = Field(default="global", description="The FORGE scope turns are written in.")
    owner: str = Field(default="", description="Their owner (needed for a private scope).")
    extract: bool = Field(default=False, description="Extract facts with the memory's LLM (add_messages) instead of storing turns.")
    admit: bool = Field(default=True, description="Write through admission (False: store as given).")
    actor: str = Field(default="llamaindex", description="Who the audit log says wrote.")
    _last: list[Admitted] = PrivateAttr(default_factory=list)

    @property
    def last_admissions(self) -> list[Admitted]:
        """The decisions of the latest flush (one per turn, or per extracted memory)."""
        return list(self._last)

    async def _aget(self, messages: list[ChatMessage] | None = None, **block_kwargs: Any) -> str:
        said = [m for m in messages or [] if _text(m)]
        latest = next((m for m in reversed(said) if m.role.value == "user"), said[-1] if said else None)
        if latest is None:
            return ""
        kw = _recall_kw(self.memory, self.viewer, self.k, self.min_score, self.filter)
        hits = await _arecall(self.memory, _text(latest)[:4000], kw)
        return "\n".join(f"- [{r.unit.kind.value}] {r.unit.content}" for r in hits)

    async def _aput(self, messages: list[ChatMessage]) -> None:
        turns = [(m.role.value, _text(m), m.additional_kwargs.get("session_id")) for m in messages
                 if m.role.value in ("user", "assistant") and _text(m)]
        if not turns:
            self._last = []
            return
        if self.extract:
            self._last = await self._extract([{"role": role, "content": text} for role, text, _ in turns])
            return
        units = [Unit(f"{role}: {text}"[:16_000], kind=self.kind, scope=self.scope, owner=self.owner,  # type: ignore[arg-type]
                      context=Context(tags=(MARK, *([f"session:{sid}"] if sid else []))), provenance=Provenance(source=MARK))
                 for role, text, sid in turns]
        self._last = await self._write(units)

    async def _write(self, units: list[Unit]) -> list[Admitted]:
        if _is_async(self.memory):
            if self.admit:
                return await self.memory.admit(units, actor=self.actor)
            return [Admitted("add", i, "stored as given (admission off)", i) for i in await self.memory.add(units, actor=self.actor, admit=False)]
        return await asyncio.to_thread(self._write_now, units)

    def _write_now(self, units: list[Unit]) -> list[Admitted]:
        if _is_remote(self.memory):
            if self.admit:
                return self.memory.admit(units, actor=self.actor)
            return [Admitted("add", i, "stored as given (admission off)", i) for i in self.memory.add(units, actor=self.actor, admit=False)]
        if self.admit:
            from forge.curate.admission import admit

            return admit(self.memory, units, actor=self.actor)
        return [Admitted("add", i, "stored as given (admission off)", i) for i in self.memory.add(units, actor=self.actor)]

    async def _extract(self, turns: list[dict[str, str]]) -> list[Admitted]:
        if _is_async(self.memory):
            got = await self.memory.add_messages(turns, scope=self.scope, admit=self.admit, actor=self.actor)
        elif _is_remote(self.memory):
            got = await asyncio.to_thread(self.memory.add_messages, turns, scope=self.scope, admit=self.admit, actor=self.actor)
        else:
            got = await asyncio.to_thread(self.memory.add_messages, turns, actor=self.actor, scope=self.scope, owner=self.owner,
                                          admit=self.admit)
        return [x.decision for x in got.kept]


# -- learning -------------------------------------------------------------------------------


class ForgeAgentTrace(Reporting):
    """A LlamaIndex agent's run as a learning trace, from its workflow events (see the module
    docstring); one recorder is one run: ``reset()`` it, or make a new one, for the next."""

    def __init__(self, *, task: str = "", kind: str = "") -> None:
        self.recorder = TraceRecorder(task=task, kind=kind)
        self._seen_input = False

    def reset(self, task: str = "") -> None:
        self.recorder.reset(task)
        self._seen_input = False

    def record(self, event: Any) -> None:
        """One event of the run (others than these are not the trace's: streamed deltas, setup)."""
        if isinstance(event, AgentInput) and not self._seen_input:
            self._seen_input = True  # the first input ends with this run's task (chat history before it)
            asked = [_text(m) for m in event.input if m.role.value == "user" and _text(m)]
            if asked:
                self.recorder.message("user", asked[-1])
        elif isinstance(event, AgentOutput):
            said = _text(event.response)
            self.recorder.message("assistant", said)
            if not event.tool_calls and said:
                self.recorder.finish(said)
        elif isinstance(event, ToolCallResult):
            out = event.tool_output
            error = (f"{type(out.exception).__name__}: {out.exception}" if out.exception is not None else out.content) if out.is_error else ""
            self.recorder.tool(event.tool_name, event.tool_kwargs)
            self.recorder.observation(out.content, tool=event.tool_name, error=error)

    async def watch(self, handler: Any) -> Any:
        """Record every event a running workflow streams (``agent.run(...)``'s handler), and
        return its result."""
        async for event in handler.stream_events():
            self.record(event)
        result = await handler
        if isinstance(result, AgentOutput) and _text(result.response):
            self.recorder.finish(_text(result.response))
        return result
