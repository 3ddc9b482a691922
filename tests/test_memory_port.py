"""The typed memory port: a Memory satisfies it, and the code above the engine takes it."""

from __future__ import annotations

import asyncio
import inspect

import pytest

from forge.curate.exposure import Exposure
from forge.engine.memory import Memory
from forge.engine.port import MemoryPort, Recalling
from forge.model import Unit, Viewer


def test_a_memory_is_a_memory_port():
    with Memory.open(":memory:", embedder="hash") as memory:
        assert isinstance(memory, MemoryPort)
        assert isinstance(memory, Recalling)


def test_every_port_verb_is_a_memory_method_with_the_same_keywords():
    port = {n for n in dir(MemoryPort) if not n.startswith("_")}
    for name in port:
        assert hasattr(Memory, name), f"Memory lacks the port verb {name}"
        want = getattr(MemoryPort, name)
        if isinstance(want, property):
            continue
        have = inspect.signature(getattr(Memory, name)).parameters
        for p in inspect.signature(want).parameters.values():
            if p.kind is p.KEYWORD_ONLY:
                assert p.name in have or any(q.kind is q.VAR_KEYWORD for q in have.values()), f"Memory.{name} lacks {p.name}="


def test_the_new_verbs_reach_the_store():
    with Memory.open(":memory:", embedder="hash") as memory:
        a, b = Unit("the door is locked"), Unit("look for a key")
        memory.add([a, b])
        memory.relate(b.id, a.id, "derived_from")
        admin = Viewer.admin()
        assert memory.vector(a.id, viewer=admin) is not None
        assert [r.dst for r in memory.relations(b.id, viewer=admin)] == [a.id]
        assert [rel.src for _, rel in memory.neighbors([a.id], viewer=admin)] == [b.id]
        memory.touch([a.id])
        assert memory.get(a.id, viewer=admin).access_count == 1
        assert memory.info["backend"]


def test_a_gated_view_is_something_to_recall_from():
    with Memory.open(":memory:", embedder="hash") as memory:
        view = Exposure().view(memory, agent="a", episodes=0)
        assert isinstance(view, Recalling) and not isinstance(view, MemoryPort)


@pytest.mark.parametrize("adapter", ["_learn", "langchain", "llamaindex", "openai_agents", "langgraph", "crewai"])
def test_each_adapter_takes_a_memory_or_a_client_but_a_client_is_no_memory_port(adapter):
    """A Client talks HTTP: no transaction, claim or vectors, so it is not a MemoryPort; each
    adapter types what it is handed with a small protocol of the verbs it calls, which a
    Memory, a Client and an AsyncClient all satisfy."""
    from forge.client import AsyncClient, Client

    module = pytest.importorskip(f"forge.integrations.{adapter}")
    with Memory.open(":memory:", embedder="hash") as memory, Client("http://127.0.0.1:9") as client:
        remote = AsyncClient("http://127.0.0.1:9")
        assert not isinstance(client, MemoryPort)
        try:
            for held in (memory, client, remote):
                assert isinstance(held, module.ForgeMemory)
        finally:
            asyncio.run(remote.aclose())
