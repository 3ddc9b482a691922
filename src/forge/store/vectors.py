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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import cast

import numpy as np

__all__ = ["VectorIndex", "expansion_search"]

# HNSW settings, measured with bench/recall_latency.py (clustered 384-d, store.vector_search
# recall@10 vs exact): ef_search 96 gave 1.000 at 100k but 0.928 at 1M; 128 gives 0.955-0.977
# at 1M (192: 0.987, 256: 0.997). A bigger graph needs a longer candidate list for the same
# recall, so the list grows with the index (expansion_search): 64 up to 100k vectors, where it
# finds 0.99 of the exact top 10 in ~0.6 ms less than 128 does, (n / 100k) ** 0.5 beyond, 202
# at 1M. It was ** 0.3 (128 at 1M) until a rebuilt 1M fixture found 0.963 there; the same
# index found 0.9625 / 0.9675 / 0.9725 / 0.9775 at ef 128 / 160 / 176 / 192, at the same
# CPU time within this machine's noise (1.5-1.7 ms). Search-time only: saved index files
# need no rebuild.
CONNECTIVITY = 16
EXPANSION_ADD = 128
EXPANSION_SEARCH = 202  # at 1M vectors
EXPANSION_SEARCH_MIN = 64
EXPANSION_SEARCH_MAX = 256
# Up to this many vectors, search is exact (usearch's brute force over the same index):
# about as fast as HNSW there (7.4k clustered 384-d: 6.3 vs 6.1 ms per query on a loaded
# 2-core box, 20k: 14 vs 8 ms) and never misses. HNSW missed the exact match in 3-10 of
# 7,400 self-queries on clustered data at every ef_search tried (128, 256, 512, 1024): the
# misses are nodes the graph does not reach, which a wider beam does not fix.
EXACT_MAX = 10_000
# Exact search among a filter's units reads an int8 copy of every vector, one row per key
# (row ids are dense), instead of asking usearch for each key's vector: usearch hands back one
# array per key, so a new filter's 5-33k units at 1M took 17-35 ms to gather. The copy's rows
# are gathered in one numpy take and searched with usearch's SIMD cosine kernel; the best
# RESCORE_MIN (or 2k) are then scored exactly from the f32 index. Chosen by bench/ann_choice.py
# --filtered (1M vectors, 0.5-3.3% admitted, a new set per query): int8 with 40 re-scored found
# every exact top 10 at the lowest CPU time; f16 the same at twice the bytes, an f32 copy at 4x;
# faiss' HNSW filtering while it searches found 0.30-0.90 of them. 384 bytes per 384-d vector:
# a quarter of what the index holds for its own f32 vectors.
RESCORE_MIN = 40
FILL_BATCH = 16_384  # keys coded per step when a loaded index's copy is filled
# Keys this far past the number of vectors are too sparse for a copy by key: exact search then
# fetches each key's vector from usearch, as before the copy.
SPARSE_KEYS = 8


