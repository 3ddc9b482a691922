"""PostgreSQL + pgvector: one memory written by many processes on many hosts.

    open_store("postgresql://forge@db.internal:5432/memory")             # schema "forge"
    open_store("postgresql://forge@db.internal/memory?schema=team_red")  # another memory, same database

Works against any PostgreSQL >= 15 with pgvector >= 0.5 (HNSW). What lives where:

- **vectors**: a pgvector column with an HNSW index (cosine) inside the database, so there is
  no side file to rebuild and every process sees a write the moment it commits. With
  pgvector >= 0.8 filtered searches scan the index iteratively until ``k`` rows pass the
  viewer and the filter; when fewer do, the search falls back to an exact scan of the rows
  that pass (a selective filter), as the SQLite store does.
- **bulk writes**: HNSW upkeep is most of an insert's cost (~360 units/s here against ~6,900
  without vectors). A batch of more than :data:`INLINE_MAX` units therefore lands with its
  vectors in ``pending``, outside the index, and a background thread of the writing process
  moves them into the index in small transactions (:meth:`PostgresStore.index_pending`;
  any process may, rows are claimed with ``SKIP LOCKED``). Searches rank the pending rows
  exactly beside the index, so a write is found the moment it commits. Above
  :data:`PENDING_MAX` pending rows writes index inline again: the backlog, and the exact
  scan over it, stay bounded.
- **loading a big memory**: pgvector builds an index from rows already in the table about
  ten times faster than it inserts them one at a time (3,900 against 350 vectors/s at
  100k units here), so :meth:`PostgresStore.bulk_load` drops the HNSW index, lets the
  writes land in the table, and builds the index once at the end. An import of at least
  :data:`BULK_MIN` vectors, no fewer than the memory already holds, does this by itself.
- **keywords**: a ``tsvector`` per unit (the ``english`` configuration: stemming and stop
  words, as SQLite's porter tokenizer), kept by a trigger in ``unit_fts`` (see migration 4
  for why not in ``units``), and from it one posting per (lexeme, unit) in ``unit_terms``,
  ordered by impact: BM25's term weight, the unit's own term frequency saturated and
  normalised by its length against a fixed pivot of 16 terms (a corpus-wide mean length
  would need every writer to keep one number consistent). A search reads the best
  postings of each query lexeme (index-only, a few hundred each) and sums them weighted by
  each lexeme's IDF, estimated from a sample of units; so its cost does not grow with the
  memory, where ranking every matching unit (``ts_rank_cd``, before migration 7) took
  30 ms p50 and 250 ms p95 at 1M units. A unit outside every list's head is not found
  by that search, the price of the bound (ranking is exact while a lexeme has fewer
  postings than the lists read).
- **who sees what**: every query carries the viewer clause (the same rules as SQLite), and
  row-level security on ``units`` checks it a second time from session settings the store
  sets per query, so a query that forgot the clause still returns nothing hidden. Postgres
  skips row-level security for superusers and ``BYPASSRLS`` roles: connect as an ordinary
  role (``info["rls"]`` says whether the second wall is up).
- **many writers**: each write is one transaction; unit ids are primary keys and events are
  numbered by an identity column. The vector dimension is fixed once, under an advisory
  lock, by the first write that carries vectors.
- **schema**: ``forge_schema`` records the applied version; :data:`MIGRATIONS` run forward
  in one transaction under an advisory lock, so processes opening an old schema together
  upgrade it once.
- **passwords** never come in the URL (it ends up in shell history, process lists and logs):
  libpq reads ``PGPASSWORD`` or ``~/.pgpass``. Errors and ``info`` show the URL without it.

Postgres text cannot hold NUL characters: a unit whose text contains one is refused.
What reads and writes the same as on SQLite is :mod:`forge.store.sql`'s; connections go
through :mod:`forge.store.pg`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import math
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import numpy as np

from forge.errors import (
    ConfigError,
    ConflictError,
    DimensionError,
    NotFoundError,
    StoreError,
    ValidationError,
)
from forge.model import Unit, Viewer
from forge.store import pg
from forge.store.base import Filter, Hit
from forge.store.common import count_arg as _count_arg
from forge.store.erase import erase_rows
from forge.store.pg import redact_dsn
from forge.store.sql import COLUMNS as _COLUMNS
from forge.store.sql import Dialect, Duplicate, EventRow, SQLStore

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "PostgresStore", "migrate", "redact_dsn"]

DEFAULT_SCHEMA = "forge"
CONNECT_TIMEOUT_S = 10  # an unreachable server is an error after this long, never a hang
COMMON_TERM_SHARE = 0.10  # keyword search skips lexemes in more than this share of units, as SQLite's
SAMPLE_UNITS = 4000  # ... estimated from a sample of this many units
EF_SEARCH_MIN = 40  # pgvector's default HNSW candidate list, up to 100k units (see _ef_search)
INLINE_MAX = 64  # batches up to this size go into the HNSW index in the writing transaction
PENDING_MAX = 20_000  # ... and every batch does while this many vectors wait for the index
INDEX_BATCH = 128  # pending vectors moved into the index per background transaction
#: The search indexes, by name: what a bulk load drops and builds again (migrations create them).
_SEARCH_INDEXES = {
    "unit_terms_impact": "unit_terms (lexeme, impact DESC, seq)",
    "units_hnsw": "units USING hnsw (embedding vector_cosine_ops)",  # once the first vectors fix the dimension
}
# A filter whose tags (with its kinds) admit at most this many units lists them through
# unit_tags first and ranks their vectors exactly, and takes keyword heads among them
# (bench/backends.py: 9k of 1M units admitted, against an HNSW walk that most candidates fail).
LIST_FIRST_MAX = 20_000
KEYWORD_HEADS_MAX = 8192  # keyword heads are widened up to this many postings a lexeme before every posting is ranked
BULK_MIN = 10_000  # imports with this many vectors (and no fewer than are indexed) build the index afterwards
BUILD_MEMORY_MAX = 4 << 30  # maintenance_work_mem an index build may ask for: pgvector builds in memory when the graph fits

#: Forward migrations: (version, SQL). A database at version n gets n+1.. applied in order.
#: Never edit a released step; add one.
MIGRATIONS: tuple[tuple[int, str], ...] = (
    (1, """
