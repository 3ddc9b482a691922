"""FORGE: self-improving, shareable memory for populations and teams of LLM agents."""

from forge.engine.memory import Memory
from forge.engine.recall import Recalled, Weights, pack
from forge.errors import ForgeError
from forge.model import (
    Context,
    Episode,
    Kind,
    Provenance,
    Relation,
    RelationType,
    Scope,
    Status,
    Step,
    Unit,
    Viewer,
)
from forge.store import Filter, open_store

__all__ = [
    "Context",
    "Episode",
    "Filter",
    "ForgeError",
    "Kind",
    "Memory",
    "Provenance",
    "Recalled",
    "Relation",
    "RelationType",
    "Scope",
    "Status",
    "Step",
    "Unit",
    "Viewer",
    "Weights",
    "open_store",
    "pack",
]

__version__ = "0.1.0"
