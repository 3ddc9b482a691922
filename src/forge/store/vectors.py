"""The approximate-nearest-neighbour index, derived from the database and rebuildable.

The database is the source of truth; this index is a cache of its vectors keyed by the
unit's integer row id. Each vector write in the database bumps a counter (``vseq``) and
stamps the row with it; the index file is saved with the counter it has caught up to. On
open, a missing or unreadable file means a full rebuild and an older counter means
replaying only the rows written since, so a crash costs a catch-up, never a wrong answer.

The file is bound to its database: the database has a random id and an index generation
(``db_id``, ``vgen`` in its meta table), bumped each time the index is saved, and the
index's own meta file records both. An index whose id or generation does not match, or
whose counter is ahead of the database's, belongs to another database (a file recreated
under the same name, a backup restored beside a newer index) and is rebuilt. Saves write
uniquely named temporary files and rename them into place, under the database's write
lock, so processes saving one database's index at once do not trip over each other.

Why usearch (bench/ann_choice.py, 100k clustered 384-d vectors, same HNSW M=16 / ef=128):
all three libraries reach recall@10 >= 0.97 at ef_search 32 and 1.00 at 96; hnswlib built 2x
faster and answered ~3x faster (0.43 vs 1.3 ms p50 at ef 96), faiss similar to hnswlib. We
still ship usearch: it is actively released (hnswlib's last release is from 2023), removes
and replaces keys in place (faiss' HNSW cannot), and the ANN step is ~20% of a hybrid recall
at 100k units, where SQLite dominates. Swapping libraries touches only this module.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

__all__ = ["VectorIndex", "expansion_search"]

# HNSW settings, measured with bench/recall_latency.py (clustered 384-d, store.vector_search
# recall@10 vs exact): ef_search 96 gave 1.000 at 100k but 0.928 at 1M; 128 gives 0.955-0.977
# at 1M (192: 0.987, 256: 0.997). A bigger graph needs a longer candidate list for the same
# recall, so the list grows with the index (expansion_search): 64 up to 100k vectors, where it
# finds 0.99 of the exact top 10 in ~0.6 ms less than 128 does, (n / 100k) ** 0.3 beyond, 128
# at 1M. Search-time only: saved index files need no rebuild.
CONNECTIVITY = 16
EXPANSION_ADD = 128
EXPANSION_SEARCH = 128  # at 1M vectors
EXPANSION_SEARCH_MIN = 64
EXPANSION_SEARCH_MAX = 256
# Up to this many vectors, search is exact (usearch's brute force over the same index):
# about as fast as HNSW there (7.4k clustered 384-d: 6.3 vs 6.1 ms per query on a loaded
# 2-core box, 20k: 14 vs 8 ms) and never misses. HNSW missed the exact match in 3-10 of
# 7,400 self-queries on clustered data at every ef_search tried (128, 256, 512, 1024): the
# misses are nodes the graph does not reach, which a wider beam does not fix.
EXACT_MAX = 10_000
# The vectors gathered for the last exact search among a set of keys are kept (with their
# norms) while the index is unchanged, for sets up to this many keys (30 MB at 384-d): usearch
# hands back one array per key, so gathering 9k vectors took ~17 ms of a filtered recall at 1M
# (bench/recall_latency.py) against ~1 ms for the search itself, and an agent recalls with
# the same filter again, as the two halves of a hybrid recall do.
GATHERED_MAX = 20_000
# After a change only the keys changed since are fetched (an agent's writes between its
# recalls), not the whole set again, while the last this many changes are known.
CHANGES_KEPT = 256


def expansion_search(n: int) -> int:
    """HNSW's candidate list (ef_search) for an index of ``n`` vectors; see the settings above."""
    return round(min(EXPANSION_SEARCH_MAX, max(EXPANSION_SEARCH_MIN, EXPANSION_SEARCH_MIN * (n / 100_000) ** 0.3)))