CREATE TABLE meta (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE settings (key text PRIMARY KEY, value text NOT NULL);
CREATE TABLE units (
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    id text PRIMARY KEY,
    kind text NOT NULL,
    content text NOT NULL,
    search_text text NOT NULL,
    domain text NOT NULL DEFAULT '',
    task text NOT NULL DEFAULT '',
    role text NOT NULL DEFAULT '',
    tags text[] NOT NULL DEFAULT '{}',
    scope text NOT NULL,
    owner text NOT NULL DEFAULT '',
    confidence double precision NOT NULL,
    validation double precision NOT NULL,
    importance double precision NOT NULL,
    access_count bigint NOT NULL DEFAULT 0,
    last_access double precision,
    created_at double precision NOT NULL,
    updated_at double precision NOT NULL,
    provenance text NOT NULL DEFAULT '{}',
    status text NOT NULL,
    meta text NOT NULL DEFAULT '{}',
    embedding vector
);
CREATE INDEX units_kind ON units (kind, status);
CREATE INDEX units_scope ON units (scope, owner);
CREATE INDEX units_created ON units (created_at, seq);
CREATE INDEX units_tags ON units USING gin (tags);
CREATE TABLE relations (
    seq bigint GENERATED ALWAYS AS IDENTITY UNIQUE,
    src text NOT NULL REFERENCES units (id),
    dst text NOT NULL REFERENCES units (id),
    type text NOT NULL,
    weight double precision NOT NULL DEFAULT 1.0,
    created_at double precision NOT NULL,
    note text NOT NULL DEFAULT '',
    PRIMARY KEY (src, dst, type)
);
CREATE INDEX relations_dst ON relations (dst);
CREATE TABLE episodes (
    id text PRIMARY KEY,
    agent text NOT NULL DEFAULT '',
    task text NOT NULL DEFAULT '',
    env text NOT NULL DEFAULT '',
    created_at double precision NOT NULL,
    body text NOT NULL
);
CREATE TABLE events (
    seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    ts double precision NOT NULL,
    op text NOT NULL,
    unit_id text,
    actor text NOT NULL DEFAULT '',
    data text NOT NULL DEFAULT '{}'
);
CREATE INDEX events_unit ON events (unit_id, seq);
CREATE INDEX events_actor ON events (actor, seq);
CREATE INDEX events_op ON events (op, seq);
"""),
    # Keyword search: the generated column is filled for rows already there.
    (2, """
ALTER TABLE units ADD COLUMN search_tsv tsvector
    GENERATED ALWAYS AS (to_tsvector('english'::regconfig, search_text)) STORED;
CREATE INDEX units_fts ON units USING gin (search_tsv);
"""),
    # Row-level security: the viewer rules again, from settings the store sets per query.
    # Writes run as the operator (forge.operator = 'on'); anything else sees what its
    # viewer may and writes nothing.
    (3, """
ALTER TABLE units ENABLE ROW LEVEL SECURITY;
ALTER TABLE units FORCE ROW LEVEL SECURITY;
CREATE POLICY forge_viewer ON units
    USING (
        current_setting('forge.operator', true) = 'on'
        OR scope = 'global'
        OR (scope = 'private' AND owner <> '' AND owner = current_setting('forge.population.agent', true))
        OR scope = ANY (string_to_array(current_setting('forge.groups', true), chr(31)))
    )
    WITH CHECK (current_setting('forge.operator', true) = 'on');
"""),
    # Keyword search moves to a table of its own: under row-level security Postgres may not
    # use an index for a condition whose operator is not LEAKPROOF, and tsvector's @@ is not,
    # so the GIN index on units went unused (a scan of every unit per query). unit_fts holds
    # no text, only lexemes; a search finds rows there and reads them through units.
    (4, """
CREATE TABLE unit_fts (
    seq bigint PRIMARY KEY REFERENCES units (seq) ON DELETE CASCADE,
    search_tsv tsvector NOT NULL
);
INSERT INTO unit_fts SELECT seq, search_tsv FROM units;
CREATE INDEX unit_fts_gin ON unit_fts USING gin (search_tsv);
CREATE FUNCTION units_fts_sync() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO unit_fts VALUES (NEW.seq, to_tsvector('english'::regconfig, NEW.search_text))
    ON CONFLICT (seq) DO UPDATE SET search_tsv = excluded.search_tsv;
    RETURN NULL;
END $$;
CREATE TRIGGER units_fts_sync AFTER INSERT OR UPDATE OF search_text ON units
    FOR EACH ROW EXECUTE FUNCTION units_fts_sync();
DROP INDEX units_fts;
ALTER TABLE units DROP COLUMN search_tsv;
"""),
    # Claims: keys recorded once (Store.claim), e.g. each capsule id an exchange acted on.
    (5, """
CREATE TABLE claims (key text PRIMARY KEY, at double precision NOT NULL);
"""),
    # Bulk writes: vectors waiting for the HNSW index (see the module docstring).
    (6, """
ALTER TABLE units ADD COLUMN pending vector;
CREATE INDEX units_pending ON units (seq) WHERE pending IS NOT NULL;
"""),
    # Keyword postings ordered by impact (see the module docstring): a search reads the best
    # few hundred postings of each query lexeme instead of ranking every unit that matches.
    (7, """
CREATE FUNCTION unit_impacts(tsv tsvector) RETURNS TABLE (lexeme text, impact real)
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    WITH t AS (SELECT u.lexeme, coalesce(array_length(u.positions, 1), 1) AS tf FROM unnest(tsv) u),
         d AS (SELECT sum(tf) AS dl FROM t)
    SELECT t.lexeme, (t.tf * 2.2 / (t.tf + 1.2 * (0.25 + 0.75 * d.dl / 16.0)))::real FROM t, d
$$;
CREATE TABLE unit_terms (lexeme text NOT NULL, impact real NOT NULL, seq bigint NOT NULL);
INSERT INTO unit_terms SELECT o.lexeme, o.impact, f.seq FROM unit_fts f, unit_impacts(f.search_tsv) o;
CREATE INDEX unit_terms_impact ON unit_terms (lexeme, impact DESC, seq);
DROP INDEX unit_fts_gin;  -- searches read unit_terms now; every write kept it up for nothing
-- A batch of units is one INSERT: its text is indexed once per statement (transition
-- tables), not by a trigger call per row; a change of text is still handled row by row.
DROP TRIGGER units_fts_sync ON units;
CREATE FUNCTION units_fts_add() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO unit_fts SELECT a.seq, to_tsvector('english'::regconfig, a.search_text) FROM added a;
    RETURN NULL;
END $$;
CREATE TRIGGER units_fts_add AFTER INSERT ON units REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION units_fts_add();
CREATE TRIGGER units_fts_sync AFTER UPDATE OF search_text ON units
    FOR EACH ROW EXECUTE FUNCTION units_fts_sync();
CREATE FUNCTION unit_terms_add() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO unit_terms SELECT o.lexeme, o.impact, a.seq FROM added a, unit_impacts(a.search_tsv) o;
    RETURN NULL;
END $$;
CREATE TRIGGER unit_terms_add AFTER INSERT ON unit_fts REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION unit_terms_add();
CREATE FUNCTION unit_terms_sync() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN  -- the old postings are found by the impacts they were stored with
    DELETE FROM unit_terms t USING unit_impacts(OLD.search_tsv) o
    WHERE t.lexeme = o.lexeme AND t.impact = o.impact AND t.seq = OLD.seq;
    IF TG_OP = 'UPDATE' THEN
        INSERT INTO unit_terms SELECT o.lexeme, o.impact, NEW.seq FROM unit_impacts(NEW.search_tsv) o;
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER unit_terms_change AFTER UPDATE ON unit_fts FOR EACH ROW
    WHEN (OLD.search_tsv IS DISTINCT FROM NEW.search_tsv) EXECUTE FUNCTION unit_terms_sync();
CREATE TRIGGER unit_terms_remove AFTER DELETE ON unit_fts FOR EACH ROW EXECUTE FUNCTION unit_terms_sync();
"""),
    # Tags in a table of their own, with each unit's kind: under row-level security the tag
    # test on units (text[] @>, not LEAKPROOF) could not use its GIN index, so a tag filter
    # read every unit. Here a tag (and kind) is a btree range read with text equality, which
    # is; a filter lists its units through it first (bench/backends.py, 1M units). Like
    # unit_terms it holds no text of a unit, only its tags, kind and seq.
    (8, """
SELECT set_config('forge.operator', 'on', true);  -- every unit, whatever the viewer policy
CREATE TABLE unit_tags (tag text NOT NULL, kind text NOT NULL, seq bigint NOT NULL, PRIMARY KEY (tag, kind, seq));
INSERT INTO unit_tags SELECT DISTINCT t.tag, u.kind, u.seq FROM units u, unnest(u.tags) AS t(tag);
CREATE FUNCTION unit_tags_add() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    INSERT INTO unit_tags SELECT DISTINCT t.tag, a.kind, a.seq FROM added a, unnest(a.tags) AS t(tag);
    RETURN NULL;
END $$;
CREATE TRIGGER units_tags_add AFTER INSERT ON units REFERENCING NEW TABLE AS added
    FOR EACH STATEMENT EXECUTE FUNCTION unit_tags_add();
CREATE FUNCTION unit_tags_remove() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM unit_tags x USING removed r, unnest(r.tags) AS t(tag)
    WHERE x.tag = t.tag AND x.kind = r.kind AND x.seq = r.seq;
    RETURN NULL;
END $$;
CREATE TRIGGER units_tags_remove AFTER DELETE ON units REFERENCING OLD TABLE AS removed
    FOR EACH STATEMENT EXECUTE FUNCTION unit_tags_remove();
CREATE FUNCTION unit_tags_sync() RETURNS trigger LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
    DELETE FROM unit_tags WHERE tag = ANY(OLD.tags) AND kind = OLD.kind AND seq = OLD.seq;
    INSERT INTO unit_tags SELECT DISTINCT t.tag, NEW.kind, NEW.seq FROM unnest(NEW.tags) AS t(tag);
    RETURN NULL;
END $$;
CREATE TRIGGER units_tags_sync AFTER UPDATE OF tags, kind ON units FOR EACH ROW
    WHEN (OLD.tags IS DISTINCT FROM NEW.tags OR OLD.kind IS DISTINCT FROM NEW.kind) EXECUTE FUNCTION unit_tags_sync();
"""),
    # Vectors in the row, not in TOAST: a unit's row with its 384-d vector is ~2.2 KB, over
    # TOAST's 2 KB target, so pgvector's vector (storage external) went out of line and an
    # exact ranking of a filter's 9k units at 1M read each one's TOAST index and chunk besides
    # its row (60-70 ms, against 12 ms in line). Rows written from now on keep it in line
    # (long text still moves out first); older rows move in when rewritten (VACUUM FULL units).
    (9, """
ALTER TABLE units SET (toast_tuple_target = 8160);
ALTER TABLE units ALTER COLUMN embedding SET STORAGE MAIN;
ALTER TABLE units ALTER COLUMN pending SET STORAGE MAIN;
"""),
    # Which units each recall or context event returned (SQLStore.append_events): a unit's
    # trace reads its recalls here instead of decoding up to 100k recall events. Filled from
    # the recalls already logged (json.dumps text; one holding NaN, which jsonb refuses, is skipped).
    (10, """
CREATE TABLE event_units (unit_id text NOT NULL, seq bigint NOT NULL, PRIMARY KEY (unit_id, seq));
INSERT INTO event_units
SELECT DISTINCT h->>'id', e.seq
FROM (SELECT seq, CASE WHEN data ~ '(NaN|Infinity)' THEN '{}'::jsonb ELSE data::jsonb END AS d
      FROM events WHERE op IN ('recall', 'context')) e
CROSS JOIN LATERAL jsonb_array_elements(CASE WHEN jsonb_typeof(e.d->'hits') = 'array' THEN e.d->'hits' ELSE '[]'::jsonb END) h
WHERE jsonb_typeof(h) = 'object' AND jsonb_typeof(h->'id') = 'string';
"""),
)
SCHEMA_VERSION = MIGRATIONS[-1][0]

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
_TEXT_FIELDS = ("id", "content", "scope", "owner")
_ARRAY_TYPES = ("text", "text", "text", "text", "text", "text", "text", "text", "text", "float8", "float8",
                "float8", "int8", "float8", "float8", "float8", "text", "text", "text", "text", "text")
_INSERT_UNITS = (
    f"INSERT INTO units ({_COLUMNS}, search_text, embedding) "
    "SELECT t.id, t.kind, t.content, t.domain, t.task, t.role, "
    "ARRAY(SELECT jsonb_array_elements_text(t.tags::jsonb)), t.scope, t.owner, t.confidence, t.validation, "
    "t.importance, t.access_count, t.last_access, t.created_at, t.updated_at, t.provenance, t.status, t.meta, "
    "t.search_text, t.emb::vector "
    f"FROM unnest({', '.join(f'%s::{t}[]' for t in _ARRAY_TYPES)}) WITH ORDINALITY "
    "AS t(id, kind, content, domain, task, role, tags, scope, owner, confidence, validation, importance, "
    "access_count, last_access, created_at, updated_at, provenance, status, meta, search_text, emb, n) ORDER BY t.n"
)


# Vectors travel in pgvector's binary format (pgvector-python's dumper, registered on the
# connection): formatting 384 floats as text and parsing them back was most of a bulk write.
_INSERT_BINARY = _INSERT_UNITS.replace("t.emb::vector ", "t.emb ", 1).replace("%s::text[]) WITH ORDINALITY", "%b::vector[]) WITH ORDINALITY", 1)
_INSERT_PENDING = _INSERT_BINARY.replace("search_text, embedding) ", "search_text, pending) ", 1)


class _Postgres(Dialect):
    """PostgreSQL's spelling: ``%s`` marks, one array per membership test, tags as a text[]."""

    mark = "%s"
    true = "true"

    def in_(self, expr: str, values: Sequence[Any]) -> tuple[str, list[Any]]:
        return f"{expr} = ANY(%s::text[])", [list(values)]

    def tags_all(self, p: str, tags: Sequence[str], kinds: Sequence[str] = ()) -> tuple[str, list[Any]]:
        # through unit_tags (migration 8): an index row-level security lets the planner use
        one, params = _tagged("tag = %s", kinds)
        return " AND ".join([f"{p}seq IN ({one})"] * len(tags)), [x for t in tags for x in (t, *params)]

    def tags_any(self, p: str, tags: Sequence[str], kinds: Sequence[str] = ()) -> tuple[str, list[Any]]:
        one, params = _tagged("tag = ANY(%s::text[])", kinds)
        return f"{p}seq IN ({one})", [list(tags), *params]

    def encode_tags(self, tags: list[str]) -> list[str]:
        return tags

    def clean_text(self, text: str) -> str:
        return text.replace("\x00", " ")  # the indexed text only; PostgreSQL text cannot hold NUL


def _tagged(test: str, kinds: Sequence[str]) -> tuple[str, list[Any]]:
    """The seqs of units whose tags pass ``test`` (and of one of ``kinds``), from unit_tags;
    the parameters after the tag's."""
    if kinds:
        return f"SELECT seq FROM unit_tags WHERE {test} AND kind = ANY(%s::text[])", [list(kinds)]
    return f"SELECT seq FROM unit_tags WHERE {test}", []


def _listed(f: Filter) -> tuple[str, list[Any]]:
    """The seqs of the units a filter's tags (and kinds) admit, as one query on unit_tags."""
    kinds = sorted(k.value for k in f.kinds)
    if f.tags_all:
        parts = [_tagged("tag = %s", kinds) for _ in f.tags_all]
        sql = " INTERSECT ".join(p[0] for p in parts)
        return sql, [x for t, p in zip(sorted(f.tags_all), parts, strict=True) for x in (t, *p[1])]
    one, params = _tagged("tag = ANY(%s::text[])", kinds)
    return one.replace("SELECT seq", "SELECT DISTINCT seq", 1), [sorted(f.tags_any), *params]


POSTGRES = _Postgres()
_where = POSTGRES.where
_unit_row = POSTGRES.unit_row
_row_unit = POSTGRES.row_unit


def _register_vector(conn: Any) -> None:
    """pgvector's binary dumper for numpy arrays on ``conn`` (vectors are written in binary)."""
    try:
        from pgvector.psycopg import register_vector
    except ImportError:  # pragma: no cover - depends on the install
        raise ConfigError("a postgresql:// store needs pgvector-python: pip install 'forge-memory[postgres]'") from None
    register_vector(conn)


def parse_url(url: str) -> tuple[str, str]:
    """(libpq connection URL, schema) from a ``postgresql://`` store URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("postgresql", "postgres"):
        raise ConfigError(f"not a PostgreSQL URL: {redact_dsn(url)}")
    if parts.password:
        raise ConfigError(
            "put the database password in PGPASSWORD (or ~/.pgpass), not in the URL: "
            "URLs end up in shell history, process lists and logs"
        )
    query = parse_qsl(parts.query, keep_blank_values=True)
    schema = DEFAULT_SCHEMA
    rest = []
    for key, value in query:
        if key == "schema":
            schema = value
        elif key == "password":
            raise ConfigError("put the database password in PGPASSWORD (or ~/.pgpass), not in the URL")
        else:
            rest.append((key, value))
    if not _SCHEMA_NAME.fullmatch(schema):
        raise ConfigError(f"schema {schema!r}: use lower-case letters, digits and _ (at most 63)")
    if not any(k == "connect_timeout" for k, _ in rest):
        rest.append(("connect_timeout", str(CONNECT_TIMEOUT_S)))
    return urlunsplit((parts.scheme, parts.netloc, parts.path, urlencode(rest), "")), schema


def migrate(conn: Any, schema: str, *, upto: int | None = None) -> int:
    """Bring ``schema`` forward to version ``upto`` (default: the newest); return the version.

    Runs in one transaction under an advisory lock, so processes opening the same schema at
    once apply each step exactly once. A schema newer than this code is refused, and so is
    one that holds tables that are not FORGE's.
    """
    psycopg = pg.psycopg()
    target = SCHEMA_VERSION if upto is None else upto
    ident = psycopg.sql.Identifier(schema)
    row = conn.execute(
        "SELECT n.nspname FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace WHERE e.extname = 'vector'"
    ).fetchone()
    if row is None:
        raise StoreError("pgvector is not enabled in this database; run CREATE EXTENSION vector as a superuser")
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"forge-schema:{schema}",))
        conn.execute(psycopg.sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        path = psycopg.sql.SQL("{}, {}").format(ident, psycopg.sql.Identifier(row[0])).as_string(conn)
        conn.execute("SELECT set_config('search_path', %s, true)", (path,))
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = %s", (schema,))}
        if tables and "forge_schema" not in tables:
            raise StoreError(f"schema {schema!r} holds tables that are not FORGE's; pick another with ?schema=NAME")
        conn.execute(psycopg.sql.SQL(
            "CREATE TABLE IF NOT EXISTS {}.forge_schema (version integer PRIMARY KEY, applied_at double precision NOT NULL)"
        ).format(ident))
        current: int = conn.execute(psycopg.sql.SQL("SELECT coalesce(max(version), 0) FROM {}.forge_schema").format(ident)).fetchone()[0]
        if current > SCHEMA_VERSION:
            raise StoreError(
                f"schema {schema!r} is at version {current}; this FORGE reads up to {SCHEMA_VERSION} (upgrade FORGE)"
            )
        for version, sql in MIGRATIONS:
            if current < version <= target:
                conn.execute(sql)
                conn.execute(psycopg.sql.SQL("INSERT INTO {}.forge_schema VALUES (%s, %s)").format(ident), (version, time.time()))
                current = version
    return current


class PostgresStore(SQLStore):
    """A :class:`~forge.store.base.Store` in a PostgreSQL schema (see the module docstring)."""

    dialect = POSTGRES
    _KEY = "seq"
    _VECTOR = "coalesce(embedding, pending)::text"
    _SETTINGS = "settings"
    _LOCK_ROW = " FOR UPDATE"

    def __init__(self, url: str, *, create: bool = True) -> None:
        psycopg = pg.psycopg()
        self._psycopg = psycopg
        self.url = redact_dsn(url)
        dsn, self.schema = parse_url(url)
        self._lock = threading.RLock()
        self._depth = 0
        self._gucs: tuple[str, str, str] | None = None  # the viewer settings the session holds now
        self._ef = 0
        self._freq: dict[str, float] = {}  # lexeme -> share of units holding it (sampled)
        self._freq_at = -1e9
        self._count, self._count_at = 0.0, -1e9  # the planner's estimate of the units, and when read
        self._create = create
        self._dsn = dsn
        self._indexer: threading.Thread | None = None
        self._indexer_lock = threading.Lock()
        self._closing = threading.Event()
        self._wake_indexer = False
        self._bulk = 0  # depth of bulk_load blocks: writes go straight to the table, no HNSW upkeep
        self._conn = pg.connect(dsn)
        try:
            self._setup()
        except psycopg.Error as exc:
            self._conn.close()
            raise StoreError(f"{self.url}: cannot set up the store ({_first_line(exc)})") from None
        except BaseException:
            self._conn.close()
            raise

    def _setup(self) -> None:
        conn = self._conn
        version = conn.execute("SHOW server_version_num").fetchone()[0]
        if int(version) < 150000:
            raise StoreError(f"{self.url}: PostgreSQL {int(version) // 10000} is too old; FORGE needs 15 or newer")
        ext = conn.execute(
            "SELECT n.nspname, e.extversion FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace "
            "WHERE e.extname = 'vector'"
        ).fetchone()
        if ext is None:
            try:
                with conn.transaction():
                    conn.execute("CREATE EXTENSION IF NOT EXISTS vector SCHEMA public")
            except self._psycopg.Error as exc:
                raise StoreError(
                    f"{self.url}: pgvector is not enabled in this database and this role cannot enable it "
                    f"({_first_line(exc)}); run CREATE EXTENSION vector as a superuser"
                ) from None
            ext = ("public", conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0])
        vector_schema, self.pgvector = ext
        if _version(self.pgvector) < (0, 5, 0):
            raise StoreError(f"{self.url}: pgvector {self.pgvector} has no HNSW index; FORGE needs 0.5 or newer")
        if not self._create and conn.execute("SELECT to_regclass(%s)", (f"{self.schema}.forge_schema",)).fetchone()[0] is None:
            raise NotFoundError(f"{self.url}: no FORGE memory in schema {self.schema!r}; create it with 'forge add' or 'forge import'")
        migrate(conn, self.schema)
        ident = self._psycopg.sql.Identifier
        conn.execute(self._psycopg.sql.SQL("SET search_path TO {}, {}").format(ident(self.schema), ident(vector_schema)))
        if _version(self.pgvector) >= (0, 8, 0):
            conn.execute("SET hnsw.iterative_scan = strict_order")
        _register_vector(conn)
        bypass = conn.execute("SELECT rolsuper OR rolbypassrls FROM pg_roles WHERE rolname = current_user").fetchone()
        self.rls = not (bypass and bypass[0])
        self._dim = self._read_dim()
        self._search_path = conn.execute("SHOW search_path").fetchone()[0]
        self._as(None)
        if self._missing_indexes():
            self._heal_index()
        if conn.execute("SELECT EXISTS (SELECT 1 FROM units WHERE pending IS NOT NULL)").fetchone()[0]:
            self._start_indexer()  # a writer stopped before its backlog was indexed: finish it

    # -- plumbing ---------------------------------------------------------------------------
    @property
    def _bulk_key(self) -> str:
        return f"forge-bulk:{self.schema}"

    def _heal_index(self) -> None:
        """A bulk load ended without building its index (its process died): build it now,
        unless the load is still going on in another process (it holds the lock). A role
        that may not create it still opens the memory: searches rank exactly meanwhile."""
        if self._q("SELECT pg_try_advisory_lock(hashtext(%s))", (self._bulk_key,))[0][0]:
            try:
                with contextlib.suppress(StoreError):
                    self._build_index()
            finally:
                self._q("SELECT pg_advisory_unlock(hashtext(%s))", (self._bulk_key,))

    def _missing_indexes(self) -> list[str]:
        """The search indexes a bulk load dropped and has not built again (HNSW only once vectors exist)."""
        names = [n for n in _SEARCH_INDEXES if n != "units_hnsw" or self._dim is not None]
        found = {r[0] for r in self._q(
            "SELECT indexname FROM pg_indexes WHERE schemaname = %s AND indexname = ANY(%s)", (self.schema, names))}
        return [n for n in names if n not in found]

    def _read_dim(self) -> int | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
        return int(row[0]) if row else None

    def _as(self, viewer: Viewer | None) -> None:
        """Set the session's row-level-security viewer (``None``: the operator, for writes)."""
        if viewer is None or viewer.operator:
            gucs = ("on", "", "")
        else:
            gucs = ("off", viewer.agent or "", "\x1f".join(sorted(f"group:{g}" for g in viewer.groups)))
        if gucs != self._gucs:
            self._conn.execute(
                "SELECT set_config('forge.operator', %s, false), set_config('forge.population.agent', %s, false), "
                "set_config('forge.groups', %s, false)",
                gucs,
            )
            self._gucs = gucs

    def _open(self) -> Any:
        if self._conn is None or self._conn.closed:
            raise StoreError(f"{self.url}: the store is closed")
        return self._conn

    @contextmanager
    def _tx(self) -> Iterator[Any]:
        """One write transaction (a savepoint when nested), as the operator; undone whole on error."""
        psycopg = self._psycopg
        with self._lock:
            conn = self._open()
            depth = self._depth
            self._depth = depth + 1
            try:
                with conn.transaction():
                    self._as(None)
                    yield conn
            except BaseException as exc:
                if depth == 0:
                    self._wake_indexer = False
                self._gucs, self._ef = None, 0  # a rollback also undoes session settings made inside
                with contextlib.suppress(psycopg.Error):
                    self._dim = self._read_dim()  # a dimension fixed by an undone write
                if isinstance(exc, psycopg.Error):
                    raise self._mapped(exc) from None
                raise
            finally:
                self._depth = depth
            if depth == 0 and self._wake_indexer:  # committed: the backlog is there to index
                self._wake_indexer = False
                self._start_indexer()

    def _mapped(self, exc: Exception) -> Exception:
        errors = self._psycopg.errors
        if isinstance(exc, errors.UniqueViolation):
            return ConflictError(f"already exists ({_first_line(exc)})")
        if isinstance(exc, errors.ForeignKeyViolation):
            return NotFoundError(f"a relation names a unit that does not exist ({_first_line(exc)})")
        return StoreError(f"{self.url}: {_first_line(exc)}")

    def _q(self, sql: str, params: Sequence[Any] = (), *, viewer: Viewer | None = None) -> list[tuple[Any, ...]]:
        with self._lock:
            conn = self._open()
            try:
                self._as(viewer)
                rows: list[tuple[Any, ...]] = conn.execute(sql, params).fetchall()
                return rows
            except self._psycopg.Error as exc:
                self._gucs, self._ef = None, 0
                raise self._mapped(exc) from None

    def _id_batches(self, ids: Iterable[str]) -> Iterator[list[str]]:
        yield _ids(ids)  # one array; an id PostgreSQL text cannot hold names no unit

    def _vector_value(self, raw: str) -> np.ndarray:
        return _parse_vec(raw)

    def _current_dim(self) -> int | None:
        if self._dim is None:
            with self._lock:
                self._dim = self._read_dim()  # another process may have written the first vectors
        return self._dim

    def _exec(self, sql: str) -> None:
        with self._lock:
            try:
                self._open().execute(sql)
            except self._psycopg.Error as exc:
                self._gucs, self._ef = None, 0
                raise self._mapped(exc) from None

    # -- facts ------------------------------------------------------------------------------
    @property
    def info(self) -> Mapping[str, Any]:
        return {"backend": "postgres", "url": self.url, "schema": self.schema, "ann": "pgvector-hnsw",
                "fts": "tsvector-bm25-impacts", "dim": self._dim, "pgvector": self.pgvector, "rls": self.rls,
                "readonly": False}

    # -- writes -----------------------------------------------------------------------------
    def _fix_dim(self, db: Any, vectors: np.ndarray | None) -> None:
        """Inside a write: the first vectors fix the dimension, column type and HNSW index."""
        if vectors is None:
            return
        dim = vectors.shape[1]
        if self._dim is None:
            db.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", (f"forge-dim:{self.schema}",))
            row = db.execute("SELECT value FROM meta WHERE key = 'dim'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('dim', %s)", (str(dim),))
                db.execute(f"ALTER TABLE units ALTER COLUMN embedding TYPE vector({int(dim)})")
                if not self._bulk:  # a bulk load builds it at its end
                    db.execute(f"CREATE INDEX units_hnsw ON {_SEARCH_INDEXES['units_hnsw']}")
            self._dim = int(row[0]) if row else dim
        if dim != self._dim:
            raise DimensionError(self._dim, dim)

    def _insert_units(self, db: Any, units: list[Unit], vectors: np.ndarray | None, *, actor: str, now: float,
                      log: bool = True) -> None:
        rows = [_unit_row(u) + (None,) for u in units]
        columns = [list(c) for c in zip(*rows, strict=True)]
        if vectors is not None:
            columns[-1] = list(np.asarray(vectors, dtype=np.float32))
        columns[6] = [json.dumps(tags) for tags in columns[6]]  # ragged: one JSON array per unit
        defer = (vectors is not None and not self._bulk and len(units) > INLINE_MAX
                 and self._backlog(db) < PENDING_MAX)
        try:
            # One INSERT over arrays (row-level security rules out COPY), in input order.
            with self._savepoint(db):
                db.execute(_INSERT_PENDING if defer else _INSERT_BINARY if vectors is not None else _INSERT_UNITS, columns)
        except Duplicate:
            raise self._duplicate(db, [u.id for u in units]) from None
        if log:
            self._log_many(db, [(now, "add", u.id, actor, {"kind": u.kind.value, "scope": str(u.scope)}) for u in units])
        if defer:
            self._wake_indexer = True  # started once the outermost transaction commits

    @contextmanager
    def _savepoint(self, db: Any) -> Iterator[None]:
        try:
            with db.transaction():
                yield
        except self._psycopg.errors.UniqueViolation:
            raise Duplicate("a unique key refused the row") from None

    def _vector_sets(self, db: Any, vector: np.ndarray) -> tuple[str, list[Any]]:
        return ", embedding = %s, pending = NULL", [_vec_text(vector)]

    def _check_text(self, value: str, what: str) -> None:
        _no_nul(value, what)

    def _importing(self, matrix: np.ndarray | None) -> AbstractContextManager[None]:
        """An import of many vectors, no fewer than the memory holds, is a bulk load."""
        bulk = matrix is not None and len(matrix) >= BULK_MIN and len(matrix) >= self._q(
            "SELECT count(*) FROM units WHERE embedding IS NOT NULL OR pending IS NOT NULL")[0][0]
        return self.bulk_load() if bulk else contextlib.nullcontext()

    def _backlog(self, db: Any) -> int:
        """Vectors waiting for the HNSW index (counted up to PENDING_MAX, which is all that matters)."""
        waiting: int = db.execute(
            "SELECT count(*) FROM (SELECT 1 FROM units WHERE pending IS NOT NULL LIMIT %s) p", (PENDING_MAX,)
        ).fetchone()[0]
        return waiting

    # -- the HNSW backlog --------------------------------------------------------------------
    @contextmanager
    def bulk_load(self) -> Iterator[None]:
        """Write many units fast: the search indexes (HNSW, keyword postings) are dropped now
        and built once when the block ends.

            with store.bulk_load():
                for batch in batches:
                    store.add(batch.units, batch.vectors)

        Use it to load a big memory (an import of :data:`BULK_MIN` or more vectors does by
        itself). While it lasts, searches in every process scan instead (correct, and
        slower as the table grows); at its end the build blocks other processes' writes (not
        reads) until it is done. Acknowledged writes are in the table whatever happens: if
        this process dies inside, the next process to open the memory builds the index.
        Blocks nest; two processes loading at once take turns. Needs a role that owns the
        memory's tables (it drops and creates indexes).
        """
        with self._lock:
            first = not self._bulk
            if first:
                self._q("SELECT pg_advisory_lock(hashtext(%s))", (self._bulk_key,))
                try:
                    with self._tx() as db:
                        for name in _SEARCH_INDEXES:
                            db.execute(f"DROP INDEX IF EXISTS {name}")
                        db.execute("UPDATE units SET embedding = pending, pending = NULL WHERE pending IS NOT NULL")
                except StoreError as exc:
                    self._q("SELECT pg_advisory_unlock(hashtext(%s))", (self._bulk_key,))
                    raise StoreError(f"cannot start a bulk load: {exc}") from None
            self._bulk += 1
        try:
            yield
        finally:
            with self._lock:
                self._bulk -= 1
                if not self._bulk:  # the last block out builds the index
                    try:
                        self._build_index()
                    finally:
                        self._q("SELECT pg_advisory_unlock(hashtext(%s))", (self._bulk_key,))

    def _build_index(self) -> None:
        """Build the keyword postings' index, and the HNSW index over every vector (no vectors
        yet: the first write that carries some creates it), with memory enough for pgvector
        to build its graph in memory."""
        with self._lock:
            self._dim = self._read_dim()
            with self._tx() as db:  # vectors other processes wrote meanwhile
                db.execute("UPDATE units SET embedding = pending, pending = NULL WHERE pending IS NOT NULL")
                rows = db.execute("SELECT count(*) FROM units WHERE embedding IS NOT NULL").fetchone()[0]
            need = min(BUILD_MEMORY_MAX, max(64 << 20, rows * ((self._dim or 0) * 4 + 1024)))
            have = self._q("SELECT setting::bigint * 1024 FROM pg_settings WHERE name = 'maintenance_work_mem'")[0][0]
            try:
                if need > have:
                    self._exec(f"SET maintenance_work_mem = '{need // (1 << 20)}MB'")
                for name in self._missing_indexes():
                    self._exec(f"CREATE INDEX IF NOT EXISTS {name} ON {_SEARCH_INDEXES[name]}")
            except StoreError as exc:
                raise StoreError(f"cannot build the search indexes (the next open of this memory tries again): {exc}") from None
            finally:
                self._exec("RESET maintenance_work_mem")

    def index_pending(self, *, limit: int | None = None) -> int:
        """Move waiting vectors into the HNSW index, :data:`INDEX_BATCH` per transaction, on a
        connection of its own (searches and writes go on meanwhile); how many were moved.

        The background indexer calls this; call it yourself to wait until a bulk load is
        indexed. Rows another process is indexing right now are skipped, not waited for.
        """
        moved = 0
        conn = pg.connect(self._dsn)
        try:
            conn.execute("SELECT set_config('search_path', %s, false), set_config('forge.operator', 'on', false)",
                         (self._search_path,))
            while limit is None or moved < limit:
                if self._closing.is_set():
                    break
                n = INDEX_BATCH if limit is None else min(INDEX_BATCH, limit - moved)
                with conn.transaction():
                    done = conn.execute(
                        "UPDATE units SET embedding = pending, pending = NULL WHERE seq IN ("
                        "SELECT seq FROM units WHERE pending IS NOT NULL ORDER BY seq LIMIT %s FOR UPDATE SKIP LOCKED)",
                        (n,),
                    ).rowcount
                if done <= 0:
                    break
                moved += done
        except self._psycopg.Error as exc:
            raise StoreError(f"{self.url}: cannot index pending vectors ({_first_line(exc)})") from None
        finally:
            conn.close()
        return moved

    def _start_indexer(self) -> None:
        with self._indexer_lock:
            if self._closing.is_set() or (self._indexer is not None and self._indexer.is_alive()):
                return
            self._indexer = threading.Thread(target=self._index_in_background, name="forge-pg-indexer", daemon=True)
            self._indexer.start()

    def _index_in_background(self) -> None:
        # Best effort: what it leaves pending stays searchable (exactly) and the next writer
        # or the next open of this memory indexes it.
        with contextlib.suppress(StoreError):
            while self.index_pending() > 0 and not self._closing.is_set():
                pass

    def _log_many(self, db: Any, events: Sequence[EventRow]) -> None:
        if not events:
            return
        with db.cursor() as cur, cur.copy("COPY events (ts, op, unit_id, actor, data) FROM STDIN") as copy:
            for ts, op, uid, who, data in events:
                copy.write_row((ts, op, uid, who, json.dumps(dict(data), default=str)))

    def erase(self, unit_id: str, *, actor: str = "", reason: str = "") -> dict[str, Any]:
        """Remove a unit and every trace of its text (see :mod:`forge.store.erase`); the tombstone's data.

        Its keyword postings (``unit_fts``, ``unit_terms``) go with its row, by cascade and
        trigger, and its vector is in the row. The old row versions stay on disk until
        (auto)vacuum reclaims them, as for any PostgreSQL delete; no query can read them.
        """
        with self._tx() as db:
            return erase_rows(self, db, unit_id, actor=actor, reason=reason,
                              delete_unit=lambda db, uid: db.execute("DELETE FROM units WHERE id = %s", (uid,)))

    def touch(self, ids: Sequence[str], *, at: float | None = None) -> None:
        """Count a recall of ``ids`` now (one statement; concurrent recalls add up)."""
        if not ids:
            return
        at = time.time() if at is None else at
        counts: dict[str, int] = {}
        for i in ids:
            counts[i] = counts.get(i, 0) + 1
        keys = sorted(counts)  # one lock order for every writer: no deadlocks between recalls
        with self._tx() as db:
            db.execute(
                "UPDATE units u SET access_count = u.access_count + t.n, "
                "last_access = greatest(coalesce(u.last_access, a.at), a.at) "
                "FROM unnest(%s::text[], %s::bigint[]) AS t(id, n), (SELECT %s::float8 AS at) a "
                "WHERE u.id = t.id",
                (keys, [counts[k] for k in keys], at),
            )

    # -- search -----------------------------------------------------------------------------
    def _tag_listing(self, f: Filter) -> int | None:
        """At most how many units a filter with tags admits, counted in unit_tags (tag and
        kind) up to LIST_FIRST_MAX + 1; None for a filter without tags."""
        if not f.tags_all and not f.tags_any:
            return None
        kinds = sorted(k.value for k in f.kinds)
        one, params = _tagged("tag = q.tag", kinds)
        counted = f"SELECT (SELECT count(*) FROM ({one} LIMIT %s) c) AS n FROM unnest(%s::text[]) AS q(tag)"
        bound = LIST_FIRST_MAX + 1
        if f.tags_all:
            return int(self._q(f"SELECT min(n) FROM ({counted}) x", (*params, bound, sorted(f.tags_all)))[0][0] or 0)
        return int(self._q(f"SELECT sum(n) FROM ({counted}) x", (*params, bound, sorted(f.tags_any)))[0][0] or 0)

    def vector_search(self, query: np.ndarray, *, k: int, viewer: Viewer, filter: Filter = Filter()) -> list[Hit]:
        k = _count_arg(k, "k")
        query = self._search_vector(query)
        if self._dim is None or k <= 0:
            return []
        where, params = _where(viewer, filter)
        q = _vec_text(query)
        with self._lock:
            listed = self._tag_listing(filter)
            rows = []
            if listed is not None and listed <= LIST_FIRST_MAX:
                # The filter's tags admit few units: list them through unit_tags and rank them
                # exactly, without an HNSW walk that most of its candidates would fail. As one
                # array (an InitPlan) the seqs are read in one ordered pass over units' seq
                # index: 12 ms for 9k units at 1M, against 25 ms joined row by row (EXPLAIN
                # ANALYZE, bench/README.md), 60-70 ms while the vectors were TOASTed.
                among, among_params = _listed(filter)
                rest, rest_params = _where(viewer, dataclasses.replace(filter, tags_all=frozenset(), tags_any=frozenset()))
                rows = self._q(
                    f"SELECT id, 1 - (embedding <=> %s::vector) FROM units WHERE seq = ANY(ARRAY({among})) AND {rest} "
                    f"AND embedding IS NOT NULL ORDER BY (embedding <=> %s::vector) + 0, seq LIMIT %s",
                    (q, *among_params, *rest_params, q, k), viewer=viewer,
                )
            else:
                ef = _ef_search(k, self._unit_count())
                if ef != self._ef:
                    self._exec(f"SET hnsw.ef_search = {int(ef)}")
                    self._ef = ef
                rows = self._q(
                    f"SELECT id, 1 - (embedding <=> %s::vector) FROM units WHERE {where} AND embedding IS NOT NULL "
                    f"ORDER BY embedding <=> %s::vector LIMIT %s",
                    (q, *params, q, k), viewer=viewer,
                )
            if len(rows) < k and (listed is None or listed > LIST_FIRST_MAX):
                # Fewer than k passed the viewer and filter among the index's candidates: rank
                # exactly the rows that pass ("+ 0" keeps the planner off the HNSW index).
                rows = self._q(
                    f"SELECT id, 1 - (embedding <=> %s::vector) FROM units WHERE {where} AND embedding IS NOT NULL "
                    f"ORDER BY (embedding <=> %s::vector) + 0, seq LIMIT %s",
                    (q, *params, q, k), viewer=viewer,
                )
            # Vectors not in the index yet (a bulk write's backlog): ranked exactly, merged.
            pending = self._q(
                f"SELECT id, 1 - (pending <=> %s::vector) FROM units WHERE pending IS NOT NULL AND {where} "
                f"ORDER BY (pending <=> %s::vector), seq LIMIT %s",
                (q, *params, q, k), viewer=viewer,
            )
        if pending:
            rows = sorted([*rows, *pending], key=lambda r: -float(r[1]))[:k]
        return [Hit(r[0], float(r[1])) for r in rows]

    def keyword_search(self, query: str, *, k: int, viewer: Viewer, filter: Filter = Filter()) -> list[Hit]:
        k = _count_arg(k, "k")
        words = self._search_words(query)  # \w+ words: never a NUL, which PostgreSQL text cannot hold
        if not words or k <= 0:
            return []
        # The query's lexemes as the index holds them (english stems, stop words gone).
        lexemes = self._q("SELECT tsvector_to_array(to_tsvector('english', %s))", (" ".join(words),))[0][0]
        lexemes = self._informative(list(lexemes or ()))
        if not lexemes:
            return []
        idf = self._idf(lexemes)
        terms = (list(idf), list(idf.values()))
        where, params = _where(viewer, filter, alias="u")
        # The best postings of each lexeme, summed; then the viewer and filter among the best
        # units (a join with few rows). A filter whose tags admit few units takes the best
        # postings among those (unit_tags, read before any unit). When too few pass, the heads
        # are widened, then every posting of the lexemes is ranked.
        with self._lock:
            listed = self._tag_listing(filter)
        among, among_params = "", []
        if listed is not None and listed <= LIST_FIRST_MAX:
            f = filter
            tags = POSTGRES.tags_all("", sorted(f.tags_all), sorted(k.value for k in f.kinds)) if f.tags_all else \
                POSTGRES.tags_any("", sorted(f.tags_any), sorted(k.value for k in f.kinds))
            among, among_params = f"AND {tags[0]} ", tags[1]
        want = max(k * 8, 64)
        while True:
            rows = self._q(
                "SELECT u.id, f.r FROM (SELECT t.seq, sum(q.w * t.impact) AS r "
                "FROM unnest(%s::text[], %s::float8[]) AS q(lexeme, w) CROSS JOIN LATERAL ("
                f"SELECT seq, impact FROM unit_terms WHERE lexeme = q.lexeme {among}ORDER BY impact DESC, seq LIMIT %s) t "
                f"GROUP BY t.seq ORDER BY r DESC, t.seq LIMIT %s) f JOIN units u ON u.seq = f.seq WHERE {where} "
                "ORDER BY f.r DESC, u.seq LIMIT %s",
                (*terms, *among_params, want, want, *params, k), viewer=viewer,
            )
            if len(rows) >= k or want >= KEYWORD_HEADS_MAX or among:  # among the listed: the heads already hold what passes
                break
            # the share of the heads that passed says how far down k passing units lie
            want = min(KEYWORD_HEADS_MAX, max(want * 8, int(2 * k * want / max(len(rows), 1))))
        if len(rows) < k:
            rows = self._q(
                "SELECT u.id, sum(q.w * t.impact) AS r FROM unnest(%s::text[], %s::float8[]) AS q(lexeme, w) "
                f"JOIN unit_terms t ON t.lexeme = q.lexeme JOIN units u ON u.seq = t.seq WHERE {where} "
                "GROUP BY u.seq, u.id ORDER BY r DESC, u.seq LIMIT %s",
                (*terms, *params, k), viewer=viewer,
            )
        return [Hit(r[0], float(r[1])) for r in rows]

    def _idf(self, lexemes: list[str]) -> dict[str, float]:
        """BM25's inverse document frequency of each lexeme: from the sample of units (see
        :meth:`_informative`), or counted exactly in a memory too small to sample."""
        self._refresh_sample()
        if self._freq:
            n = self._unit_count()
            df = {w: self._freq.get(w, 0.0) * n for w in lexemes}
        else:
            rows = self._q(
                "SELECT q.l, (SELECT count(*) FROM unit_terms t WHERE t.lexeme = q.l), "
                "(SELECT count(*) FROM unit_fts) FROM unnest(%s::text[]) AS q(l)", (lexemes,)
            )
            df = {r[0]: float(r[1]) for r in rows}
            n = float(rows[0][2]) if rows else 0.0
        return {w: math.log(1.0 + (n - df[w] + 0.5) / (df[w] + 0.5)) for w in lexemes}

    def _informative(self, lexemes: list[str]) -> list[str]:
        """Drop lexemes found in more than COMMON_TERM_SHARE of all units (keep the rarest if all are).

        Every unit matching any query word is ranked, so one very common word makes a query
        cost O(n) while adding almost nothing to the ranking (the SQLite store does the same
        with FTS5's vocabulary). Shares come from a sample of up to SAMPLE_UNITS units' lexemes
        (TABLESAMPLE: whole pages, cheap), taken at most once a minute. Postgres's own lexeme
        statistics are no use here: ``pg_stats`` hides them from roles under row-level security.
        """
        if len(lexemes) < 2:
            return lexemes
        self._refresh_sample()
        if not self._freq:
            return lexemes
        freq = {w: self._freq.get(w, 0.0) for w in lexemes}
        keep = [w for w in lexemes if freq[w] <= COMMON_TERM_SHARE]
        return keep or [min(lexemes, key=freq.__getitem__)]

    def _refresh_sample(self) -> None:
        now = time.monotonic()
        if now - self._freq_at > 60:
            self._freq, self._freq_at = self._sample_lexemes(), now

    def _unit_count(self) -> float:
        """How many units the memory holds: the planner's estimate, read at most once a minute."""
        now = time.monotonic()
        if now - self._count_at > 60:
            est = self._q("SELECT reltuples FROM pg_class WHERE oid = 'unit_fts'::regclass")[0][0]
            self._count = float(est if est and est > 0 else self._q("SELECT count(*) FROM unit_fts")[0][0])
            self._count_at = now
        return self._count

    def _sample_lexemes(self) -> dict[str, float]:
        """lexeme -> share of sampled units holding it; empty below 1,000 units."""
        n = self._unit_count()
        if n < 1000:
            return {}
        pct = min(100.0, 100.0 * 2 * SAMPLE_UNITS / n)
        rows = self._q(
            "SELECT tsvector_to_array(search_tsv) FROM unit_fts TABLESAMPLE SYSTEM (%s) LIMIT %s", (pct, SAMPLE_UNITS)
        )
        counts: dict[str, int] = {}
        for (lexs,) in rows:
            for lex in lexs:
                counts[lex] = counts.get(lex, 0) + 1
        return {lex: c / len(rows) for lex, c in counts.items()} if rows else {}

    # -- bulk -------------------------------------------------------------------------------
    def _stats_extra(self) -> dict[str, Any]:
        return {
            "pending_vectors": self._q("SELECT count(*) FROM units WHERE pending IS NOT NULL")[0][0],
            "indexes_missing": self._missing_indexes(),  # during a bulk load: searches scan instead
            "embedder": self.settings().get("embedder"),
            "url": self.url,
            "schema": self.schema,
        }

    def flush(self) -> None:
        """Nothing waits to be written: every write is committed when its call returns."""

    def close(self) -> None:
        """Close; a background indexer stops after its current batch (the rest stays pending)."""
        self._closing.set()
        with self._indexer_lock:
            indexer = self._indexer
        if indexer is not None and indexer is not threading.current_thread():
            indexer.join()
        with self._lock:
            if self._conn is not None and not self._conn.closed:
                self._conn.close()


# -- helpers --------------------------------------------------------------------------------


def _ef_search(k: int, units: float) -> int:
    """HNSW's candidate list for a top-k search over ``units``: at least 2k, and pgvector's
    default up to 100k units, growing as (units / 100k) ** 0.7 beyond, since a bigger graph
    needs a longer list for the same recall. At 1M units (bench/backends.py's vectors) 40
    found 0.70 of the exact top 10 in 2.2 ms; 200 finds 0.956 (what SQLite's usearch index
    finds there) in 3.6 ms. At 100k, 40 found 0.97."""
    return int(min(1000, max(2 * k, EF_SEARCH_MIN * max(1.0, units / 100_000) ** 0.7)))


def _first_line(exc: Exception) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else type(exc).__name__


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _no_nul(value: str, what: str) -> None:
    if "\x00" in value:
        raise ValidationError(f"{what} contains a NUL character, which PostgreSQL text cannot hold")


def _ids(ids: Iterable[str]) -> list[str]:
    return [i for i in ids if isinstance(i, str) and "\x00" not in i]


def _vec_text(vec: np.ndarray) -> str:
    # Nine significant digits round-trip every float32 exactly through pgvector's float4
    # input; one %-format over the whole vector is ~3x faster than a repr per number, which
    # was most of a bulk write's time in Python.
    vec = np.asarray(vec, dtype=np.float32).reshape(-1)
    return _vec_format(len(vec)) % tuple(vec.tolist())


@functools.lru_cache(maxsize=8)
def _vec_format(dim: int) -> str:
    return "[" + ",".join(["%.9g"] * dim) + "]"


def _parse_vec(text: str) -> np.ndarray:
    return np.array(text.strip("[]").split(","), dtype=np.float64).astype(np.float32)
