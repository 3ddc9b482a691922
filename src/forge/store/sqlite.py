"""The embedded store: one SQLite file (WAL) is the source of truth.

Units, relations, episodes and an append-only event log live in one file. Keyword search
ranks with BM25 in memory (:mod:`forge.store.keywords`, caught up from the file's
``unit_log``), falling back to the file's FTS5 index while that is being built and inside
a write transaction; a usearch index next to the file (``<db>.usearch``) gives vector
search and is rebuilt from the file when missing or behind (see :mod:`forge.store.vectors`).
Every public write is one transaction, so bad input never leaves half-written state.
What reads and writes the same on PostgreSQL (reads, the event log, export, import) is
:mod:`forge.store.sql`'s; this module holds SQLite's dialect and its own indexes.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from forge.errors import ConfigError, NotFoundError, StoreError
from forge.model import Status, Unit, Viewer  # noqa: F401  (Status: kept importable from here, tests use it)
from forge.store.base import Filter, Hit
from forge.store.common import count_arg as _count_arg
from forge.store.common import query_words
from forge.store.erase import erase_rows
from forge.store.facts import COLUMNS as FACT_COLUMNS
from forge.store.facts import Facts, member
from forge.store.keywords import KeywordIndex, stem, tokens, top
from forge.store.sql import COLUMNS as _COLUMNS
from forge.store.sql import Dialect, Duplicate, EventRow, SQLStore
from forge.store.vectors import VectorIndex

__all__ = ["SQLiteStore"]

APPLICATION_ID = 0x464F5247  # "FORG": marks a file as ours, so a foreign database is refused
SCHEMA_VERSION = 1
# The backend's own bookkeeping in the meta table: not settings, never exported or set by callers.
_INTERNAL_KEYS = frozenset({"schema_version", "vseq", "vgen", "dim", "db_id"})
EXACT_SEARCH_LIMIT = 20_000  # below this many filtered candidates, exact search is cheaper
# A filter whose rarest tag has at most this many units is listed before the vectors are
# searched (facts.Facts.listing_cost): a few ms of array work at 1M units, against an ANN
# probe that a selective filter leaves empty and then lists it anyway.
LIST_FIRST_MAX = 200_000
COMMON_TERM_SHARE = 0.10  # keyword search skips words in more than this share of units (IDF ~ 2)
MIRROR_PAGE = 10_000  # rows read per query while the in-memory mirror is built ...
MIRROR_STEP = 250  # ... and indexed between pauses
KEYWORD_WIDEN_MAX = 4096  # past this many best matches checked, a filter's admitted units are listed instead
# Before its first write a store checks the file's pages (PRAGMA quick_check) when the file is
# at most this big (~0.1 s per 100 MB): a database with corrupt pages refuses writes as it
# refuses reads. Corruption met by any later query also stops writes.
QUICK_CHECK_MAX_BYTES = 256 * 1024 * 1024
TOUCH_DELAY_S = 1.0  # recall's access statistics are written at most this late, in one transaction
TOUCH_MAX_PENDING = 10_000  # ... or at once when this many units wait

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS units (
    rowid INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    content TEXT NOT NULL,
    search_text TEXT NOT NULL,
    domain TEXT NOT NULL DEFAULT '',
    task TEXT NOT NULL DEFAULT '',
    role TEXT NOT NULL DEFAULT '',
    tags TEXT NOT NULL DEFAULT '[]',
    scope TEXT NOT NULL,
    owner TEXT NOT NULL DEFAULT '',
    confidence REAL NOT NULL,
    validation REAL NOT NULL,
    importance REAL NOT NULL,
    access_count INTEGER NOT NULL DEFAULT 0,
    last_access REAL,
    created_at REAL NOT NULL,
    updated_at REAL NOT NULL,
    provenance TEXT NOT NULL DEFAULT '{}',
    status TEXT NOT NULL,
    meta TEXT NOT NULL DEFAULT '{}',
    vector BLOB,
    vseq INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX IF NOT EXISTS units_kind ON units(kind, status);
CREATE INDEX IF NOT EXISTS units_scope ON units(scope, owner);
CREATE INDEX IF NOT EXISTS units_created ON units(created_at);
CREATE INDEX IF NOT EXISTS units_vseq ON units(vseq);
CREATE TABLE IF NOT EXISTS unit_tags (unit_rowid INTEGER NOT NULL, tag TEXT NOT NULL,
    PRIMARY KEY (tag, unit_rowid)) WITHOUT ROWID;
CREATE VIRTUAL TABLE IF NOT EXISTS units_fts USING fts5(
    search_text, content='units', content_rowid='rowid', tokenize='porter unicode61');
CREATE TRIGGER IF NOT EXISTS units_ai AFTER INSERT ON units BEGIN
    INSERT INTO units_fts(rowid, search_text) VALUES (new.rowid, new.search_text);
END;
CREATE TRIGGER IF NOT EXISTS units_ad AFTER DELETE ON units BEGIN
    INSERT INTO units_fts(units_fts, rowid, search_text) VALUES ('delete', old.rowid, old.search_text);
END;
CREATE TRIGGER IF NOT EXISTS units_au AFTER UPDATE OF search_text ON units BEGIN
    INSERT INTO units_fts(units_fts, rowid, search_text) VALUES ('delete', old.rowid, old.search_text);
    INSERT INTO units_fts(rowid, search_text) VALUES (new.rowid, new.search_text);
END;
CREATE TABLE IF NOT EXISTS relations (
    src TEXT NOT NULL REFERENCES units(id),
    dst TEXT NOT NULL REFERENCES units(id),
    type TEXT NOT NULL,
    weight REAL NOT NULL DEFAULT 1.0,
    created_at REAL NOT NULL,
    note TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (src, dst, type)
);
CREATE INDEX IF NOT EXISTS relations_dst ON relations(dst);
CREATE TABLE IF NOT EXISTS episodes (
    id TEXT PRIMARY KEY,
    agent TEXT NOT NULL DEFAULT '',
    task TEXT NOT NULL DEFAULT '',
    env TEXT NOT NULL DEFAULT '',
    created_at REAL NOT NULL,
    body TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ts REAL NOT NULL,
    op TEXT NOT NULL,
    unit_id TEXT,
    actor TEXT NOT NULL DEFAULT '',
    data TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_unit ON events(unit_id);
CREATE INDEX IF NOT EXISTS events_actor ON events(actor, seq);
CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, at REAL NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS event_units (unit_id TEXT NOT NULL, seq INTEGER NOT NULL, PRIMARY KEY (unit_id, seq)) WITHOUT ROWID;
""" + """
CREATE TABLE IF NOT EXISTS unit_log (seq INTEGER PRIMARY KEY AUTOINCREMENT, unit_rowid INTEGER NOT NULL);
CREATE TRIGGER IF NOT EXISTS units_log_ai AFTER INSERT ON units BEGIN
    INSERT INTO unit_log(unit_rowid) VALUES (new.rowid);
END;
CREATE TRIGGER IF NOT EXISTS units_log_ad AFTER DELETE ON units BEGIN
    INSERT INTO unit_log(unit_rowid) VALUES (old.rowid);
END;
CREATE TRIGGER IF NOT EXISTS units_log_au
AFTER UPDATE OF search_text, kind, status, scope, owner, domain, task, role, tags, created_at ON units BEGIN
    INSERT INTO unit_log(unit_rowid) VALUES (new.rowid);
END;
"""
#: Which units each recall or context event returned (SQLStore.append_events): the trace of a
#: unit reads its recalls here instead of decoding every recall event (up to 100k per page).
_EVENT_UNITS = _SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS event_units"):].split(";")[0]
#: ... and for a file made before it, filled once from the recalls already logged.
_EVENT_UNITS_FILL = (
    "INSERT OR IGNORE INTO event_units SELECT x.id, x.seq FROM (SELECT e.seq, "
    "CASE WHEN h.type = 'object' AND json_type(h.value, '$.id') = 'text' THEN json_extract(h.value, '$.id') END AS id "
    "FROM (SELECT seq, data FROM events WHERE op IN ('recall', 'context') AND json_valid(data) "
    "AND json_type(data, '$.hits') = 'array') e, json_each(e.data, '$.hits') h) x WHERE x.id IS NOT NULL"
)
#: The change feed of the in-memory mirror (forge.store.keywords, forge.store.facts); files
#: made before it get it on open, and their units are read once when the mirror is built.
_UNIT_LOG = _SCHEMA[_SCHEMA.index("CREATE TABLE IF NOT EXISTS unit_log"):]
_MIRROR_COLUMNS = "rowid, search_text, " + ", ".join(FACT_COLUMNS)