class VectorIndex:
    """A usearch HNSW index over unit vectors, with its own catch-up bookkeeping."""

    def __init__(self, *, dim: int, path: Path | None) -> None:
        from usearch.index import Index

        self.dim = dim
        self.path = path
        self.seq = 0  # the database vseq this index reflects
        self._lock = threading.Lock()
        self._index = Index(
            ndim=dim,
            metric="cos",
            dtype="f32",
            connectivity=CONNECTIVITY,
            expansion_add=EXPANSION_ADD,
            expansion_search=EXPANSION_SEARCH,
        )
        self._dirty = False
        self._version = 0  # bumped by every change to the vectors: what _gathered was taken from
        self._changes: deque[tuple[int, np.ndarray]] = deque(maxlen=CHANGES_KEPT)  # (version, keys it changed)
        self._gathered: tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None

    # -- persistence ------------------------------------------------------------------
    @property
    def _meta_path(self) -> Path | None:
        return self.path.with_name(self.path.name + ".json") if self.path else None

    @property
    def dirty(self) -> bool:
        """Whether the index changed since it was loaded or saved."""
        return self._dirty

    def load(self, *, db_id: str | None = None, gen: int = 0, max_seq: int | None = None) -> bool:
        """Load the saved index if it is readable and belongs to this database state.

        ``db_id`` and ``gen`` are the database's; ``max_seq`` its vector counter. False
        means: rebuild it from the database.
        """
        if not self.path or not self.path.exists() or not self._meta_path.exists():
            return False
        try:
            meta = json.loads(self._meta_path.read_text())
            if meta.get("dim") != self.dim:
                return False
            if db_id is not None and (meta.get("db_id") != db_id or int(meta.get("gen", -1)) != gen):
                return False  # another database's index, or an older/newer one of this database
            seq = int(meta["seq"])
            if max_seq is not None and seq > max_seq:
                return False  # ahead of the database: it reflects writes this file never had
            self._version += 1
            self._changes.clear()  # every vector may differ: a kept copy cannot be brought up to date
            self._index.load(str(self.path))
            if len(self._index) != meta.get("count"):
                raise ValueError("count mismatch")
            self.seq = seq
        except Exception:  # any unreadable index is just rebuilt from the database
            self._index.reset()
            self.seq = 0
            return False
        return True

    def save(self, *, db_id: str | None = None, gen: int = 0) -> None:
        """Write the index and its meta atomically (unique temp files + rename)."""
        if not self.path:
            return
        with self._lock:
            tag = f".{os.getpid()}.{os.urandom(4).hex()}.tmp"
            tmp = self.path.with_name(self.path.name + tag)
            meta_tmp = self._meta_path.with_name(self._meta_path.name + tag)
            try:
                self._index.save(str(tmp))
                meta = {"seq": self.seq, "dim": self.dim, "count": len(self._index), "db_id": db_id, "gen": gen}
                meta_tmp.write_text(json.dumps(meta))
                os.replace(tmp, self.path)
                os.replace(meta_tmp, self._meta_path)
            finally:
                for leftover in (tmp, meta_tmp):
                    with contextlib.suppress(OSError):
                        leftover.unlink()
            self._dirty = False

    # -- updates ----------------------------------------------------------------------
    def upsert(self, keys: np.ndarray, vectors: np.ndarray, *, seq: int) -> None:
        with self._lock:
            keys = np.asarray(keys, dtype=np.uint64)
            present = np.array([k in self._index for k in keys.tolist()], dtype=bool) if len(self._index) else None
            if present is not None and present.any():
                for k in keys[present].tolist():
                    self._index.remove(k)
            if len(keys):
                self._version += 1
                self._changes.append((self._version, keys.copy()))
                self._index.add(keys, np.asarray(vectors, dtype=np.float32), threads=0)
            self.seq = max(self.seq, seq)
            self._dirty = True

    def catch_up(self, rows: Callable[[int], Iterator[tuple[np.ndarray, np.ndarray, int]]], *, target: int) -> int:
        """Replay vector rows written after ``self.seq`` (batches of keys, vectors, max seq)."""
        n = 0
        for keys, vectors, seq in rows(self.seq):
            self.upsert(keys, vectors, seq=seq)
            n += len(keys)
        with self._lock:
            self.seq = max(self.seq, target)
            self._dirty = self._dirty or n > 0
        return n

    # -- queries ----------------------------------------------------------------------
    def search(self, query: np.ndarray, k: int) -> list[tuple[int, float]]:
        """(row id, cosine similarity) of the ``k`` nearest vectors, best first."""
        if not len(self._index) or k <= 0:
            return []
        k = min(k, len(self._index))
        exact = len(self._index) <= EXACT_MAX
        ef = expansion_search(len(self._index))
        if not exact and self._index.expansion_search != ef:
            self._index.expansion_search = ef  # a function of the size: concurrent searches set the same
        matches = self._index.search(np.asarray(query, dtype=np.float32), k, exact=exact)
        return [(int(key), 1.0 - float(d)) for key, d in zip(matches.keys, matches.distances, strict=True)]

    def search_exact_among(self, query: np.ndarray, keys: list[int] | np.ndarray, k: int) -> list[tuple[int, float]]:
        """Exact cosine search restricted to ``keys`` (used when filters are selective)."""
        q = np.asarray(query, dtype=np.float32)
        present, sims = self._similarities(np.asarray(keys, dtype=np.uint64), q / (np.linalg.norm(q) or 1.0))
        if not len(present):
            return []
        k = min(k, len(sims))
        top = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
        top = top[np.argsort(-sims[top], kind="stable")]
        return [(int(present[i]), float(sims[i])) for i in top]

    def _similarities(self, keys: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The keys of ``keys`` that have a vector (units without one are not in the index)
        and their cosine similarity to the unit vector ``q``.

        The vectors gathered by an earlier call are kept (with 1 / norm) and reused: whole
        when the same keys are asked of the same index; else the keys no change since has
        touched are scored from the kept copy and only the rest are fetched (an agent's
        filter after a few writes), the copy itself being replaced once that rest grows past
        an eighth of the set or the changes since are no longer known.
        """
        version, base = self._version, self._gathered
        if base is not None and base[0] == version and np.array_equal(base[1], keys):
            return base[2], (base[3] @ q) * base[4]
        present = keys[np.asarray(self._index.contains(keys), dtype=bool)] if len(keys) else keys
        reuse = np.zeros(len(present), dtype=bool)
        at = np.zeros(len(present), dtype=np.intp)
        changed = self._changed_since(base[0]) if base is not None and len(base[2]) else None
        if changed is not None and base is not None and len(present):
            at = np.minimum(np.searchsorted(base[2], present), len(base[2]) - 1)  # base[2] ascends: see below
            reuse = (base[2][at] == present) & ~np.isin(present, changed)
        fetch = present[~reuse]
        got, got_inv = self._fetch(fetch)
        if base is not None and len(fetch) * 8 <= len(present):
            sims = np.empty(len(present), dtype=np.float32)
            sims[reuse] = ((base[3] @ q) * base[4])[at[reuse]]
            sims[~reuse] = (got @ q) * got_inv
            return present, sims
        vecs = np.empty((len(present), self.dim), dtype=np.float32)
        inv_norms = np.empty(len(present), dtype=np.float32)
        if base is not None and reuse.any():
            vecs[reuse], inv_norms[reuse] = base[3][at[reuse]], base[4][at[reuse]]
        vecs[~reuse], inv_norms[~reuse] = got, got_inv
        if len(keys) <= GATHERED_MAX and bool(np.all(present[1:] > present[:-1])):  # ascending keys only (row ids are)
            self._gathered = (version, keys.copy(), present, vecs, inv_norms)
        return present, (vecs @ q) * inv_norms

    def _fetch(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The vectors of ``keys`` (all present) as one matrix, and 1 / norm of each (0 for a zero vector)."""
        if not len(keys):
            return np.zeros((0, self.dim), dtype=np.float32), np.zeros(0, dtype=np.float32)
        # concatenate, not stack: 9k rows in ~5 ms where np.stack took ~27 (its per-row checks)
        vecs = np.concatenate(self._get_many(keys)).astype(np.float32, copy=False).reshape(len(keys), self.dim)
        norms = np.sqrt(np.einsum("ij,ij->i", vecs, vecs))  # 6x faster than linalg.norm's temporary x * x
        return vecs, np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)

    def _changed_since(self, version: int) -> np.ndarray | None:
        """Every key changed after ``version``, or None when the changes kept do not reach back."""
        with self._lock:
            current, log = self._version, list(self._changes)
        newer = [keys for v, keys in log if v > version]
        if len(newer) != current - version:
            return None
        return np.concatenate(newer) if newer else np.zeros(0, dtype=np.uint64)

    def _get_many(self, keys: np.ndarray) -> Sequence[np.ndarray]:
        """The vectors of ``keys`` (all present). usearch's ``Index.get`` wraps each row in two
        Python calls, 60% of a filtered exact search over 9k units at 1M (bench/recall_latency.py):
        its compiled ``get_many`` is called directly, with ``get`` as the fallback."""
        compiled = getattr(self._index, "_compiled", None)
        if compiled is not None and hasattr(compiled, "get_many"):
            from usearch.index import ScalarKind

            with contextlib.suppress(Exception):
                return compiled.get_many(keys, ScalarKind.F32)
        return self._index.get(keys)

    def stored(self, key: int) -> np.ndarray | None:
        """The vector held under ``key``, or None if the index has no such key."""
        with self._lock:
            if key not in self._index:
                return None
            return np.asarray(self._index.get(key), dtype=np.float32).reshape(-1)

    def __len__(self) -> int:
        return len(self._index)
