"""``Memory``: a store and an embedder used together, the engine's front door.

    from forge import Memory, Unit, Viewer
    mem = Memory.open("team.db")                   # local embedder, SQLite file
    mem.add([Unit("When the door is locked, look for a key first.", kind="rule")])
    for r in mem.recall("the door will not open", viewer=Viewer.admin()):
        print(r.score, r.unit.content, r.reasons)

The store remembers which embedder built it; opening it with another one is refused rather
than silently mixing vector spaces.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from forge.embed import Embedder, open_embedder
from forge.errors import ConfigError, DimensionError, ValidationError
from forge.model import Episode, Relation, Status, Unit, Viewer
from forge.recall import Packed, Recalled, Reranker, Weights, approx_tokens, pack, recall
from forge.store import Filter, Store, indexed_text, open_store

__all__ = ["Memory"]


class Memory:
    """Units in, ranked and explained units out."""

    def __init__(self, store: Store, embedder: Embedder) -> None:
        recorded = store.settings().get("embedder") if hasattr(store, "settings") else None
        if recorded and recorded != embedder.name:
            raise ConfigError(
                f"this store was built with embedder {recorded!r}; open it with that embedder, not {embedder.name!r}"
            )
        if store.dim is not None and store.dim != embedder.dim:
            raise DimensionError(store.dim, embedder.dim)
        if not recorded and hasattr(store, "set_setting"):
            store.set_setting("embedder", embedder.name)
        self.store = store
        self.embedder = embedder

    @classmethod
    def open(cls, path: str | Path = ":memory:", *, embedder: str | Embedder | None = None) -> Memory:
        """Open a store by path/URL; the embedder defaults to the one the store was built with."""
        store = open_store(path)
        try:
            if embedder is None:
                embedder = store.settings().get("embedder") or "local"  # type: ignore[attr-defined]
            if isinstance(embedder, str):
                embedder = open_embedder(embedder)  # a recorded name ("local:all-MiniLM-L6-v2") reopens that model
            return cls(store, embedder)
        except BaseException:
            store.close()
            raise

    # -- writing --------------------------------------------------------------------------
    def add(self, units: Unit | Sequence[Unit], *, actor: str = "", batch_size: int = 256) -> list[str]:
        """Embed and store units; each batch is one transaction."""
        units = [units] if isinstance(units, Unit) else list(units)
        ids: list[str] = []
        for i in range(0, len(units), batch_size):
            batch = units[i : i + batch_size]
            ids += self.store.add(batch, self.embed([indexed_text(u) for u in batch]), actor=actor)
        return ids

    def update(self, unit: Unit, *, actor: str = "", reembed: bool = True) -> Unit:
        vec = self.embed([indexed_text(unit)]) if reembed else None
        return self.store.update(unit, vec, actor=actor)

    def set_status(self, unit_id: str, status: Status | str, *, reason: str, actor: str = "") -> None:
        self.store.set_status(unit_id, Status.parse(status), reason=reason, actor=actor)

    def relate(self, src: str, dst: str, type: str = "related_to", *, weight: float = 1.0, note: str = "", actor: str = "") -> Relation:
        rel = Relation(src=src, dst=dst, type=type, weight=weight, note=note)  # type: ignore[arg-type]
        self.store.relate(rel, actor=actor)
        return rel

    def record_use(self, unit_ids: Sequence[str], *, success: bool | None, actor: str = "") -> list[Unit]:
        """Units were shown for a decision whose outcome is now known: count it on each unit.

        Every caller that learns an outcome (protocols, agents, the team's procedures,
        consensus) comes here, so use counts and success rates live in one place:
        ``meta.uses``/``successes``/``failures``, and ``validation`` becomes the smoothed
        success rate (1 + s) / (2 + s + f), which recall's validation boost reads. A procedure's
        rho is the same counts. ``success=None`` counts a use with no outcome yet.
        """
        admin = Viewer.admin()
        out: list[Unit] = []
        for unit in self.store.get_many(list(dict.fromkeys(unit_ids)), viewer=admin):
            meta = dict(unit.meta)
            meta["uses"] = int(meta.get("uses", 0)) + 1
            if success is not None:
                key = "successes" if success else "failures"
                meta[key] = int(meta.get(key, 0)) + 1
            s, f = int(meta.get("successes", 0)), int(meta.get("failures", 0))
            validation = (1.0 + s) / (2.0 + s + f) if success is not None else unit.validation
            out.append(self.store.update(unit.replace(meta=meta, validation=validation), None, actor=actor))
        return out

    def add_episode(self, episode: Episode, *, actor: str = "") -> str:
        return self.store.add_episode(episode, actor=actor)

    # -- reading --------------------------------------------------------------------------
    def embed(self, texts: Sequence[str]) -> np.ndarray:
        vecs = self.embedder.embed(list(texts))
        if vecs.shape[1] != self.embedder.dim:
            raise DimensionError(self.embedder.dim, vecs.shape[1])
        return vecs

    def get(self, unit_id: str, *, viewer: Viewer) -> Unit:
        return self.store.get(unit_id, viewer=viewer)

    def recall(
        self,
        query: str,
        *,
        viewer: Viewer,
        k: int = 10,
        filter: Filter = Filter(),
        weights: Weights = Weights(),
        hops: int = 1,
        rerank: Reranker | None = None,
        touch: bool = True,
    ) -> list[Recalled]:
        qv = self.embed([query])[0] if weights.vector > 0 else None
        return recall(
            self.store,
            query=query,
            query_vector=qv,
            viewer=viewer,
            k=k,
            filter=filter,
            weights=weights,
            hops=hops,
            rerank=rerank,
            touch=touch,
        )

    def context(self, query: str, *, viewer: Viewer, budget: int = 512, k: int = 20, count_tokens: Any = approx_tokens, **kw: Any) -> Packed:
        """Recall for ``query`` and pack the result into a ``budget``-token prompt block."""
        return pack(self.recall(query, viewer=viewer, k=k, **kw), budget=budget, count_tokens=count_tokens)

    # -- bulk -----------------------------------------------------------------------------
    def export(self) -> Iterator[dict[str, Any]]:
        return self.store.export_records()

    def import_records(self, records: Iterable[dict[str, Any]], *, actor: str = "import") -> int:
        """Import JSONL records in one transaction; units without vectors are embedded."""
        records = list(records)
        missing = [r for r in records if isinstance(r, dict) and r.get("record") == "unit" and "vector" not in r]
        if missing and len(missing) == sum(1 for r in records if isinstance(r, dict) and r.get("record") == "unit"):
            import base64

            texts = []
            for i, r in enumerate(records, 1):
                if isinstance(r, dict) and r.get("record") == "unit":
                    try:
                        texts.append(indexed_text(Unit.from_dict({k: v for k, v in r.items() if k != "record"})))
                    except ValidationError as exc:
                        raise ValidationError(f"record {i}: {exc}") from None
            for r, v in zip(missing, self.embed(texts), strict=True):
                r["vector"] = base64.b64encode(np.asarray(v, dtype=np.float32).tobytes()).decode()
        return self.store.import_records(records, actor=actor)

    def stats(self) -> dict[str, Any]:
        return self.store.stats()

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Memory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
