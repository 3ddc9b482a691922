"""Keyword (BM25) search held in memory: posting arrays beside the vector index.

FTS5 finds and ranks a query's matches one row at a time through SQLite's virtual-table
interface; at 100k units that was ~60% of a ``forge serve`` process's CPU per recall
(bench/service.py under py-spy) and the whole tail of filtered recall at 1M. This index
keeps FTS5's BM25 (k1 1.2, b 0.75, its idf) over numpy arrays, so a query's matches are
scored in a handful of vectorised operations, and a filter is applied to candidates in
score order, not to every match.

Like :mod:`forge.store.vectors` it is a cache derived from the database, never the
source of truth. Triggers on ``units`` append the row id of every inserted, re-texted,
re-filed or deleted unit to ``unit_log`` (an AUTOINCREMENT sequence, so committed entries
only grow; :mod:`forge.store.facts` is fed from the same log);
the index remembers the last entry it applied and replays the ones after it, in any
process. Re-indexing a unit is idempotent, so reading the log before the texts is safe.

Layout: a sealed segment (term-sorted CSR arrays: row ids and term frequencies) plus a
small buffer of recent documents in dicts; the buffer is merged into a new sealed segment
when it grows past a quarter of it, so building costs O(n log n) overall. A unit whose text
changes gets its sealed postings masked as stale and its new ones buffered.

Why not a library: bm25s (sparse matrices) and rank-bm25 build static indexes that must be
rebuilt on every write; tantivy is a second durable store to keep transactionally in step
with the SQLite file across processes. Stemming uses PyStemmer (Snowball's C Porter
stemmer, the algorithm FTS5's ``porter`` tokenizer implements).
"""

from __future__ import annotations

import math
import re
import sqlite3
import threading
from collections.abc import Iterable, Sequence
from itertools import chain
from typing import Any

import numpy as np

from forge.store.common import STOPWORDS

__all__ = ["KeywordIndex", "stem", "tokens"]

K1 = 1.2  # FTS5's bm25() constants
B = 0.75
MERGE_MIN_DOCS = 20_000  # the buffer is sealed when it holds this many documents...
MERGE_SHARE = 0.25  # ... and at least this share of the sealed segment's
_ASCII_TOKEN = re.compile(r"[a-z0-9]+")  # unicode61 on ASCII: letters and digits; the rest separates
PORTER_MIN_BYTES, PORTER_MAX_BYTES = 3, 64  # FTS5's porter tokenizer passes other tokens through unstemmed

# What unicode61 makes of each non-ASCII character, asked of SQLite itself once per character:
# " " where it separates tokens, else its folded form (lower case, Latin diacritics removed,
# possibly ""). The tokenizer works one code point at a time, so this map is exact, and it
# follows the linked SQLite's Unicode tables rather than Python's (they differ: "İ", "ǅ").
_CHARS: dict[str, str] = {}
_CHARS_LOCK = threading.Lock()
_probe: sqlite3.Connection | None = None


def _ask_fts5(table: str, text: str) -> list[str]:
    """The terms SQLite's FTS5 stores for ``text`` in a scratch table (``p``: unicode61,
    ``s``: porter unicode61). Caller holds _CHARS_LOCK."""
    global _probe
    if _probe is None:
        _probe = sqlite3.connect(":memory:", check_same_thread=False)
        for name, tokenizer in (("p", "unicode61"), ("s", "porter unicode61")):
            _probe.execute(f"CREATE VIRTUAL TABLE {name} USING fts5(x, tokenize='{tokenizer}')")
            _probe.execute(f"CREATE VIRTUAL TABLE {name}v USING fts5vocab({name}, 'instance')")
    _probe.execute(f"DELETE FROM {table}")
    _probe.execute(f"INSERT INTO {table}(rowid, x) VALUES (1, ?)", (text,))
    return [r[0] for r in _probe.execute(f"SELECT term FROM {table}v ORDER BY offset")]


def _unicode61(c: str) -> str:
    with _CHARS_LOCK:
        if c not in _CHARS:
            terms = _ask_fts5("p", f"a{c}b")
            _CHARS[c] = terms[0][1:-1] if len(terms) == 1 else " "
        return _CHARS[c]