def expansion_search(n: int) -> int:
    """HNSW's candidate list (ef_search) for an index of ``n`` vectors; see the settings above."""
    return round(min(EXPANSION_SEARCH_MAX, max(EXPANSION_SEARCH_MIN, EXPANSION_SEARCH_MIN * float((n / 100_000) ** 0.5))))


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
        # The int8 copy (see RESCORE_MIN): row ``key`` holds that key's vector when
        # ``_coded[key]``; ``_complete`` says every vector of the index is coded (false after
        # a load until fill_copy() or the searches have coded them); ``_sparse`` turns it off.
        self._codes = np.zeros((0, dim), dtype=np.int8)
        self._coded = np.zeros(0, dtype=bool)
        self._complete = True
        self._sparse = False

    # -- persistence ------------------------------------------------------------------
    @staticmethod
    def _meta_path(path: Path) -> Path:
        return path.with_name(path.name + ".json")

    @property
    def dirty(self) -> bool:
        """Whether the index changed since it was loaded or saved."""
        return self._dirty

    def load(self, *, db_id: str | None = None, gen: int = 0, max_seq: int | None = None) -> bool:
        """Load the saved index if it is readable and belongs to this database state.

        ``db_id`` and ``gen`` are the database's; ``max_seq`` its vector counter. False
        means: rebuild it from the database.
        """
        path = self.path
        if not path or not path.exists() or not self._meta_path(path).exists():
            return False
        try:
            meta = json.loads(self._meta_path(path).read_text())
            if meta.get("dim") != self.dim:
                return False
            if db_id is not None and (meta.get("db_id") != db_id or int(meta.get("gen", -1)) != gen):
                return False  # another database's index, or an older/newer one of this database
            seq = int(meta["seq"])
            if max_seq is not None and seq > max_seq:
                return False  # ahead of the database: it reflects writes this file never had
            with self._lock:  # every vector may differ from the copy's
                self._coded[:] = False
                self._complete = False
            self._index.load(str(path))
            if len(self._index) != meta.get("count"):
                raise ValueError("count mismatch")
            self.seq = seq
        except Exception:  # any unreadable index is just rebuilt from the database
            self._index.reset()  # type: ignore[no-untyped-call]  # usearch leaves it unannotated
            self.seq = 0
            with self._lock:
                self._complete = True  # empty: nothing to code
            return False
        return True

    def save(self, *, db_id: str | None = None, gen: int = 0) -> None:
        """Write the index and its meta atomically (unique temp files + rename)."""
        path = self.path
        if not path:
            return
        meta_path = self._meta_path(path)
        with self._lock:
            tag = f".{os.getpid()}.{os.urandom(4).hex()}.tmp"
            tmp = path.with_name(path.name + tag)
            meta_tmp = meta_path.with_name(meta_path.name + tag)
            try:
                self._index.save(str(tmp))
                meta = {"seq": self.seq, "dim": self.dim, "count": len(self._index), "db_id": db_id, "gen": gen}
                meta_tmp.write_text(json.dumps(meta))
                os.replace(tmp, path)
                os.replace(meta_tmp, meta_path)
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
                vectors = np.asarray(vectors, dtype=np.float32)
                self._index.add(keys, vectors, threads=0)
                self._code(keys, vectors)
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
            # a function of the size: concurrent searches set the same (usearch types it read-only)
            self._index.expansion_search = ef  # type: ignore[misc]
        matches = self._index.search(np.asarray(query, dtype=np.float32), k, exact=exact)
        return [(int(key), 1.0 - float(d)) for key, d in zip(matches.keys, matches.distances, strict=True)]

    def search_exact_among(self, query: np.ndarray, keys: list[int] | np.ndarray, k: int) -> list[tuple[int, float]]:
        """Exact cosine search restricted to ``keys`` (used when filters are selective): the
        best candidates of the int8 copy, scored from the f32 vectors. Keys without a vector
        (units without one are not in the index) are skipped."""
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        q = q / (np.linalg.norm(q) or 1.0)
        keys = np.asarray(keys, dtype=np.uint64).reshape(-1)
        if not len(keys) or k <= 0:
            return []
        depth = max(RESCORE_MIN, 2 * k)
        rows = self._coded_rows(keys) if len(keys) > depth else None
        if rows is None:  # few keys, or no copy: each key's vector from usearch
            cand = keys[np.asarray(self._index.contains(keys), dtype=bool)]
        else:
            present, codes = rows
            if len(present) > depth:
                from usearch.index import MetricKind
                from usearch.index import search as brute

                found = brute(np.take(codes, present.astype(np.intp), axis=0), _quantize(q[None, :])[0],
                              depth, MetricKind.Cos, exact=True, threads=1)
                present = present[np.asarray(found.keys, dtype=np.intp)]
            cand = present[np.asarray(self._index.contains(present), dtype=bool)]  # removed since it was coded: skipped
        if not len(cand):
            return []
        vecs, inv_norms = self._fetch(cand)
        sims = (vecs @ q) * inv_norms
        k = min(k, len(sims))
        top = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
        top = top[np.lexsort((cand[top], -sims[top]))]  # ties by key, whatever order the copy found them in
        return [(int(cand[i]), float(sims[i])) for i in top]

    def _coded_rows(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The keys of ``keys`` that have a vector, and the copy to read their rows from; keys
        the copy lacks (after a load) are coded first. None when there is no copy."""
        with self._lock:
            if self._sparse:
                return None
            if not self._complete:
                inside = keys[keys < len(self._coded)]
                missing = np.concatenate([keys[keys >= len(self._coded)], inside[~self._coded[inside.astype(np.intp)]]])
                missing = missing[np.asarray(self._index.contains(missing), dtype=bool)] if len(missing) else missing
                if len(missing):
                    self._code(missing, self._fetch(missing)[0])
                    if self._sparse:
                        return None
            codes, coded = self._codes, self._coded
        keys = keys[keys < len(coded)]
        return keys[coded[keys.astype(np.intp)]], codes

    def fill_copy(self) -> None:
        """Code every vector the int8 copy lacks (a loaded index), a batch at a time so that
        searches run in between: the store's warm-up thread calls it after loading."""
        if self._complete or self._sparse:
            return
        keys = np.sort(np.asarray(self._index.keys, dtype=np.uint64))
        for at in range(0, len(keys), FILL_BATCH):
            with self._lock:
                if self._complete or self._sparse:
                    return
                chunk = keys[at : at + FILL_BATCH]
                inside = chunk < len(self._coded)
                need = np.concatenate([chunk[~inside], chunk[inside][~self._coded[chunk[inside].astype(np.intp)]]])
                need = need[np.asarray(self._index.contains(need), dtype=bool)] if len(need) else need
                if len(need):
                    self._code(need, self._fetch(need)[0])
        with self._lock:  # complete unless a load reset the copy meanwhile
            keys = np.asarray(self._index.keys, dtype=np.uint64)
            inside = keys < len(self._coded)
            if not self._sparse and bool(inside.all()) and bool(self._coded[keys.astype(np.intp)].all()):
                self._complete = True

    def _code(self, keys: np.ndarray, vectors: np.ndarray) -> None:
        """Write ``vectors`` into the int8 copy at ``keys`` (holding ``_lock``), growing it."""
        if self._sparse or not len(keys):
            return
        top = int(keys.max())
        if top >= len(self._coded):
            if top > SPARSE_KEYS * (len(self._index) + len(keys)) + 65_536:
                self._sparse = True  # row ids this sparse would make a copy mostly empty rows
                self._codes, self._coded = np.zeros((0, self.dim), dtype=np.int8), np.zeros(0, dtype=bool)
                return
            size = max(top + 1, 2 * len(self._coded), 1024)
            codes = np.zeros((size, self.dim), dtype=np.int8)
            codes[: len(self._codes)] = self._codes
            coded = np.zeros(size, dtype=bool)
            coded[: len(self._coded)] = self._coded
            self._codes, self._coded = codes, coded  # a search that took the old arrays keeps them
        rows = keys.astype(np.intp)
        self._codes[rows] = _quantize(vectors)
        self._coded[rows] = True

    def _fetch(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The vectors of ``keys`` (all present) as one matrix, and 1 / norm of each (0 for a zero vector)."""
        if not len(keys):
            return np.zeros((0, self.dim), dtype=np.float32), np.zeros(0, dtype=np.float32)
        # concatenate, not stack: 9k rows in ~5 ms where np.stack took ~27 (its per-row checks)
        vecs = np.concatenate(self._get_many(keys)).astype(np.float32, copy=False).reshape(len(keys), self.dim)
        norms = np.sqrt(np.einsum("ij,ij->i", vecs, vecs))  # 6x faster than linalg.norm's temporary x * x
        return vecs, np.divide(1.0, norms, out=np.zeros_like(norms), where=norms > 0)

    def _get_many(self, keys: np.ndarray) -> Sequence[np.ndarray]:
        """The vectors of ``keys`` (all present). usearch's ``Index.get`` wraps each row in two
        Python calls, 60% of a filtered exact search over 9k units at 1M (bench/recall_latency.py):
        its compiled ``get_many`` is called directly, with ``get`` as the fallback."""
        compiled = getattr(self._index, "_compiled", None)
        if compiled is not None and hasattr(compiled, "get_many"):
            from usearch.index import ScalarKind

            with contextlib.suppress(Exception):
                return cast(Sequence[np.ndarray], compiled.get_many(keys, ScalarKind.F32))
        return cast(Sequence[np.ndarray], self._index.get(keys))

    def stored(self, key: int) -> np.ndarray | None:
        """The vector held under ``key``, or None if the index has no such key."""
        with self._lock:
            if key not in self._index:
                return None
            return np.asarray(self._index.get(key), dtype=np.float32).reshape(-1)

    def __len__(self) -> int:
        return len(self._index)


def _quantize(vectors: np.ndarray) -> np.ndarray:
    """Each row scaled so its largest component is +-127, as int8: cosine needs no scale back."""
    peak = np.abs(vectors).max(axis=1, keepdims=True)
    return np.rint(vectors * (127.0 / np.where(peak > 0, peak, 1.0))).astype(np.int8)
