"""FORGE memory for LangChain: a retriever and tools, over a Memory, a Client or an AsyncClient.

    from forge.integrations.langchain import ForgeRetriever, forge_tools
    retriever = ForgeRetriever(memory=Memory.open("team.db"), viewer=Viewer.of("planner"), k=5, min_score=0.1)
    docs = retriever.invoke("why does the worker stall?")      # Documents, with score and reasons in metadata
    tools = forge_tools(Client(url, key))                       # recall_memory, remember: for any tool-calling agent

A retrieved ``Document`` is a unit: ``page_content`` its content, ``metadata`` its id, kind,
scope, score (0-1) and the reasons it was recalled. ``remember`` goes through admission, and
its answer says what was done (added / merged into X / updated X). Over a client, the key
is the viewer; over a memory, ``viewer`` (default: the operator's).
"""

from __future__ import annotations

import asyncio
from typing import Any

from langchain_core.callbacks import (
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import BaseTool, StructuredTool
from pydantic import ConfigDict

from forge.model import Unit, Viewer
from forge.store import Filter

__all__ = ["ForgeRetriever", "forge_tools"]


def _is_async(memory: Any) -> bool:
    from forge.client import AsyncClient

    return isinstance(memory, AsyncClient)


def _is_remote(memory: Any) -> bool:
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

    memory: Any
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


def forge_tools(memory: Any, *, viewer: Viewer | None = None, actor: str = "langchain", k: int = 5,
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