#: The vector rows the index has not seen, paged by (vseq, rowid): the order of the units_vseq
#: index. Paged by rowid, SQLite walked the whole table by rowid instead (~12 ms at 8k units),
#: after every write once the index was loaded.
_CATCH_UP_SQL = (
    "SELECT rowid, vector, vseq FROM units WHERE vseq > ? AND vseq <= ? AND vector IS NOT NULL "
    "AND (vseq, rowid) > (?, ?) ORDER BY vseq, rowid LIMIT 20000"
)


#: Per-connection view of FTS5's term statistics (nothing is written to the file): lets
#: keyword search skip words that occur in a large share of all units. Every connection makes it.
_VOCAB_VIEW = "CREATE VIRTUAL TABLE IF NOT EXISTS temp.units_vocab USING fts5vocab(main, units_fts, 'row')"



class _SQLite(Dialect):
    """SQLite's spelling: ``?`` marks, IN lists, tags as JSON text and in ``unit_tags``."""

    # Unary + keeps the planner off units_scope in the visibility clause: its OR would
    # otherwise become a MULTI-INDEX OR that walks every global unit (O(n) per query,
    # bench/recall_latency.py) instead of checking the few candidate rows found by id,
    # rowid or FTS.
    unindexed = "+"
    nobody = "\x00"

    def tags_all(self, p: str, tags: Sequence[str], kinds: Sequence[str] = ()) -> tuple[str, list[Any]]:
        return " AND ".join([f"{p}rowid IN (SELECT unit_rowid FROM unit_tags WHERE tag = ?)"] * len(tags)), list(tags)

    def tags_any(self, p: str, tags: Sequence[str], kinds: Sequence[str] = ()) -> tuple[str, list[Any]]:
        member, params = self.in_("tag", tags)
        return f"{p}rowid IN (SELECT unit_rowid FROM unit_tags WHERE {member})", params

    def encode_tags(self, tags: list[str]) -> str:
        return json.dumps(tags)

    def decode_tags(self, value: str) -> list[str]:
        tags: list[str] = json.loads(value)
        return tags


SQLITE = _SQLite()
_where = SQLITE.where
_unit_row = SQLITE.unit_row
_row_unit = SQLITE.row_unit