def tokens(text: str) -> list[str]:
    """The tokens FTS5's ``unicode61`` tokenizer makes of ``text``, before stemming."""
    if text.isascii():
        return _ASCII_TOKEN.findall(text.lower())
    chars = _CHARS
    return "".join(
        (c.lower() if c.isalnum() else " ") if c.isascii() else (chars[c] if c in chars else _unicode61(c)) for c in text
    ).split()


_STEMMER_LOCK = threading.Lock()  # a PyStemmer object is not safe to share between threads
_stemmer: Any = None


def stem(token: str) -> str:
    """A token's Porter stem: the term FTS5's ``porter`` tokenizer stores for it.

    ASCII tokens go to PyStemmer (the same algorithm, in C). FTS5's stemmer works on UTF-8
    bytes, so a multi-byte letter counts as several consonants and stems of non-ASCII
    tokens can differ: those are asked of SQLite (callers cache the answer per token)."""
    global _stemmer
    if not PORTER_MIN_BYTES <= len(token.encode()) <= PORTER_MAX_BYTES:
        return token
    if not token.isascii():
        with _CHARS_LOCK:
            terms = _ask_fts5("s", token)
        return terms[0] if len(terms) == 1 else token
    with _STEMMER_LOCK:
        if _stemmer is None:
            import Stemmer  # PyStemmer

            _stemmer = Stemmer.Stemmer("porter")
        stem: str = _stemmer.stemWord(token)
        return stem


