"""Helpers shared by the service tests: an app over a hashing-embedder memory, with keys."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from forge.engine.embed import HashingEmbedder  # noqa: E402
from forge.engine.memory import Memory  # noqa: E402
from forge.server.app import create_app  # noqa: E402
from forge.server.keys import KeyStore  # noqa: E402
from forge.store import SQLiteStore  # noqa: E402


@dataclass
class Setup:
    app: Any
    memory: Memory
    keys: KeyStore
    admin: str
    alice: str
    bob: str

    def h(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


def make_setup(tmp_path: Path, *, store: Any = None, **kw: Any) -> Setup:
    """An app over ``store`` (default: an SQLite file in ``tmp_path``)."""
    mem = Memory(store if store is not None else SQLiteStore(tmp_path / "svc.db"), HashingEmbedder(64))
    keys = KeyStore(tmp_path / "svc.db.keys.json")
    admin = keys.create(admin=True, note="test admin")
    alice = keys.create(agent="alice", groups=["red"])
    bob = keys.create(agent="bob", groups=["blue"])
    kw.setdefault("rate", 1e6)
    app = create_app(mem, keys=keys, **kw)
    return Setup(app, mem, keys, admin, alice, bob)