class SQLiteStore(SQLStore):
    """A :class:`~forge.store.base.Store` in one SQLite file (or ``:memory:``)."""

    dialect = SQLITE
    _KEY = "rowid"
    _VECTOR = "vector"
    _SETTINGS = "meta"
    _INTERNAL_KEYS = _INTERNAL_KEYS

    def __init__(
        self, path: str | Path = ":memory:", *, create: bool = True, readonly: bool | None = None, concurrent_reads: bool = True,
        keyword_index: bool = True,
    ) -> None:
        """``concurrent_reads=False`` sends every read through the writer's one connection,
        as before reads had their own; ``keyword_index=False`` ranks keyword search with
        FTS5 alone, as before the in-memory index (both kept to measure the difference)."""
        self.path = str(path)
        self._file = None if self.path == ":memory:" else Path(self.path)
        self._lock = threading.RLock()
        self._index: VectorIndex | None = None
        self._depth = 0  # transaction nesting: 0 = none, 1 = outermost, >1 = savepoints
        self._tx_vseq: int | None = None  # the vector counter before this transaction's first bump
        self._after_commit: list[Callable[[], None]] = []
        self._corrupt: str | None = None  # why writes are refused, once corruption was seen
        self._checked = False  # whether the file passed a quick integrity check before writing
        self._index_lock = threading.Lock()
        # The in-memory mirror: BM25 and the filter columns, built on first need or by the
        # warm-up thread, caught up from unit_log before each search.
        self._mirror: tuple[KeywordIndex, Facts] | None = None
        self._keywords_lock = threading.Lock()  # one builder / catch-up at a time
        self._keyword_index = keyword_index
        self._warming: threading.Thread | None = None
        self._closing = threading.Event()  # tells the warm-up thread to stop building the mirror
        self._searched_at = 0.0  # monotonic time of the last search: the warm-up thread yields more then
        self._touches: dict[str, tuple[int, float]] = {}  # unit id -> (recalls, last) not yet written
        self._touch_lock = threading.Lock()  # guards _touches: a recall's touch never waits for a writer
        self._touch_timer: threading.Timer | None = None
        self._tx_owner: int | None = None  # the thread inside the write transaction, if any
        self._readers = threading.local()  # this thread's (connection, lock) for reads
        self._reader_list: list[tuple[sqlite3.Connection, threading.Lock, threading.Thread]] = []
        self._reader_list_lock = threading.Lock()  # not the store lock: a writer holds that
        self._concurrent_reads = False  # set once open: reads then use per-thread connections
        if self._file is not None:
            _check_file(self._file, create=create)
        if readonly is None:  # a file we may not write is opened read-only rather than refused
            readonly = self._file is not None and self._file.exists() and not _writable(self._file)
        if readonly and self._file is None:
            raise StoreError("an in-memory store cannot be read-only")
        self.readonly = bool(readonly)
        try:
            self._open_with_retry()
        except sqlite3.DatabaseError as exc:
            with contextlib.suppress(Exception):
                self._db.close()
            raise StoreError(f"{self.path}: not a usable FORGE database ({exc})") from None
        except BaseException:
            with contextlib.suppress(Exception):
                self._db.close()
            raise
        self._dim = int(self._setting("dim") or 0) or None
        self._keyword_index = keyword_index and bool(self._q("SELECT 1 FROM sqlite_master WHERE name = 'unit_log'"))
        # A file in WAL mode lets readers run beside the writer and each other, each on its
        # own connection: one shared connection made every recall of a server queue on it.
        mode = self._db.execute("PRAGMA journal_mode").fetchone()[0]
        self._concurrent_reads = concurrent_reads and self._file is not None and (mode == "wal" or self.readonly)
        if self._file is not None and (self._dim is not None or self._keyword_index):
            # Load (or catch up) the indexes now, beside the caller, so the first recall after
            # open does not pay for them: vector search waits for its index if it comes
            # first, keyword search uses FTS5 until its index is ready.
            self._warming = threading.Thread(target=self._warm_index, name="forge-index-warm", daemon=True)
            self._warming.start()

    def _open_connection(self) -> None:
        self._db = self._connect()
        self._db.execute("PRAGMA foreign_keys = ON")
        self._db.execute(_VOCAB_VIEW)
        self._init_schema()

    def _open_with_retry(self, patience_s: float = 60.0) -> None:
        """Open and set up the file, retrying while another process holds it.

        Switching a new file to WAL and creating the schema take locks for which SQLite may
        answer "database is locked" at once instead of waiting out the busy timeout (when
        waiting could deadlock), e.g. when several processes create one file together.
        """
        deadline = time.monotonic() + patience_s
        delay = 0.02
        while True:
            try:
                self._open_connection()
                return
            except sqlite3.OperationalError as exc:
                busy = "locked" in str(exc) or "busy" in str(exc)
                with contextlib.suppress(Exception):
                    self._db.close()
                if not busy or time.monotonic() >= deadline:
                    raise
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 0.5)

    def _warm_index(self) -> None:
        with contextlib.suppress(Exception):  # the first search builds it again and reports the error
            self._ensure_index()
        with contextlib.suppress(Exception):  # keyword search falls back to FTS5 meanwhile
            self._ensure_keywords(build=True)
        with contextlib.suppress(Exception):  # filtered exact search codes what it needs meanwhile
            if self._index is not None:
                self._index.fill_copy()
        self._drop_reader()  # this thread ends here: its connection would only wait for close

    def _connect(self) -> sqlite3.Connection:
        if not self.readonly:
            return sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=30)
        uri = f"{Path(self.path).resolve().as_uri()}?mode=ro"
        db = sqlite3.connect(uri, uri=True, check_same_thread=False, isolation_level=None, timeout=30)
        try:
            db.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError:
            # A WAL database in a directory we cannot write has no -shm to share: read it as
            # an immutable snapshot (nobody can be writing it, since nobody here may).
            db.close()
            db = sqlite3.connect(f"{Path(self.path).resolve().as_uri()}?immutable=1", uri=True,
                                 check_same_thread=False, isolation_level=None, timeout=30)
        return db

    # -- set-up ---------------------------------------------------------------------------
    def _owner_check(self) -> int:
        app_id: int = self._db.execute("PRAGMA application_id").fetchone()[0]
        names = {r[0] for r in self._db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        if app_id == 0 and {"meta", "units"} <= names:
            # Our schema without our mark: another process is creating this file right now
            # (seen with several processes opening one new file at once). Wait, then look again.
            raise sqlite3.OperationalError("database is busy: another process is creating it")
        tables = len(names)
        if (app_id == 0 and tables) or app_id not in (0, APPLICATION_ID):
            raise StoreError(f"{self.path}: this SQLite file belongs to another application; refusing to touch it")
        return app_id

    def _init_schema(self) -> None:
        app_id = self._owner_check()
        if self.readonly:
            if app_id == 0:
                raise StoreError(f"{self.path}: an empty file opened read-only is not a FORGE database yet")
        else:
            if self._file is not None:
                self._db.execute("PRAGMA journal_mode = WAL")
            self._db.execute("PRAGMA synchronous = NORMAL")
        if app_id == 0:
            with self._tx(check=False) as db:
                # Checked again under the write lock: several processes may open a new file at
                # once, and only the first may create it (a second must not reset its counters).
                if self._owner_check() == 0:
                    for stmt in _split_sql(_SCHEMA):
                        db.execute(stmt)
                    db.execute(f"PRAGMA application_id = {APPLICATION_ID}")
                    db.execute("INSERT OR IGNORE INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
                    db.execute("INSERT OR IGNORE INTO meta VALUES ('vseq', '0')")
        version = int(self._setting("schema_version") or 0)
        if version != SCHEMA_VERSION:
            raise StoreError(
                f"{self.path}: schema version {version} is not supported (this FORGE reads {SCHEMA_VERSION})"
            )
        if not self.readonly and not self._q("SELECT 1 FROM sqlite_master WHERE name = 'claims'"):
            with self._tx(check=False) as db:  # files made before claims existed
                db.execute("CREATE TABLE IF NOT EXISTS claims (key TEXT PRIMARY KEY, at REAL NOT NULL) WITHOUT ROWID")
        self._event_units = bool(self._q("SELECT 1 FROM sqlite_master WHERE name = 'event_units'"))
        if not self.readonly and not self._event_units:
            with self._tx(check=False) as db:  # files made before recalls were indexed by the units they returned
                db.execute(_EVENT_UNITS)
                db.execute(_EVENT_UNITS_FILL)
            self._event_units = True
        if not self.readonly and not self._q("SELECT 1 FROM sqlite_master WHERE name = 'unit_log'"):
            with self._tx(check=False) as db:  # files made before the in-memory mirror
                for stmt in _split_sql(_UNIT_LOG):
                    db.execute(stmt)
        if not self.readonly and self._setting("db_id") is None:
            # Binds the vector index file to this database (see forge.store.vectors).
            with self._tx(check=False) as db:
                db.execute("INSERT OR IGNORE INTO meta VALUES ('db_id', ?)", (os.urandom(8).hex(),))

    def _on_commit(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` now, or when the enclosing transaction commits (never if it rolls back)."""
        if self._depth:
            self._after_commit.append(fn)
        else:
            fn()

    def _refuse_writes(self) -> None:
        if self.readonly:
            raise StoreError(f"{self.path}: opened read-only; writes are refused")
        if self._corrupt is not None:
            raise StoreError(f"{self.path}: {self._corrupt}; writes are refused (restore a backup, or export what is readable)")

    def _integrity_check(self) -> None:
        """Before a store's first write: a quick page check on files small enough for it."""
        self._checked = True
        if self._file is None or not self._file.exists() or self._file.stat().st_size > QUICK_CHECK_MAX_BYTES:
            return
        rows: list[tuple[Any, ...]] = []
        # quick_check first (cheaper); SQLite 3.40's quick_check misreads WITHOUT ROWID
        # tables whose key order differs from their column order (unit_tags), so what it
        # flags is confirmed by the full integrity_check.
        for pragma in ("quick_check(1)", "integrity_check(1)"):
            try:
                rows = self._db.execute(f"PRAGMA {pragma}").fetchall()
            except sqlite3.DatabaseError as exc:
                rows = [(str(exc),)]
            if rows == [("ok",)]:
                return
        detail = " ".join(str(rows[0][0]).split()) if rows else "integrity check failed"
        self._corrupt = f"the database is corrupt ({detail[:200]})"

    def _seen_error(self, exc: sqlite3.DatabaseError) -> None:
        if isinstance(exc, sqlite3.DatabaseError) and _is_corruption(exc):
            self._corrupt = f"the database is corrupt ({exc})"

    @contextmanager
    def _tx(self, *, check: bool = True) -> Iterator[sqlite3.Connection]:
        """One write transaction (a savepoint when nested); rolled back whole on any error."""
        with self._lock:
            if self._db is None:
                raise StoreError(f"{self.path}: the store is closed")
            if check:
                if not self._checked and not self._depth:
                    self._integrity_check()
                self._refuse_writes()
            depth = self._depth
            try:
                self._db.execute("BEGIN IMMEDIATE" if depth == 0 else f"SAVEPOINT forge_{depth}")
            except sqlite3.DatabaseError as exc:
                self._seen_error(exc)
                raise StoreError(f"{self.path}: cannot start a write ({exc})") from None
            self._depth = depth + 1
            owner, self._tx_owner = self._tx_owner, threading.get_ident()  # its reads see its writes
            try:
                yield from self._in_tx(depth)
            finally:
                self._tx_owner = owner

    def _in_tx(self, depth: int) -> Iterator[sqlite3.Connection]:
        """The body of :meth:`_tx` after BEGIN: apply pending touches, yield, then commit or roll back."""
        try:
            self._apply_touches(self._db)
            yield self._db
        except sqlite3.DatabaseError as exc:
            self._depth = depth
            self._rollback(depth)
            self._seen_error(exc)
            raise StoreError(f"{self.path}: write failed ({exc})") from None
        except BaseException:
            self._depth = depth
            self._rollback(depth)
            raise
        self._depth = depth
        if depth:
            self._db.execute(f"RELEASE forge_{depth}")
            return
        self._tx_vseq = None
        try:
            self._db.execute("COMMIT")
        except sqlite3.DatabaseError as exc:
            self._seen_error(exc)
            self._rollback(0)
            raise StoreError(f"{self.path}: commit failed ({exc})") from None
        done, self._after_commit = self._after_commit, []
        for fn in done:
            fn()

    def _rollback(self, depth: int) -> None:
        try:
            if depth:
                self._db.execute(f"ROLLBACK TO forge_{depth}")
                self._db.execute(f"RELEASE forge_{depth}")
                return
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
        except sqlite3.DatabaseError:
            pass  # SQLite already rolled back (e.g. after a full disk or an I/O error)
        if depth == 0:
            self._after_commit.clear()
            self._tx_vseq = None
            # The dimension may have been fixed by a write that is now undone.
            row = self._db.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
            self._dim = int(row[0]) if row and row[0] else None

    def _q(self, sql: str, params: Sequence[Any] = (), *, viewer: Viewer | None = None) -> list[tuple[Any, ...]]:
        # ``viewer`` is unused: SQLite has no row-level security, the query's clause is the wall.
        # Outside this thread's own write transaction, read committed data on this thread's
        # connection, without waiting for the store lock; else on the writer's connection.
        reader = self._reader() if self._concurrent_reads and self._tx_owner != threading.get_ident() else None
        with reader[1] if reader else self._lock:
            if self._db is None:
                raise StoreError(f"{self.path}: the store is closed")
            try:
                return (reader[0] if reader else self._db).execute(sql, params).fetchall()
            except sqlite3.DatabaseError as exc:
                self._seen_error(exc)
                raise StoreError(f"{self.path}: query failed ({exc})") from None

    def _reader(self) -> tuple[sqlite3.Connection, threading.Lock]:
        """This thread's read connection (made on first use, closed with the store)."""
        mine: tuple[sqlite3.Connection, threading.Lock] | None = getattr(self._readers, "conn", None)
        if mine is not None:
            return mine
        try:
            db = self._connect()
            db.execute(_VOCAB_VIEW)
            db.execute("PRAGMA query_only = ON")  # a read connection never writes, by mistake either
        except sqlite3.DatabaseError as exc:
            self._seen_error(exc)
            raise StoreError(f"{self.path}: cannot open a read connection ({exc})") from None
        mine = (db, threading.Lock())
        with self._reader_list_lock:
            if self._db is None:
                db.close()
                raise StoreError(f"{self.path}: the store is closed")
            # Thread pools retire idle threads and start new ones: close the connections of
            # threads that are gone, so a long-running server does not collect them.
            gone = [r for r in self._reader_list if not r[2].is_alive()]
            self._reader_list = [r for r in self._reader_list if r[2].is_alive()]
            self._reader_list.append((*mine, threading.current_thread()))
        for old, lock, _ in gone:
            with lock:
                old.close()
        self._readers.conn = mine
        return mine

    def _drop_reader(self) -> None:
        mine = getattr(self._readers, "conn", None)
        if mine is None:
            return
        self._readers.conn = None
        with self._reader_list_lock:
            self._reader_list = [r for r in self._reader_list if r[0] is not mine[0]]
        with mine[1]:
            mine[0].close()

    def _id_batches(self, ids: Iterable[str]) -> Iterator[list[str]]:
        return _chunks(list(ids), 500)  # well below SQLite's limit of variables per statement

    def _vector_value(self, raw: bytes) -> np.ndarray:
        return np.frombuffer(raw, dtype=np.float32).copy()

    def _setting(self, key: str) -> str | None:
        row = self._q("SELECT value FROM meta WHERE key = ?", (key,))
        return row[0][0] if row else None

    # -- facts ----------------------------------------------------------------------------
    @property
    def info(self) -> Mapping[str, Any]:
        return {"backend": "sqlite", "path": self.path, "ann": "usearch",
                "fts": "bm25-in-memory" if self._keyword_index else "fts5", "dim": self._dim, "readonly": self.readonly,
                "warming": self._warming is not None and self._warming.is_alive()}

    # -- writes ---------------------------------------------------------------------------
    def _fix_dim(self, db: sqlite3.Connection, vectors: np.ndarray | None) -> None:
        if vectors is not None and self._dim is None:
            db.execute("INSERT OR REPLACE INTO meta VALUES ('dim', ?)", (str(vectors.shape[1]),))

    def _next_vseq(self, db: sqlite3.Connection) -> int:
        seq = int(db.execute("SELECT value FROM meta WHERE key='vseq'").fetchone()[0]) + 1
        if self._tx_vseq is None:
            self._tx_vseq = seq - 1  # what is committed: the index may catch up to here
        db.execute("UPDATE meta SET value = ? WHERE key = 'vseq'", (str(seq),))
        return seq

    def _wrote(self, vectors: np.ndarray | None) -> None:
        """Inside a write transaction that stored ``vectors``: fix the dimension now (later
        writes in the same transaction are checked against it), update the index on commit."""
        if vectors is not None:
            if self._dim is None:
                self._dim = vectors.shape[1]
            self._on_commit(self._sync_index_after_write)

    def _insert_units(
        self,
        db: sqlite3.Connection,
        units: list[Unit],
        vectors: np.ndarray | None,
        *,
        actor: str,
        now: float,
        log: bool = True,
    ) -> None:
        seq = self._next_vseq(db) if vectors is not None else 0
        rows = []
        for i, u in enumerate(units):
            rows.append(_unit_row(u) + ((vectors[i].tobytes() if vectors is not None else None), seq))
        try:
            with self._savepoint(db):  # undone alone: the ids then found taken were there before
                db.executemany(f"INSERT INTO units ({_COLUMNS}, search_text, vector, vseq) VALUES ({SQLITE.marks(22)})", rows)
        except Duplicate:
            raise self._duplicate(db, [u.id for u in units]) from None
        self._tag(db, [(u.id, t) for u in units for t in u.context.tags])
        if log:
            self._log_many(db, [(now, "add", u.id, actor, {"kind": u.kind.value, "scope": str(u.scope)}) for u in units])

    def _tag(self, db: sqlite3.Connection, tags: list[tuple[str, str]]) -> None:
        """Index (unit id, tag) pairs in unit_tags, which tag filters read."""
        if tags:
            db.executemany("INSERT OR IGNORE INTO unit_tags SELECT rowid, ? FROM units WHERE id = ?", [(t, uid) for uid, t in tags])

    def _after_update(self, db: sqlite3.Connection, unit: Unit) -> None:
        db.execute("DELETE FROM unit_tags WHERE unit_rowid = (SELECT rowid FROM units WHERE id = ?)", (unit.id,))
        self._tag(db, [(unit.id, t) for t in unit.context.tags])

    def _vector_sets(self, db: sqlite3.Connection, vector: np.ndarray) -> tuple[str, list[Any]]:
        return ", vector = ?, vseq = ?", [vector.tobytes(), self._next_vseq(db)]

    @contextmanager
    def _savepoint(self, db: sqlite3.Connection) -> Iterator[None]:
        db.execute("SAVEPOINT forge_stmt")
        try:
            yield
        except sqlite3.IntegrityError:
            db.execute("ROLLBACK TO forge_stmt")
            db.execute("RELEASE forge_stmt")
            raise Duplicate("a unique key refused the row") from None
        db.execute("RELEASE forge_stmt")

    def _log_many(self, db: sqlite3.Connection, events: Sequence[EventRow]) -> None:
        db.executemany(
            "INSERT INTO events (ts, op, unit_id, actor, data) VALUES (?, ?, ?, ?, ?)",
            [(ts, op, uid, who, json.dumps(dict(data), default=str)) for ts, op, uid, who, data in events],
        )

    def touch(self, ids: Sequence[str], *, at: float | None = None) -> None:
        """Count a recall of ``ids``; written within TOUCH_DELAY_S, with the next write, or on close.

        Recall calls this every time, so it must not cost a write transaction per recall. Reads
        (get, list, export) already show the pending counts.
        """
        if not ids or self.readonly:  # access statistics are best effort: reading never fails for them
            return
        at = time.time() if at is None else at
        with self._touch_lock:
            for i in ids:
                n, last = self._touches.get(i, (0, at))
                self._touches[i] = (n + 1, max(last, at))
            full = len(self._touches) >= TOUCH_MAX_PENDING
            if not full and self._touch_timer is None and self._db is not None:
                self._touch_timer = threading.Timer(TOUCH_DELAY_S, self._timed_flush)
                self._touch_timer.daemon = True
                self._touch_timer.start()
        if full:
            self.flush_touches()

    def _timed_flush(self) -> None:
        with contextlib.suppress(Exception):  # kept pending: the next write or close retries
            self.flush_touches()

    def flush_touches(self) -> None:
        """Write pending access statistics now (one transaction)."""
        with self._lock:
            if self._db is None or not self._touches:
                with self._touch_lock:
                    self._touch_timer = None
                return
            with self._tx():
                pass  # _tx applies pending touches first thing

    def _apply_touches(self, db: sqlite3.Connection) -> None:
        with self._touch_lock:
            timer, self._touch_timer = self._touch_timer, None
            pending, self._touches = self._touches, {}
        if timer is not None and timer is not threading.current_thread():
            timer.cancel()
        if not pending:
            return
        try:
            db.executemany(
                "UPDATE units SET access_count = access_count + ?, "
                "last_access = max(coalesce(last_access, ?), ?) WHERE id = ?",
                [(n, at, at, i) for i, (n, at) in pending.items()],
            )
        except BaseException:
            with self._touch_lock:
                for i, (n, at) in pending.items():  # keep them for the next try
                    m, last = self._touches.get(i, (0, at))
                    self._touches[i] = (n + m, max(at, last))
            raise

    def _touched(self, unit: Unit) -> Unit:
        pending = self._touches.get(unit.id)
        if pending is None:
            return unit
        n, at = pending
        return unit.replace(access_count=unit.access_count + n, last_access=max(unit.last_access or at, at))

    # -- search ---------------------------------------------------------------------------
    def _sync_index_after_write(self) -> None:
        if self._index is not None:
            with self._index_lock:
                self._catch_up()

    def _ensure_index(self) -> VectorIndex | None:
        if self._dim is None:
            return None
        if self._index is None:
            # Settings first (they take the store lock), then the index lock: the same order
            # as a write transaction that searches, so the warm-up thread cannot deadlock it.
            settings = dict(self._q("SELECT key, value FROM meta"))
            with self._index_lock:  # the warm-up thread may be loading it right now: wait for it
                if self._index is None:
                    path = Path(self.path + ".usearch") if self._file is not None else None
                    index = VectorIndex(dim=self._dim, path=path)
                    index.load(
                        db_id=settings.get("db_id", ""),
                        gen=int(settings.get("vgen") or 0),
                        max_seq=int(settings.get("vseq") or 0),
                    )
                    self._index = index
        if self._concurrent_reads and self._tx_owner != threading.get_ident():
            # A reader catches up with what is committed, read on its own connection: it
            # needs no store lock, so it never waits for a writer's transaction.
            if self._index.seq < int(self._setting("vseq") or 0):
                with self._index_lock:
                    self._catch_up()
            return self._index
        with self._lock, self._index_lock:
            self._catch_up()
        return self._index

    def _catch_up(self) -> None:
        index = self._index
        if index is None:
            return
        target = int(self._setting("vseq") or 0)
        if self._depth and self._tx_vseq is not None:
            # Inside a transaction the index takes only what is committed: rows written
            # here may still be rolled back. It catches up with them after the commit.
            target = min(target, self._tx_vseq)
        if index.seq >= target:
            return

        def rows(after: int) -> Iterator[tuple[np.ndarray, np.ndarray, int]]:
            last = (after, 0)
            while True:
                batch = self._q(_CATCH_UP_SQL, (after, target, *last))
                if not batch:
                    return
                keys = np.array([b[0] for b in batch], dtype=np.uint64)
                vecs = np.frombuffer(b"".join(b[1] for b in batch), dtype=np.float32).reshape(len(batch), -1)
                last = (batch[-1][2], batch[-1][0])
                yield keys, vecs, batch[-1][2]

        index.catch_up(rows, target=target)

    def vector_search(self, query: np.ndarray, *, k: int, viewer: Viewer, filter: Filter = Filter()) -> list[Hit]:
        k = _count_arg(k, "k")
        query = self._search_vector(query)
        self._searched_at = time.monotonic()
        index = self._ensure_index()
        if index is None or k <= 0:
            return []
        facts = self._ensure_facts()
        if facts is not None and (cost := facts.listing_cost(viewer, filter)) is not None and cost <= LIST_FIRST_MAX:
            # Listing this filter's units is cheap (or already done): when they are few,
            # search exactly among them without probing the ANN index first.
            matching = facts.admitted(viewer, filter)
            if len(matching) <= EXACT_SEARCH_LIMIT:
                return self._hits(index.search_exact_among(query, matching, k), facts)
        admit = self._admitter(viewer, filter, facts)
        want = max(k * 3 // 2, 40)  # room for what the viewer or filter turns away; widened below when short
        total = len(index)
        while True:
            cands = index.search(query, want)
            if not cands:
                return []
            allowed = admit(np.array([c[0] for c in cands], dtype=np.int64))
            hits = [(r, s) for r, s in cands if r in allowed]
            if len(hits) >= k or want >= total:
                return self._hits(hits[:k], facts)
            # The share of candidates the filter admits estimates how many units match in all;
            # when that is few, exact search among them beats widening the ANN search.
            if len(hits) * total <= EXACT_SEARCH_LIMIT * len(cands) or want >= 4 * max(k, 10) * 16:
                break
            want *= 4
        # The filter is selective: search exactly among the units it admits.
        matching = self._admitted(viewer, filter, facts)[: EXACT_SEARCH_LIMIT * 50]
        return self._hits(index.search_exact_among(query, matching, k), facts)

    def _admitter(self, viewer: Viewer, f: Filter, facts: Facts | None) -> Callable[[np.ndarray], set[int]]:
        """A test of candidate row ids against the viewer's scopes and the filter: the
        in-memory columns when they are caught up (``facts``), else one SQL query per call."""
        if facts is not None:
            return lambda rowids: set(rowids[facts.admits(rowids, viewer, f)].tolist())
        where, params = _where(viewer, f)
        return lambda rowids: self._allowed_rowids(rowids.tolist(), where, params)

    def _admitted(self, viewer: Viewer, f: Filter, facts: Facts | None) -> np.ndarray:
        """Row ids of every unit the viewer may see and the filter admits, ascending."""
        if facts is not None:
            return facts.admitted(viewer, f)
        # No "vector IS NOT NULL" here: it made SQLite read every admitted row (~1.5 KB each)
        # where the filter's columns are in an index; the vector index knows which have one.
        where, params = _where(viewer, f)
        return np.fromiter((r[0] for r in self._q(f"SELECT rowid FROM units WHERE {where} ORDER BY rowid", params)), dtype=np.int64)

    def check_index(self, *, sample: int | None = None) -> list[str]:
        """Compare the vector index with the database; the problems found, empty if none.

        The index must hold every stored vector under its row id, with the same value, and
        nothing else. This checks the bookkeeping, not the ANN's recall: above ``EXACT_MAX``
        vectors HNSW may rank a unit below its neighbours even when the index is right.
        ``sample`` checks that many rows chosen at random instead of all of them.
        """
        index = self._ensure_index()
        with self._lock, self._index_lock:
            stored = self._q("SELECT count(*) FROM units WHERE vector IS NOT NULL AND vseq <= ?",
                             (index.seq if index else 0,))[0][0]
            if index is None:
                return [] if stored == 0 else [f"{stored} stored vectors but no index"]
            problems = [] if len(index) == stored else [f"the index holds {len(index)} vectors, the database {stored}"]
            order = "ORDER BY random() LIMIT ?" if sample is not None else "LIMIT -1 OFFSET ?"
            rows = self._q(f"SELECT rowid, id, vector FROM units WHERE vector IS NOT NULL AND vseq <= ? {order}",
                           (index.seq, sample if sample is not None else 0))
            for rowid, uid, blob in rows:
                want = np.frombuffer(blob, dtype=np.float32)
                got = index.stored(rowid)
                if got is None:
                    problems.append(f"{uid}: missing from the index")
                elif got.shape != want.shape or not np.allclose(got, want, atol=1e-5):
                    problems.append(f"{uid}: the index holds another vector")
        return problems

    def _allowed_rowids(self, rowids: list[int], where: str, params: Sequence[Any]) -> set[int]:
        out: set[int] = set()
        for chunk in _chunks(rowids, 900):
            out.update(
                r[0]
                for r in self._q(
                    f"SELECT rowid FROM units WHERE rowid IN ({','.join('?' * len(chunk))}) AND {where}",
                    (*chunk, *params),
                )
            )
        return out

    def _hits(self, pairs: list[tuple[int, float]], facts: Facts | None = None) -> list[Hit]:
        """Row ids named by unit id: from the mirror that admitted them, else from SQL."""
        if not pairs:
            return []
        rowids = [p[0] for p in pairs]
        ids: dict[int, str] = {}
        if facts is not None:
            ids = {r: uid for r, uid in zip(rowids, facts.ids(rowids), strict=True) if uid is not None}
        if len(ids) < len(rowids):
            missing = [r for r in rowids if r not in ids]
            ids.update(self._q(f"SELECT rowid, id FROM units WHERE rowid IN ({','.join('?' * len(missing))})", missing))
        return [Hit(ids[r], s) for r, s in pairs if r in ids]

    def keyword_search(self, query: str, *, k: int, viewer: Viewer, filter: Filter = Filter()) -> list[Hit]:
        k = _count_arg(k, "k")
        words = self._search_words(query)
        if not words or k <= 0:
            return []
        self._searched_at = time.monotonic()
        mirror = self._ensure_mirror()
        if mirror is not None:
            return self._ranked_keywords(*mirror, words, k, viewer, filter)
        match = " OR ".join(f'"{w}"' for w in self._informative(words))
        where, params = _where(viewer, filter, alias="u")
        want = max(k * 8, 64)
        rows = self._q(
            # ties by row id, as the in-memory index breaks them
            f"SELECT u.id, f.rank FROM (SELECT rowid, rank FROM units_fts WHERE units_fts MATCH ? ORDER BY rank, rowid LIMIT ?) f "
            f"JOIN units u ON u.rowid = f.rowid WHERE {where} ORDER BY f.rank, f.rowid LIMIT ?",
            (match, want, *params, k),
        )
        if len(rows) < k:
            # The filter dropped too many of the top matches: rank the matches it admits. BM25 is
            # computed in the select list, after the filter, so only admitted rows are scored
            # ("ORDER BY rank" would have FTS5 score and sort every match first).
            rows = self._q(
                f"SELECT u.id, bm25(units_fts) AS r FROM units_fts JOIN units u ON u.rowid = units_fts.rowid "
                f"WHERE units_fts MATCH ? AND {where} ORDER BY r, u.rowid LIMIT ?",
                (match, *params, k),
            )
        # FTS5 rank is bm25 negated (lower is better); report it as a positive score.
        return [Hit(r[0], -float(r[1])) for r in rows]

    def _ensure_keywords(self, *, build: bool = False) -> KeywordIndex | None:
        """The in-memory keyword index, caught up with what is committed; None where FTS5 answers.

        FTS5 answers inside this thread's write transaction (the index holds only committed
        text, and the transaction's own writes may still be rolled back), while a file
        store's warm-up thread is still building the index, and for a read-only file made
        before ``unit_log`` existed.
        """
        mirror = self._ensure_mirror(build=build)
        return mirror[0] if mirror else None

    def _ensure_facts(self) -> Facts | None:
        """The in-memory filter columns, caught up; None where SQL must test scopes and filters."""
        mirror = self._ensure_mirror()
        return mirror[1] if mirror else None

    def _ensure_mirror(self, *, build: bool = False) -> tuple[KeywordIndex, Facts] | None:
        if not self._keyword_index or (self._depth and self._tx_owner == threading.get_ident()):
            return None
        mirror = self._mirror
        if mirror is None and not build and self._warming is not None and self._warming.is_alive():
            return None
        if mirror is not None and self._q("SELECT max(seq) FROM unit_log")[0][0] in (None, mirror[0].seq):
            return mirror  # nothing new: no lock, so concurrent searches do not queue on it
        with self._keywords_lock:
            mirror = self._mirror or self._build_mirror()
            self._catch_up_mirror(*mirror)
            self._mirror = mirror
        return mirror

    def _build_mirror(self) -> tuple[KeywordIndex, Facts]:
        index, facts = KeywordIndex(), Facts()
        # The log position first, then the rows: a unit changed in between is in both,
        # and replaying it after the build is harmless (applying a row is idempotent).
        seq = int(self._q("SELECT coalesce(max(seq), 0) FROM unit_log")[0][0])

        def pages() -> Iterator[list[tuple[Any, ...]]]:
            last = -1
            while rows := self._q(f"SELECT {_MIRROR_COLUMNS} FROM units WHERE rowid > ? ORDER BY rowid LIMIT {MIRROR_PAGE}", (last,)):
                for i in range(0, len(rows), MIRROR_STEP):
                    if self._closing.is_set():
                        raise StoreError(f"{self.path}: the store is closed")
                    step = rows[i : i + MIRROR_STEP]
                    facts.load_rows([(r[0], *r[2:9], r[10], r[11]) for r in step])  # tags come from unit_tags
                    yield [(r[0], r[1]) for r in step]
                    # A pause after each ~1 ms of work, longer while searches are running: this
                    # runs beside the first recalls after open, and a thread that holds the GIL
                    # for its whole 5 ms switch interval made each of a recall's ~20 GIL
                    # hand-offs wait for it (121 ms vs 17 ms at 100k units).
                    time.sleep(0.005 if time.monotonic() - self._searched_at < 0.25 else 0.0005)
                last = rows[-1][0]

        index.load(pages(), seq=seq)
        tags = [r[0] for r in self._q("SELECT DISTINCT tag FROM unit_tags")]  # then one tag at a time: bounded memory
        facts.load_tags(((t, r[0]) for t in tags for r in self._q("SELECT unit_rowid FROM unit_tags WHERE tag = ?", (t,))),
                        seq=seq)
        return index, facts

    def _catch_up_mirror(self, index: KeywordIndex, facts: Facts) -> None:
        while log := self._q("SELECT seq, unit_rowid FROM unit_log WHERE seq > ? ORDER BY seq LIMIT 20000", (index.seq,)):
            rowids = sorted({r[1] for r in log})
            rows: dict[int, tuple[Any, ...]] = {}
            for chunk in _chunks(rowids, 900):
                found = self._q(f"SELECT {_MIRROR_COLUMNS} FROM units WHERE rowid IN ({','.join('?' * len(chunk))})", chunk)
                rows.update((r[0], r) for r in found)
            seq = int(log[-1][0])
            # facts first: a unit is never admitted by a filter before its text can be found
            facts.apply([(r, rows[r][2:] if r in rows else None) for r in rowids], seq=seq)
            index.apply([(r, rows[r][1] if r in rows else None) for r in rowids], seq=seq)

    def _ranked_keywords(self, index: KeywordIndex, facts: Facts, words: list[str], k: int, viewer: Viewer, f: Filter) -> list[Hit]:
        """The ``k`` best BM25 matches the viewer and filter admit, checked in score order."""
        rowids, scores = index.score(words, common_share=COMMON_TERM_SHARE)
        if not len(rowids):
            return []
        admit = self._admitter(viewer, f, facts)
        want = max(k * 8, 64)
        while True:
            best, best_scores = top(rowids, scores, min(want, len(rowids)))
            allowed = admit(best)
            hits = [(r, s) for r, s in zip(best.tolist(), best_scores.tolist(), strict=True) if r in allowed]
            if len(hits) >= k or want >= len(rowids):
                return self._hits(hits[:k], facts)
            # The share the filter admitted so far says how far down k admitted matches lie.
            want = max(want * 8, int(2 * k * want / max(len(hits), 1)))
            if want > KEYWORD_WIDEN_MAX:
                break
        # A selective filter: take the units it admits, then the best matches among them.
        keep = member(rowids, self._admitted(viewer, f, facts))
        best, best_scores = top(rowids[keep], scores[keep], k)
        return self._hits(list(zip(best.tolist(), best_scores.tolist(), strict=True)), facts)

    def _informative(self, words: list[str]) -> list[str]:
        """Drop words found in more than COMMON_TERM_SHARE of all units (keep the rarest if all are).

        FTS5 ranks every unit that matches any query word, so one very common word makes a
        query cost O(n) (bench/recall_latency.py: 99 of 106 ms at 1M units) while its BM25
        weight is near zero. Document frequencies of the words' stems come from FTS5's own
        vocabulary: the same rule, on the same counts, as the in-memory index applies.
        """
        n = self._q("SELECT max(rowid) FROM units")[0][0] or 0  # O(1); the count while no unit was deleted
        if n < 1000 or len(words) < 2:
            return words
        # a word FTS5 splits into several tokens is a phrase: no single vocabulary entry
        stems = {w: stem(t[0]) if len(t := tokens(w)) == 1 else w for w in words}
        wanted = sorted(set(stems.values()))
        df = dict(self._q(f"SELECT term, doc FROM temp.units_vocab WHERE term IN ({','.join('?' * len(wanted))})", wanted))
        freq = {w: df.get(stems[w], 0) for w in words}
        present = [w for w in words if freq[w]]
        keep = [w for w in present if freq[w] <= COMMON_TERM_SHARE * n]
        return keep or [min(present or words, key=freq.__getitem__)]

    # -- bulk -----------------------------------------------------------------------------
    def _naming(self) -> str:
        if self._event_units:
            return super()._naming()
        # a read-only file made before event_units: the recall events' text names the id
        return "instr(e.data, '\"id\": ' || json_quote(?)) > 0"

    def _stats_extra(self) -> dict[str, Any]:
        return {"embedder": self._setting("embedder"), "path": self.path}

    def erase(self, unit_id: str, *, actor: str = "", reason: str = "") -> dict[str, Any]:
        """Remove a unit and every trace of its text (see :mod:`forge.store.erase`); the tombstone's data.

        Beyond the rows: the delete runs with ``secure_delete`` (freed pages are zeroed, not
        left in the file), the full-text index is merged so no old segment keeps the words,
        the WAL is checkpointed and truncated when no reader holds it, and the saved vector
        index is dropped (it holds the vector; it is rebuilt from the database on the next
        vector search, once).
        """
        with self._tx() as db:
            secure = db.execute("PRAGMA secure_delete").fetchone()[0]
            db.execute("PRAGMA secure_delete = ON")
            try:
                done = erase_rows(self, db, unit_id, actor=actor, reason=reason, delete_unit=self._delete_unit_row)
            except BaseException:
                db.execute(f"PRAGMA secure_delete = {int(secure)}")
                raise
            self._on_commit(lambda: self._after_erase(secure))
        return done

    def _delete_unit_row(self, db: sqlite3.Connection, unit_id: str) -> None:
        (rowid,) = db.execute("SELECT rowid FROM units WHERE id = ?", (unit_id,)).fetchone()
        db.execute("DELETE FROM unit_tags WHERE unit_rowid = ?", (rowid,))
        db.execute("DELETE FROM units WHERE rowid = ?", (rowid,))  # the FTS5 row and the change feed by trigger

    def _after_erase(self, secure: int) -> None:
        try:
            with self._tx(check=False) as db:  # rewrite the FTS5 segments without the deleted words
                db.execute("INSERT INTO units_fts(units_fts) VALUES ('optimize')")
        finally:
            self._db.execute(f"PRAGMA secure_delete = {int(secure)}")
        with contextlib.suppress(sqlite3.DatabaseError):
            self._db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # busy while a reader holds it: rewritten later
        with self._index_lock:
            self._index = None
        if self._file is not None:
            for suffix in (".usearch", ".usearch.json"):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(self.path + suffix)

    def flush(self) -> None:
        """Write pending access statistics and persist the vector index now (close does both).

        The save bumps the database's index generation in the same write transaction, so
        the file on disk and the database name each other; it is skipped for a read-only
        or corrupt database, whose index lives in memory only.
        """
        self.flush_touches()
        index = self._index
        if index is None or not index.dirty or index.path is None or self.readonly or self._corrupt:
            return
        with self._lock, self._tx(check=False) as db:
            row = db.execute("SELECT value FROM meta WHERE key = 'vgen'").fetchone()
            gen = int(row[0]) + 1 if row else 1
            db.execute("INSERT OR REPLACE INTO meta VALUES ('vgen', ?)", (str(gen),))
            db_id = db.execute("SELECT value FROM meta WHERE key = 'db_id'").fetchone()
            try:
                index.save(db_id=db_id[0] if db_id else "", gen=gen)
            except OSError as exc:
                raise StoreError(f"{index.path}: cannot save the vector index ({exc})") from None

    def close(self) -> None:
        self._closing.set()  # a mirror still being built is dropped: a short-lived process need not wait for it
        if self._warming is not None:
            self._warming.join()
        with self._lock:
            if self._db is None:
                return
            try:
                # The index is a cache: failing to save it costs a rebuild on the next open,
                # never data, so closing does not fail for it.
                with contextlib.suppress(StoreError, OSError):
                    self.flush()
            finally:
                self._db.close()
                self._db = None  # type: ignore[assignment]
                with self._reader_list_lock:
                    readers, self._reader_list = self._reader_list, []
                for db, lock, _ in readers:
                    with lock:  # a read in flight on it finishes first
                        db.close()


# -- helpers ------------------------------------------------------------------------------


def _writable(path: Path) -> bool:
    """Whether this process may write the file and create its -wal/-shm companions."""
    return os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)


def _is_corruption(exc: sqlite3.DatabaseError) -> bool:
    code = getattr(exc, "sqlite_errorcode", None) or 0
    return code & 0xFF in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


def _check_file(path: Path, *, create: bool) -> None:
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, not a database file")
    if not path.exists():
        if not create:
            raise NotFoundError(f"{path}: no such database; create it with 'forge add' or 'forge import'")
        if not path.parent.exists():
            raise ConfigError(f"{path.parent}: directory does not exist")
        return
    if path.stat().st_size == 0:
        return
    with path.open("rb") as fh:
        head = fh.read(16)
    if head != b"SQLite format 3\x00":
        raise StoreError(f"{path}: not a FORGE database (not an SQLite file, or corrupt)")


def _split_sql(script: str) -> list[str]:
    """Split the schema into statements, keeping trigger bodies whole."""
    out, buf, depth = [], [], 0
    for line in script.strip().splitlines():
        buf.append(line)
        upper = line.strip().upper()
        if upper.endswith("BEGIN"):
            depth += 1
        if upper == "END;":
            depth -= 1
        if depth == 0 and line.rstrip().endswith(";"):
            out.append("\n".join(buf))
            buf = []
    return out


def fts_query(text: str) -> str | None:
    """A safe FTS5 query from free text: its content words, OR-ed, each quoted."""
    words = query_words(text)
    return " OR ".join(f'"{w}"' for w in words) if words else None


def _chunks(items: list[Any], n: int) -> Iterator[list[Any]]:
    for i in range(0, len(items), n):
        yield items[i : i + n]