class KeywordIndex:
    """BM25 over unit texts keyed by row id, with the log position it has caught up to."""

    def __init__(self) -> None:
        self.seq = 0  # the last unit_log entry applied
        self._lock = threading.Lock()
        self._terms: dict[str, int] = {}  # stem -> term id
        self._word: dict[str, int] = {}  # folded token -> term id, or -1 for words never searched
        # sealed segment: postings of term t are [_offsets[t], _offsets[t + 1])
        self._offsets = np.zeros(1, dtype=np.int64)
        self._docs = np.zeros(0, dtype=np.int32)
        self._tfs = np.zeros(0, dtype=np.float32)
        self._sealed_n = 0
        self._stale = np.zeros(0, dtype=bool)  # row id -> its sealed postings no longer count
        self._n_stale = 0
        # buffer: term id -> {row id: tf}, and each buffered document's terms
        self._buf: dict[int, dict[int, int]] = {}
        self._buf_terms: dict[int, list[int]] = {}
        self._in_sealed = np.zeros(0, dtype=bool)  # row id -> has live sealed postings
        self._length = np.zeros(0, dtype=np.float32)  # row id -> tokens in its text
        self._present = np.zeros(0, dtype=bool)  # row id -> indexed (a text may have no tokens)
        self._n = 0
        self._total = 0.0

    def __len__(self) -> int:
        return self._n

    # -- writing ----------------------------------------------------------------------------
    def load(self, pages: Iterable[Sequence[tuple[int, str]]], *, seq: int) -> None:
        """Index every unit of an empty index at once: one vectorised pass and one seal.

        Building 100k units this way is several times faster than :meth:`apply`, which
        keeps per-term dicts so that single writes stay cheap.
        """
        with self._lock:
            if self._n:
                raise ValueError("load() fills an empty index; use apply() for changes")
            terms, docs, tfs = [], [], []
            for page in pages:
                if not page:
                    continue
                rowids = np.fromiter((r for r, _ in page), dtype=np.int64, count=len(page))
                if rowids.min() < 0 or rowids.max() >= 2**31:
                    raise ValueError("row ids must fit in 31 bits")
                toks = [tokens(text) for _, text in page]
                flat = list(chain.from_iterable(toks))
                for w in set(flat).difference(self._word):
                    self._word[w] = self._term(w)
                ids = np.fromiter(map(self._word.__getitem__, flat), dtype=np.int64, count=len(flat))
                lengths = np.fromiter(map(len, toks), dtype=np.int64, count=len(toks))
                owner = np.repeat(rowids, lengths)
                searchable = ids >= 0
                key, tf = np.unique((ids[searchable] << 32) | owner[searchable], return_counts=True)
                terms.append(key >> 32)
                docs.append((key & 0xFFFFFFFF).astype(np.int32))
                tfs.append(tf.astype(np.float32))
                self._grow(int(rowids.max()))
                self._length[rowids] = lengths
                self._present[rowids] = True
                self._n += len(page)
                self._total += float(lengths.sum())
            if terms:
                term = np.concatenate(terms)
                self._install(term, np.concatenate(docs), np.concatenate(tfs))
            self.seq = max(self.seq, seq)

    def apply(self, rows: Iterable[tuple[int, str | None]], *, seq: int) -> None:
        """Index (or re-index) each ``(rowid, text)``; ``text`` None removes the unit."""
        with self._lock:
            for rowid, text in rows:
                self._remove(rowid)
                if text is not None:
                    self._add(rowid, text)
            self.seq = max(self.seq, seq)
            if len(self._buf_terms) >= max(MERGE_MIN_DOCS, MERGE_SHARE * self._sealed_n):
                self._seal()

    def _grow(self, rowid: int) -> None:
        if rowid >= len(self._length):
            size = max(rowid + 1, 2 * len(self._length), 1024)
            for name in ("_length", "_present", "_stale", "_in_sealed"):
                old = getattr(self, name)
                new = np.zeros(size, dtype=old.dtype)
                new[: len(old)] = old
                setattr(self, name, new)

    def _ids(self, text: str) -> tuple[int, list[int]]:
        """A text's token count and the term ids of its searchable words."""
        toks = tokens(text)
        word = self._word
        ids = []
        for w in toks:
            t = word.get(w)
            if t is None:
                t = word[w] = self._term(w)
            if t >= 0:
                ids.append(t)
        return len(toks), ids

    def _term(self, w: str) -> int:
        if len(w) <= 1 or w in STOPWORDS:  # query_words never asks for these
            return -1
        return self._terms.setdefault(stem(w), len(self._terms))

    def _add(self, rowid: int, text: str) -> None:
        if rowid < 0 or rowid >= 2**31:
            raise ValueError(f"row id {rowid} out of range")
        self._grow(rowid)
        n_tokens, ids = self._ids(text)
        counts: dict[int, int] = {}
        for t in ids:
            counts[t] = counts.get(t, 0) + 1
        for t, tf in counts.items():
            self._buf.setdefault(t, {})[rowid] = tf
        self._buf_terms[rowid] = list(counts)
        self._length[rowid] = n_tokens
        self._present[rowid] = True
        self._n += 1
        self._total += n_tokens

    def _remove(self, rowid: int) -> None:
        if rowid >= len(self._present) or not self._present[rowid]:
            return
        if self._in_sealed[rowid]:
            self._in_sealed[rowid] = False
            self._stale[rowid] = True
            self._n_stale += 1
        for t in self._buf_terms.pop(rowid, ()):
            self._buf[t].pop(rowid, None)
        self._n -= 1
        self._total -= float(self._length[rowid])
        self._length[rowid] = 0
        self._present[rowid] = False

    def _seal(self) -> None:
        """Merge the buffer and the live sealed postings into one term-sorted segment."""
        terms = [np.repeat(np.arange(len(self._offsets) - 1, dtype=np.int64), np.diff(self._offsets))]
        docs, tfs = [self._docs], [self._tfs]
        if self._n_stale:
            live = ~self._stale[self._docs]
            terms[0], docs[0], tfs[0] = terms[0][live], docs[0][live], tfs[0][live]
        for t, postings in self._buf.items():
            if postings:
                terms.append(np.full(len(postings), t, dtype=np.int64))
                docs.append(np.fromiter(postings.keys(), dtype=np.int32, count=len(postings)))
                tfs.append(np.fromiter(postings.values(), dtype=np.float32, count=len(postings)))
        self._install(np.concatenate(terms), np.concatenate(docs), np.concatenate(tfs))

    def _install(self, term: np.ndarray, doc: np.ndarray, tf: np.ndarray) -> None:
        """Make these postings the sealed segment (sorted here) and empty the buffer."""
        order = np.argsort((term.astype(np.int64) << 32) | doc.astype(np.int64))
        self._docs, self._tfs = doc[order], tf[order]
        counts = np.bincount(term, minlength=len(self._terms))
        self._offsets = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        self._in_sealed[:] = False
        self._in_sealed[self._docs] = True
        self._stale[:] = False
        self._n_stale = 0
        self._buf, self._buf_terms = {}, {}
        self._sealed_n = self._n

    # -- searching --------------------------------------------------------------------------
    def term_ids(self, words: Sequence[str]) -> list[int]:
        """The known term ids of query words (already lower-cased content words), deduplicated."""
        with self._lock:
            out = []
            for w in words:
                for token in tokens(w):
                    t = self._terms.get(stem(token)) if len(token) > 1 and token not in STOPWORDS else None
                    if t is not None and t not in out:
                        out.append(t)
            return out

    def score(self, words: Sequence[str], *, common_share: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Every unit matching any of ``words``, as (row ids, BM25 scores), unordered.

        ``common_share`` drops terms found in more than that share of units (keeping the
        rarest if all are): they match most units and weigh almost nothing. Scores are
        computed in float64 from exact document frequencies, as FTS5's bm25() does, so
        the two rank alike (ties by row id) whichever answers.
        """
        terms = self.term_ids(words)
        with self._lock:
            n = self._n
            if not terms or n == 0:
                return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float64)
            postings = {t: self._postings(t) for t in terms}
            df = {t: len(postings[t][0]) for t in terms}
            if common_share is not None and n >= 1000 and len(terms) > 1:
                terms = [t for t in terms if df[t] <= common_share * n] or [min(terms, key=df.__getitem__)]
            avgdl = self._total / n or 1.0  # FTS5's average length over all rows, empty ones included
            docs, parts = [], []
            for t in terms:
                d, tf = postings[t]
                if not len(d):
                    continue
                idf = max(math.log((n - df[t] + 0.5) / (df[t] + 0.5)), 1e-6)
                tf = tf.astype(np.float64)
                norm = K1 * (1.0 - B + B * self._length[d].astype(np.float64) / avgdl)
                docs.append(d)
                parts.append(idf * tf * (K1 + 1.0) / (tf + norm))
        if not docs:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float64)
        if len(docs) == 1:
            return docs[0], parts[0]
        doc, part = np.concatenate(docs), np.concatenate(parts)
        if len(doc) * 16 < len(self._length):
            uniq, inverse = np.unique(doc, return_inverse=True)
            return uniq.astype(np.int32), np.bincount(inverse, weights=part)
        acc = np.bincount(doc, weights=part)
        hit = np.flatnonzero(acc).astype(np.int32)
        return hit, acc[hit]

    def _postings(self, t: int) -> tuple[np.ndarray, np.ndarray]:
        parts_d, parts_tf = [], []
        if t + 1 < len(self._offsets):
            lo, hi = self._offsets[t], self._offsets[t + 1]
            d, tf = self._docs[lo:hi], self._tfs[lo:hi]
            if self._n_stale and len(d):
                live = ~self._stale[d]
                d, tf = d[live], tf[live]
            parts_d.append(d)
            parts_tf.append(tf)
        buffered = self._buf.get(t)
        if buffered:
            parts_d.append(np.fromiter(buffered.keys(), dtype=np.int32, count=len(buffered)))
            parts_tf.append(np.fromiter(buffered.values(), dtype=np.float32, count=len(buffered)))
        if not parts_d:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
        if len(parts_d) == 1:
            return parts_d[0], parts_tf[0]
        return np.concatenate(parts_d), np.concatenate(parts_tf)


def top(rowids: np.ndarray, scores: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``n`` best (row id, score) pairs, best first; ties by row id, at the cut too."""
    if n < len(scores):
        cut = -np.partition(-scores, n - 1)[n - 1]  # the n-th best score
        above = np.flatnonzero(scores > cut)
        tied = np.flatnonzero(scores == cut)
        tied = tied[np.argsort(rowids[tied], kind="stable")[: n - len(above)]]
        keep = np.concatenate((above, tied))
        rowids, scores = rowids[keep], scores[keep]
    order = np.lexsort((rowids, -scores))
    return rowids[order], scores[order]
