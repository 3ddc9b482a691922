"""What scopes and filters test, per unit, in numpy arrays: admission without SQL.

Every recall checks its candidates against the viewer's scope and the caller's filter. In
SQL that is a query per signal that reads each candidate's row, and a selective filter has
to list the units it admits through two indexes: at 1M units one tag meant ~75k index
probes, most of a filtered recall's 200 ms (bench/recall_latency.py). Here the same test is
a few array lookups over the candidates, and listing a filter's units starts from the
smallest tag's row ids.

Like :class:`forge.store.keywords.KeywordIndex` this is a cache fed by the file's
``unit_log`` (row ids of units inserted, deleted, or changed in a column kept here), never
the source of truth; inside a write transaction, and until it is built, SQL answers.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from forge.model import Status, Viewer
from forge.store.base import Filter

__all__ = ["COLUMNS", "Facts", "member"]

#: The units columns kept here, in the order rows are given (after the row id).
COLUMNS = ("kind", "status", "scope", "owner", "domain", "task", "role", "tags", "created_at", "id")
_CODED = COLUMNS[:7]  # strings held as small integer codes
#: Unit ids up to this many ASCII bytes are held in one fixed-width array (generated ids
#: have 20), longer or non-ASCII ones in a dict: searches name their hits without asking
#: SQL to map row ids to ids (~15% of a hybrid recall at 100k units with 130 candidates).
ID_BYTES = 24
MERGE_MIN_ROWS = 20_000  # tags added since the last seal are re-sorted into arrays past this
_ALL_STATUS = len(Status)


class Facts:
    """Per-row-id columns for scope and filter tests; tags as sorted row-id arrays per tag."""

    def __init__(self) -> None:
        self.seq = 0
        self._lock = threading.RLock()  # catch-up writes while requests read
        self._codes: dict[str, dict[str, int]] = {c: {} for c in _CODED}
        self._cols = {c: np.zeros(0, dtype=np.int32) for c in _CODED}
        self._created = np.zeros(0, dtype=np.float64)
        self._present = np.zeros(0, dtype=bool)
        self._ids = np.zeros(0, dtype=f"S{ID_BYTES}")
        self._long_ids: dict[int, str] = {}  # row id -> an id that does not fit _ids
        self._tag_codes: dict[str, int] = {}
        self._sealed: dict[int, np.ndarray] = {}  # tag -> sorted row ids, as of the last seal
        self._in_sealed = np.zeros(0, dtype=bool)  # row id -> its sealed tag entries still count
        self._added: dict[int, set[int]] = {}  # tag -> row ids given it since the last seal
        self._row_tags: dict[int, tuple[int, ...]] = {}  # row id -> its tags, for rows since the seal
        self._n = 0
        self._version = 0  # bumped by every change: what the last admitted() answer was for
        self._last: tuple[Any, np.ndarray] | None = None

    def __len__(self) -> int:
        return self._n

    # -- writing ----------------------------------------------------------------------------
    def load_rows(self, page: Sequence[tuple[Any, ...]]) -> None:
        """Fill a new instance, a page at a time: rows ``(rowid, *COLUMNS but tags)``; then
        :meth:`load_tags`. Column by column, with one C-level lookup per value: ~10x faster
        than :meth:`apply` row by row, which matters beside the first recalls after open.
        """
        with self._lock:
            if self._sealed or self._added:
                raise ValueError("load_rows() fills a new instance; use apply() for changes")
            if page:
                rowids = np.fromiter((r[0] for r in page), dtype=np.int64, count=len(page))
                self._grow(int(rowids.max()))
                for i, column in enumerate(_CODED, 1):
                    values = [r[i] or "" for r in page]
                    codes = self._codes[column]
                    for v in set(values).difference(codes):
                        codes[v] = len(codes) + 1
                    self._cols[column][rowids] = np.fromiter(map(codes.__getitem__, values), dtype=np.int32, count=len(page))
                self._created[rowids] = np.fromiter((r[8] for r in page), dtype=np.float64, count=len(page))
                for r in page:
                    self._set_id(r[0], r[9])
                self._present[rowids] = True
                self._n += len(page)

    def load_tags(self, tags: Iterable[tuple[str, int]], *, seq: int) -> None:
        """Finish a load: ``(tag, rowid)`` pairs sorted by tag then row id (``unit_tags`` order)."""
        with self._lock:
            by_tag: dict[int, list[int]] = {}
            for tag, rowid in tags:
                by_tag.setdefault(self._tag_codes.setdefault(tag, len(self._tag_codes)), []).append(rowid)
            self._sealed = {t: np.array(rows, dtype=np.int64) for t, rows in by_tag.items()}
            self._in_sealed = self._present.copy()
            self.seq = max(self.seq, seq)

    def apply(self, rows: Iterable[tuple[int, Sequence[Any] | None]], *, seq: int) -> None:
        """Set each row's columns (``COLUMNS`` order); None removes the row."""
        with self._lock:
            self._version += 1
            for rowid, values in rows:
                self._drop(rowid)
                if values is not None:
                    self._set(rowid, values)
            self.seq = max(self.seq, seq)
            if len(self._row_tags) >= max(MERGE_MIN_ROWS, self._n // 4):
                self._seal()

    def _grow(self, rowid: int) -> None:
        if rowid < len(self._present):
            return
        size = max(rowid + 1, 2 * len(self._present), 1024)

        def grown(a: np.ndarray) -> np.ndarray:
            out = np.zeros(size, dtype=a.dtype)
            out[: len(a)] = a
            return out

        self._cols = {c: grown(a) for c, a in self._cols.items()}
        self._created, self._present, self._in_sealed = grown(self._created), grown(self._present), grown(self._in_sealed)
        self._ids = grown(self._ids)

    def _code(self, column: str, value: str) -> int:
        codes = self._codes[column]
        return codes.setdefault(value, len(codes) + 1)  # 0: no row

    def _set(self, rowid: int, values: Sequence[Any]) -> None:
        self._grow(rowid)
        for column, value in zip(_CODED, values, strict=False):
            self._cols[column][rowid] = self._code(column, value or "")
        tags = values[7]
        names = json.loads(tags) if isinstance(tags, str) else list(tags or ())
        codes = tuple({self._tag_codes.setdefault(t, len(self._tag_codes)) for t in names})
        for t in codes:
            self._added.setdefault(t, set()).add(rowid)
        self._row_tags[rowid] = codes
        self._created[rowid] = float(values[8])
        self._set_id(rowid, values[9])
        self._present[rowid] = True
        self._n += 1

    def _set_id(self, rowid: int, uid: str) -> None:
        raw = uid.encode("utf-8")
        if len(raw) <= ID_BYTES and raw.isascii() and not raw.endswith(b"\0"):
            self._ids[rowid] = raw
            self._long_ids.pop(rowid, None)
        else:
            self._ids[rowid] = b""
            self._long_ids[rowid] = uid

    def _drop(self, rowid: int) -> None:
        if rowid >= len(self._present) or not self._present[rowid]:
            return
        self._present[rowid] = False
        self._in_sealed[rowid] = False
        for t in self._row_tags.pop(rowid, ()):
            self._added[t].discard(rowid)
        for column in _CODED:
            self._cols[column][rowid] = 0
        self._ids[rowid] = b""
        self._long_ids.pop(rowid, None)
        self._n -= 1

    def _seal(self) -> None:
        tags = set(self._sealed) | set(self._added)
        self._sealed = {t: self.tag_rows(t) for t in tags}
        self._in_sealed = self._present.copy()
        self._added, self._row_tags = {}, {}

    # -- reading ----------------------------------------------------------------------------
    def ids(self, rowids: Sequence[int]) -> list[str | None]:
        """The unit id of each row id, None for a row this mirror does not hold."""
        with self._lock:
            out: list[str | None] = []
            n = len(self._present)
            for r in rowids:
                if not 0 <= r < n or not self._present[r]:
                    out.append(None)
                else:
                    raw = self._ids[r]
                    out.append(raw.decode("ascii") if raw else self._long_ids.get(r))
            return out

    def tag_rows(self, tag: int) -> np.ndarray:
        """Sorted row ids of the units with tag code ``tag``."""
        rows = self._sealed.get(tag)
        if rows is not None and len(rows):
            rows = rows[self._in_sealed[rows]]
        added = self._added.get(tag)
        if added:
            extra = np.sort(np.fromiter(added, dtype=np.int64, count=len(added)))
            # merged into the sorted rows, not re-sorted with them: the few added since the
            # last seal cost O(n) instead of a sort of every row with the tag on each filter
            rows = extra if rows is None or not len(rows) else np.insert(rows, np.searchsorted(rows, extra), extra)
        return rows if rows is not None else np.zeros(0, dtype=np.int64)

    def _tags(self, names: Iterable[str]) -> list[np.ndarray]:
        return [self.tag_rows(self._tag_codes[t]) if t in self._tag_codes else np.zeros(0, dtype=np.int64)
                for t in sorted(names)]

    def _in(self, column: str, rows: np.ndarray, values: Iterable[str]) -> np.ndarray:
        codes = self._codes[column]
        wanted = np.zeros(len(codes) + 1, dtype=bool)  # a lookup table by code: no sorting, no hashing
        wanted[[codes[v] for v in values if v in codes]] = True
        out: np.ndarray = wanted[self._cols[column][rows]]
        return out

    def admits(self, rowids: Sequence[int] | np.ndarray, viewer: Viewer, f: Filter) -> np.ndarray:
        """Which of ``rowids`` the viewer may see and the filter admits: SQL's ``_where``, in arrays."""
        with self._lock:
            return self._admits(np.asarray(rowids, dtype=np.int64), viewer, f)

    def _admits(self, rows: np.ndarray, viewer: Viewer, f: Filter, skip: np.ndarray | None = None,
                tags_all: list[np.ndarray] | None = None) -> np.ndarray:
        ok = (rows >= 0) & (rows < len(self._present))
        rows = np.where(ok, rows, 0)
        ok &= self._present[rows]
        if not viewer.operator:
            visible = self._in("scope", rows, ["global"])
            agent = self._codes["owner"].get(viewer.agent or "\x00")
            if agent is not None:
                visible |= self._in("scope", rows, ["private"]) & (self._cols["owner"][rows] == agent)
            if viewer.groups:
                visible |= self._in("scope", rows, [f"group:{g}" for g in viewer.groups])
            ok &= visible
        if f.status and len(f.status) < _ALL_STATUS:
            ok &= self._in("status", rows, [s.value for s in f.status])
        if f.kinds:
            ok &= self._in("kind", rows, [k.value for k in f.kinds])
        for column in ("domain", "task", "role", "owner"):
            value = getattr(f, column)
            if value is not None:
                ok &= self._in(column, rows, [value])
        if f.scopes:
            ok &= self._in("scope", rows, f.scopes)
        for tagged in self._tags(f.tags_all) if tags_all is None else tags_all:
            if tagged is not skip:
                ok &= member(rows, tagged)
        if f.tags_any:
            ok &= member(rows, np.unique(np.concatenate(self._tags(f.tags_any))))
        if f.since is not None:
            ok &= self._created[rows] >= f.since
        if f.until is not None:
            ok &= self._created[rows] < f.until
        return ok

    def listing_cost(self, viewer: Viewer, f: Filter) -> int | None:
        """How many rows :meth:`admitted` would test: 0 when its answer is kept, the rarest
        ``tags_all`` tag's units, or None when it would test every unit. Lets a search list a
        selective filter's units first instead of probing the ANN index for them."""
        with self._lock:
            if self._kept(viewer, f) is not None:
                return 0
            if not f.tags_all:
                return None
            codes = [self._tag_codes.get(t) for t in f.tags_all]
            # at most: rows sealed under the tag (some since removed) and rows added since
            return min(0 if c is None else len(self._sealed.get(c, ())) + len(self._added.get(c, ())) for c in codes)

    def admitted(self, viewer: Viewer, f: Filter) -> np.ndarray:
        """Row ids of every unit the viewer may see and the filter admits, ascending.

        The last answer is kept until anything changes: a recall asks for it twice (vector
        and keyword search), and an agent tends to recall with the same filter.
        """
        with self._lock:
            kept = self._kept(viewer, f)
            if kept is not None:
                return kept
            tagged = self._tags(f.tags_all)
            if tagged:  # start from the rarest tag's units; no need to test them for it
                base = skip = min(tagged, key=len)
            elif f.tags_any:
                base, skip = np.unique(np.concatenate(self._tags(f.tags_any))), None
            else:
                base, skip = np.flatnonzero(self._present), None
            out: np.ndarray = base[self._admits(base, viewer, f, skip, tagged)]
            out.flags.writeable = False  # shared by the callers that get it from the cache
            self._last = ((viewer, f, self._version), out)
            return out

    def _kept(self, viewer: Viewer, f: Filter) -> np.ndarray | None:
        """The last :meth:`admitted` answer, if it was for this viewer and filter and nothing changed since."""
        last = self._last
        return last[1] if last is not None and last[0] == (viewer, f, self._version) else None


def member(rows: np.ndarray, sorted_rows: np.ndarray) -> np.ndarray:
    """Which of ``rows`` are in ``sorted_rows`` (ascending): a binary search each, where
    ``np.isin`` hashed or sorted both arrays (7 ms per call at 75k rows)."""
    if not len(sorted_rows):
        return np.zeros(len(rows), dtype=bool)
    at = np.minimum(np.searchsorted(sorted_rows, rows), len(sorted_rows) - 1)
    found: np.ndarray = sorted_rows[at] == rows
    return found
