"""Database root-cause diagnosis on a real PostgreSQL server (the LLMA-Mem task stream).

Each episode creates a scratch database ``forge_diag_<epoch>_<pid>_<hex>``, loads a small shop
schema (customers, products, orders, payments, events), resets its statistics, runs a light
normal workload and then really injects one of the five MultiAgentBench anomalies:

=================  ==========================================================================
anomaly            what runs (evidence it leaves)
=================  ==========================================================================
INSERT_LARGE_DATA  40-60 batch INSERTs of 2,000 rows into one table (``n_tup_ins`` >= 50k,
                   the biggest table)
LOCK_CONTENTION    a session holds a row lock in an open transaction while 2-3 sessions wait
                   on the same row (ungranted locks in ``pg_locks``, ``wait_event_type`` Lock)
VACUUM             autovacuum disabled on a table, then non-HOT updates of every row and
                   deletes (``n_dead_tup`` in the tens of thousands, never vacuumed)
REDUNDANT_INDEX    two more indexes on an already indexed column, then writes and lookups
                   (several indexes with the same columns, all but one with ``idx_scan`` 0)
FETCH_LARGE_DATA   12-60 ``SELECT *`` of a whole table (``seq_scan`` >= 10, ``seq_tup_read``
                   >= 150k)
=================  ==========================================================================

Harder episodes (difficulty 1-2) add sub-threshold distractors: a modest insert, a few dead
tuples, an unused (non-duplicate) index, a few full scans. ``reset`` returns only once the
evidence is visible in the statistics views, so every episode is solvable.

Agents call diagnostic tools (``check_*``) that run real queries over ``pg_stat_user_tables``,
``pg_stat_user_indexes``, ``pg_locks``, ``pg_stat_activity``, ``pg_class`` (and
``pg_stat_statements`` when the server preloads it; this one does not) and answer with
``answer:<ANOMALY>``.

Rewards and thresholds (return = sum of step rewards):

========================  =====  =====  =======  =============  =========
env                       tau    theta  success  major failure  max_steps
========================  =====  =====  =======  =============  =========
postgres-diagnosis        -0.5   0.89   >= 0.5   <= -1.0        8
========================  =====  =====  =======  =============  =========

A tool call costs ``tool_cost`` (0.02) so shorter investigations score higher; a right answer
earns +1, a wrong one -1 (below tau, so the attempt aborts); both end the episode. theta = 0.89
asks for a right answer after at most five tool calls (return 0.90; six calls return 0.88); running out of steps returns about
-0.16 (neither success nor major failure).

Cleanup: ``close()`` and the next ``reset`` release locks, join the waiting threads, close every
connection and drop the scratch database (``WITH (FORCE)``); a finalizer does the same if an env
is dropped unclosed, and constructing an env drops ``forge_diag_*`` databases left by crashed
processes (older than this process, creator gone).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.envs.base import EnvSpec, StepResult, check_action
from forge.errors import EnvError, UserError
from forge.store import pg
from forge.store.pg import psycopg as _psycopg

__all__ = [
    "ANOMALIES",
    "DEFAULT_DSN",
    "TOOLS",
    "DiagnosisTask",
    "PostgresDiagnosisEnv",
    "PostgresEnvError",
    "accuracy",
    "cleanup_leftovers",
    "diagnose",
    "diagnosis_stream",
    "oracle_action",
    "task_for_seed",
]

DEFAULT_DSN = "postgresql://postgres@127.0.0.1:5432/postgres"
DB_PREFIX = "forge_diag_"

ANOMALIES: tuple[str, ...] = (
    "INSERT_LARGE_DATA",
    "LOCK_CONTENTION",
    "VACUUM",
    "REDUNDANT_INDEX",
    "FETCH_LARGE_DATA",
)

_CAUSES = {
    "INSERT_LARGE_DATA": "very large volumes of rows being inserted",
    "LOCK_CONTENTION": "sessions blocked waiting for locks that other sessions hold",
    "VACUUM": "dead tuples piling up (table bloat) because vacuum is not running",
    "REDUNDANT_INDEX": "duplicate indexes that slow every write and waste space",
    "FETCH_LARGE_DATA": "queries that read and fetch whole large tables again and again",
}

TOOLS: Mapping[str, str] = {
    "check_table_stats": "rows inserted, updated, deleted, live and dead per table",
    "check_dead_tuples": "dead tuples, dead share, last vacuum and table options per table",
    "check_locks": "sessions waiting for locks and the sessions blocking them",
    "check_indexes": "every index: table, columns, unique, scans since reset, size",
    "check_active_queries": "client sessions: state, wait event, age, last query",
    "check_table_sizes": "table, heap and index sizes, live rows, bytes per live row",
    "check_seq_scans": "sequential scans, rows they read, index scans per table",
}

_PROCESS_STARTED = time.time()
_NAME_RE = re.compile(rf"^{DB_PREFIX}(\d+)_(\d+)_[0-9a-f]+$")
_TABLES = ("customers", "products", "orders", "payments", "events")

# Oracle thresholds; injections sit well above them, distractors well below.
_INSERT_MIN = 50_000
_DEAD_MIN, _DEAD_PCT_MIN = 2_000, 20.0
_SEQ_READ_MIN, _SEQ_SCANS_MIN = 150_000, 10


class PostgresEnvError(EnvError):
    """The diagnosis server is unreachable or failed while injecting or cleaning."""


@dataclass(frozen=True, slots=True)
class DiagnosisTask:
    """One task of the stream: the seed to reset with and what it will inject."""

    seed: int
    anomaly: str
    difficulty: int
    index: int = 0


def task_for_seed(seed: int) -> DiagnosisTask:
    """The anomaly and difficulty ``reset(seed=seed)`` injects; pure, no server needed."""
    return _draw(seed)[0]


def _draw(seed: int) -> tuple[DiagnosisTask, random.Random]:
    # One stream per seed: the task first, then the injection's tables and sizes.
    rng = random.Random(f"forge-diag:{seed}")
    task = DiagnosisTask(seed=seed, anomaly=rng.choice(ANOMALIES), difficulty=rng.randrange(3))
    return task, rng


def diagnosis_stream(
    n: int, *, seed: int, difficulty: int | None = None
) -> Iterator[DiagnosisTask]:
    """``n`` tasks, each block of five a shuffled permutation of the anomalies (balanced).

    Difficulty rises over the stream (first third 0, then 1, then 2) unless ``difficulty``
    fixes it. Seeds are drawn from ``seed`` and kept only when :func:`task_for_seed` maps them
    to the wanted anomaly and difficulty, so replaying a task needs nothing but its seed.
    """
    if n < 0:
        raise UserError(f"diagnosis_stream needs n >= 0, got {n}")
    if difficulty is not None and difficulty not in (0, 1, 2):
        raise UserError(f"difficulty must be 0, 1 or 2, got {difficulty}")
    rng = random.Random(f"forge-diag-stream:{seed}")
    used: set[int] = set()
    block: list[str] = []
    for i in range(n):
        if not block:
            block = list(ANOMALIES)
            rng.shuffle(block)
        anomaly = block.pop()
        level = difficulty if difficulty is not None else min(2, 3 * i // max(n, 1))
        while True:
            s = rng.randrange(2**31)
            task = task_for_seed(s)
            if s not in used and task.anomaly == anomaly and task.difficulty == level:
                used.add(s)
                yield DiagnosisTask(seed=s, anomaly=anomaly, difficulty=level, index=i)
                break


def accuracy(outcomes: Iterable[tuple[str, str | None]]) -> float:
    """Share of (expected, answered) pairs answered right; no answer counts as wrong."""
    pairs = list(outcomes)
    if not pairs:
        return 0.0
    return sum(1 for want, got in pairs if got is not None and got == want) / len(pairs)


# --------------------------------------------------------------------------- connections


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def _connect(
    dsn: str, *, dbname: str | None = None, app: str, timeout: float, autocommit: bool = True
) -> Any:
    kwargs: dict[str, Any] = {"connect_timeout": max(1, round(timeout)), "application_name": app}
    if dbname is not None:
        kwargs["dbname"] = dbname
    return pg.connect(dsn, autocommit=autocommit, error=PostgresEnvError,
                      advice="; start the server or pass dsn=... (or set FORGE_PG_DSN)", **kwargs)


def _close_quietly(conn: Any) -> None:
    if conn is None:
        return
    with contextlib.suppress(Exception):  # cleanup must go on
        conn.close()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cleanup_leftovers(*, dsn: str = DEFAULT_DSN, timeout: float = 3.0) -> list[str]:
    """Drop ``forge_diag_*`` databases left by crashed runs; returns the names dropped.

    Only databases created before this process started are considered. One whose creator pid
    (in its name) no longer exists is force-dropped; one whose creator lives is dropped only
    if nobody is connected, so a concurrent live run keeps its database.
    """
    admin = _connect(dsn, app="forge_diag_admin", timeout=timeout)
    dropped = []
    try:
        names = [
            r[0]
            for r in admin.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE 'forge\\_diag\\_%'"
            ).fetchall()
        ]
        for name in names:
            m = _NAME_RE.match(name)
            if not m or int(m.group(1)) >= int(_PROCESS_STARTED):
                continue
            if int(m.group(2)) == os.getpid():
                continue
            in_use = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (name,)
            ).fetchone()[0]
            # Asked first because a plain DROP of a database in use waits 5 s before failing.
            if not _pid_alive(int(m.group(2))):
                admin.execute(f"DROP DATABASE IF EXISTS {_ident(name)} WITH (FORCE)")
            elif in_use:
                continue
            else:
                try:  # no FORCE: a live creator may connect at any moment
                    admin.execute(f"DROP DATABASE IF EXISTS {_ident(name)}")
                except _psycopg().Error:
                    continue
            dropped.append(name)
    except _psycopg().Error as exc:
        raise PostgresEnvError(
            f"cleaning leftover {DB_PREFIX}* databases failed: {_one_line(exc)}"
        ) from None
    finally:
        _close_quietly(admin)
    return dropped


def _ident(name: str) -> str:
    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise UserError(f"refusing to quote unexpected identifier {name!r}")
    return f'"{name}"'


# --------------------------------------------------------------------------- one episode


@dataclass
class _Episode:
    """Everything one episode opened on the server; teardown frees it in a safe order.

    Kept apart from the env so a weakref finalizer can clean up without keeping it alive.
    """

    dsn: str
    dbname: str
    timeout: float
    tools: Any = None
    app: Any = None
    holder: Any = None
    waiters: list[Any] = field(default_factory=list)
    threads: list[threading.Thread] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)
    done: bool = False

    def teardown(self) -> None:
        if self.done:
            return
        self.done = True
        errors: list[str] = []
        if self.holder is not None:
            try:
                self.holder.rollback()  # releases the row lock; the waiters then finish
            except Exception as exc:  # noqa: BLE001
                errors.append(_one_line(exc))
        for t in self.threads:
            t.join(timeout=5)
        stuck = any(t.is_alive() for t in self.threads)
        try:
            admin = _connect(self.dsn, app="forge_diag_admin", timeout=self.timeout)
        except PostgresEnvError as exc:
            admin = None
            errors.append(str(exc))
        try:
            if stuck and admin is not None:
                # Terminating the blocked backends makes their execute() raise and return.
                admin.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                    (self.dbname,),
                )
                for t in self.threads:
                    t.join(timeout=5)
            for conn in (*self.waiters, self.holder, self.app, self.tools):
                _close_quietly(conn)
            if admin is not None:
                admin.execute(f"DROP DATABASE IF EXISTS {_ident(self.dbname)} WITH (FORCE)")
        except Exception as exc:  # noqa: BLE001 - report, but never leak the rest
            errors.append(_one_line(exc))
        finally:
            _close_quietly(admin)
        if errors:
            raise PostgresEnvError(
                f"cleaning up {self.dbname} failed: {'; '.join(errors)}; it will be dropped "
                "by the next run's leftover cleanup"
            )


_SCHEMA = [
    """CREATE TABLE customers (id int PRIMARY KEY, name text NOT NULL, email text NOT NULL,
        balance numeric(10,2) NOT NULL DEFAULT 0, created_at timestamptz NOT NULL)""",
    """INSERT INTO customers SELECT g, 'customer ' || g, 'c' || g || '@example.com',
        (g % 1000) / 7.0, now() - g * interval '1 minute' FROM generate_series(1, 2000) g""",
    """CREATE TABLE products (id int PRIMARY KEY, name text NOT NULL, price numeric(10,2),
        stock int NOT NULL)""",
    """INSERT INTO products SELECT g, 'product ' || g, 1 + (g % 97), 100 + g % 50
        FROM generate_series(1, 500) g""",
    """CREATE TABLE orders (id int PRIMARY KEY, customer_id int NOT NULL, product_id int NOT NULL,
        qty int NOT NULL, status text NOT NULL, note text, created_at timestamptz NOT NULL)""",
    """INSERT INTO orders SELECT g, 1 + g % 2000, 1 + g % 500, 1 + g % 5,
        (ARRAY['new','paid','shipped'])[1 + g % 3], md5(g::text), now() - g * interval '1 second'
        FROM generate_series(1, 20000) g""",
    "CREATE INDEX orders_customer_id_idx ON orders (customer_id)",
    """CREATE TABLE payments (id int PRIMARY KEY, order_id int NOT NULL, amount numeric(10,2),
        paid_at timestamptz NOT NULL)""",
    """INSERT INTO payments SELECT g, 1 + (g * 3) % 20000, 5 + g % 200, now() - g * interval '2 s'
        FROM generate_series(1, 5000) g""",
    "CREATE INDEX payments_order_id_idx ON payments (order_id)",
    """CREATE TABLE events (id bigserial PRIMARY KEY, kind text NOT NULL, payload text,
        created_at timestamptz NOT NULL DEFAULT now())""",
    """INSERT INTO events (kind, payload) SELECT (ARRAY['login','view','cart'])[1 + g % 3],
        md5(g::text) FROM generate_series(1, 3000) g""",
    "VACUUM ANALYZE customers, products, orders, payments, events",
]

_INDEXED = {"orders": "customer_id", "payments": "order_id"}


def _fetch(conn: Any, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
    cur = conn.execute(sql, params)
    names = [d.name for d in cur.description]
    return [dict(zip(names, row, strict=True)) for row in cur.fetchall()]


def _waiter(conn: Any, sql: str, params: tuple[Any, ...]) -> None:
    # Terminated on cleanup is the expected end, not an error.
    with contextlib.suppress(Exception):
        conn.execute(sql, params)


def _workload(app: Any, rng: random.Random) -> None:
    """A little ordinary traffic, so the statistics are never empty or trivially clean."""
    for _ in range(25):
        app.execute(
            "SELECT * FROM orders WHERE customer_id = %s", (rng.randint(1, 2000),)
        ).fetchall()
    for _ in range(15):
        app.execute("SELECT * FROM customers WHERE id = %s", (rng.randint(1, 2000),)).fetchall()
    for _ in range(3):
        app.execute("SELECT * FROM products ORDER BY price DESC LIMIT 20").fetchall()
    for _ in range(8):
        app.execute("INSERT INTO events (kind, payload) VALUES ('view', md5(random()::text))")
    for _ in range(8):
        app.execute(
            "UPDATE customers SET balance = balance + 1 WHERE id = %s", (rng.randint(1, 2000),)
        )


def _distract(app: Any, rng: random.Random, level: int) -> list[str]:
    """``level`` sub-threshold look-alikes of other anomalies (harder episodes)."""
    kinds = ["insert", "dead", "index", "scans"]
    rng.shuffle(kinds)
    chosen = sorted(kinds[:level])
    for kind in chosen:
        if kind == "insert":
            app.execute(
                "INSERT INTO events (kind, payload) SELECT 'import', md5(g::text) "
                "FROM generate_series(1, 3000) g"
            )
        elif kind == "dead":
            app.execute("UPDATE products SET stock = stock - 1 WHERE id <= 150")
        elif kind == "index":
            app.execute("CREATE INDEX orders_created_at_idx ON orders (created_at)")
        else:
            for _ in range(6):
                app.execute("SELECT count(*) FROM payments").fetchall()
    return chosen


class PostgresDiagnosisEnv:
    """Find which of five anomalies really injected into a scratch database slows it down.

    ``dsn`` defaults to ``FORGE_PG_DSN`` (read when the env is built) or
    :data:`DEFAULT_DSN`; the DSN's database is only used to create and drop scratch ones.
    Constructing the env checks the server and drops leftovers of crashed runs.
    """

    def __init__(
        self,
        *,
        dsn: str | None = None,
        max_steps: int = 8,
        tool_cost: float = 0.02,
        difficulty: int | None = None,
        connect_timeout: float = 3.0,
    ) -> None:
        if max_steps < 2:
            raise UserError(f"max_steps must be at least 2 (a tool and an answer), got {max_steps}")
        if difficulty is not None and difficulty not in (0, 1, 2):
            raise UserError(f"difficulty must be 0, 1 or 2, got {difficulty}")
        self.dsn = dsn or os.environ.get("FORGE_PG_DSN") or DEFAULT_DSN
        self.tool_cost = float(tool_cost)
        self.connect_timeout = float(connect_timeout)
        self._difficulty = difficulty
        causes = "; ".join(f"{a}: {d}" for a, d in _CAUSES.items())
        self.spec = EnvSpec(
            name="postgres-diagnosis",
            description=(
                "Users report that a PostgreSQL database is slow. Find the root cause with "
                "diagnostic tools over the real statistics views, then answer with exactly one "
                f"root cause. Root causes: {causes}. Each tool call costs {self.tool_cost:g}; "
                "a right answer earns +1 and a wrong one -1, and either ends the episode."
            ),
            max_steps=max_steps,
            tau=-0.5,
            theta=0.89,
            success_return=0.5,
            major_failure_return=-1.0,
        )
        self._actions = (*TOOLS, *(f"answer:{a}" for a in ANOMALIES))
        self._episode: _Episode | None = None
        self._finalizer: weakref.finalize | None = None
        self.task: DiagnosisTask | None = None
        self.distractors: list[str] = []
        self.evidence: dict[str, list[dict[str, Any]]] = {}
        self._steps = 0
        self._done = False
        self._used: list[str] = []
        self._last = "Nothing yet: call a tool."
        self._statements: bool | None = None
        cleanup_leftovers(dsn=self.dsn, timeout=self.connect_timeout)

    # ------------------------------------------------------------------ Env port

    @property
    def database(self) -> str | None:
        """The current scratch database's name (None between episodes)."""
        return self._episode.dbname if self._episode else None

    @property
    def backend_pids(self) -> list[int]:
        """Server pids this episode opened (tools, workload, lock sessions), for tests."""
        return list(self._episode.pids) if self._episode else []

    def reset(self, *, seed: int) -> str:
        self._teardown()
        task, rng = _draw(seed)
        if self._difficulty is not None:
            task = DiagnosisTask(seed=seed, anomaly=task.anomaly, difficulty=self._difficulty)
        name = f"{DB_PREFIX}{int(time.time())}_{os.getpid()}_{secrets.token_hex(3)}"
        ep = _Episode(dsn=self.dsn, dbname=name, timeout=self.connect_timeout)
        self._episode = ep
        self._finalizer = weakref.finalize(self, ep.teardown)
        try:
            self._inject(ep, task, rng)
        except BaseException:
            self._teardown()
            raise
        self.task = task
        self.evidence = {}
        self._steps, self._done, self._used = 0, False, []
        self._last = "Nothing yet: call a tool."
        return self._observe()

    def valid_actions(self) -> Sequence[str]:
        return self._actions

    def step(self, action: str) -> StepResult:
        if self._episode is None or self.task is None:
            raise UserError(f"{self.spec.name}: call reset(seed=...) before step()")
        if self._done:
            raise UserError(f"{self.spec.name}: the episode is over; call reset(seed=...) first")
        name = check_action(action, valid=self._actions, env=self.spec.name)
        self._steps += 1
        info: dict[str, Any] = {"step": self._steps, "action": name}
        if name.startswith("answer:"):
            answer = name.removeprefix("answer:")
            correct = answer == self.task.anomaly
            reward = 1.0 if correct else -1.0
            self._done = True
            verdict = "right" if correct else f"wrong: it was {self.task.anomaly}"
            self._last = f"You answered {answer}: {verdict}. The episode is over."
            info.update(
                answer=answer,
                anomaly=self.task.anomaly,
                correct=correct,
                truncated=False,
                difficulty=self.task.difficulty,
            )
        else:
            reward = -self.tool_cost
            self._used.append(name)
            self._last = f"{name} returned:\n{self._run_tool(name)}"
            truncated = self._steps >= self.spec.max_steps
            if truncated:
                self._done = True
                self._last += (
                    f"\nThe step limit ({self.spec.max_steps}) is reached without an answer: "
                    "episode over."
                )
                info.update(anomaly=self.task.anomaly, answer=None, correct=False)
            info.update(tool=name, truncated=truncated)
        return StepResult(self._observe(), reward, self._done, info)

    def close(self) -> None:
        self._teardown()

    def oracle_action(self) -> str:
        """A scripted expert's next action: the next tool of a fixed plan, or the answer."""
        return oracle_action(self)

    # ------------------------------------------------------------------ internals

    def _teardown(self) -> None:
        fin, self._finalizer, self._episode = self._finalizer, None, None
        self.task = None
        if fin is not None:
            fin()  # runs _Episode.teardown once and detaches

    def _observe(self) -> str:
        left = self.spec.max_steps - self._steps
        lines = [
            "Task: users report that the PostgreSQL database is slow. Find the root cause: "
            "investigate with the diagnostic tools, then answer with exactly one root cause.",
            "Root causes:",
            *(f"  answer:{a} - {d}" for a, d in _CAUSES.items()),
            f"Tools (each costs {self.tool_cost:g}; a right answer earns +1, a wrong one -1):",
            *(f"  {t} - {d}" for t, d in TOOLS.items()),
            f"Step {self._steps} of {self.spec.max_steps} ({left} left)."
            + (" The episode is over." if self._done else ""),
            f"Tools used so far: {', '.join(self._used) or 'none'}.",
            f"Last result: {self._last}",
        ]
        return "\n".join(lines)

    def _inject(self, ep: _Episode, task: DiagnosisTask, rng: random.Random) -> None:
        psycopg = _psycopg()
        admin = _connect(self.dsn, app="forge_diag_admin", timeout=self.connect_timeout)
        try:
            admin.execute(f"CREATE DATABASE {_ident(ep.dbname)} TEMPLATE template0")
        except psycopg.Error as exc:
            raise PostgresEnvError(f"cannot create scratch database: {_one_line(exc)}") from None
        finally:
            _close_quietly(admin)
        try:
            setup = _connect(
                self.dsn, dbname=ep.dbname, app="forge_diag_setup", timeout=self.connect_timeout
            )
            try:
                for sql in _SCHEMA:
                    setup.execute(sql)
                self._probe_statements(setup)
                # Flush this backend's counters, then zero the database's: the anomaly's
                # evidence must not mix with the load. ANALYZE restores the live-row counts.
                setup.execute("SELECT pg_stat_force_next_flush()")
                setup.execute("SELECT pg_stat_reset()")
                if self._statements:
                    # Only this database's entries: the server may be shared.
                    setup.execute(
                        "SELECT pg_stat_statements_reset(0, (SELECT oid FROM pg_database "
                        "WHERE datname = current_database()), 0)"
                    )
                setup.execute("ANALYZE customers, products, orders, payments, events")
            finally:
                _close_quietly(setup)
            ep.tools = _connect(
                self.dsn, dbname=ep.dbname, app="forge_diag_tools", timeout=self.connect_timeout
            )
            ep.tools.execute("SET statement_timeout = '10s'")
            ep.tools.execute("SET lock_timeout = '2s'")
            ep.app = _connect(
                self.dsn, dbname=ep.dbname, app="webapp", timeout=self.connect_timeout
            )
            ep.pids += [ep.tools.info.backend_pid, ep.app.info.backend_pid]
            _workload(ep.app, rng)
            self.distractors = _distract(ep.app, rng, task.difficulty)
            _INJECT[task.anomaly](self, ep, rng)
            self._await_evidence(ep, task.anomaly)
        except psycopg.Error as exc:
            raise PostgresEnvError(
                f"injecting {task.anomaly} into {ep.dbname} failed: {_one_line(exc)}"
            ) from None

    def _probe_statements(self, conn: Any) -> None:
        """Use pg_stat_statements only where it works (it must be preloaded by the server)."""
        if self._statements is False:
            return
        try:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            conn.execute("SELECT 1 FROM pg_stat_statements LIMIT 1").fetchall()
            self._statements = True
        except _psycopg().Error:
            self._statements = False

    def _await_evidence(self, ep: _Episode, anomaly: str, timeout: float = 6.0) -> None:
        """Wait until the statistics views show the anomaly (backends flush them when idle)."""
        tool = _ORACLE_TOOL[anomaly]
        deadline = time.monotonic() + timeout
        while True:
            rows = _QUERIES[tool](ep.tools, self)
            if diagnose({tool: rows}) == anomaly:
                return
            if time.monotonic() > deadline:
                raise PostgresEnvError(
                    f"injected {anomaly} but {tool} shows no evidence after {timeout:g}s"
                )
            time.sleep(0.1)

    def _run_tool(self, name: str) -> str:
        ep = self._episode
        assert ep is not None
        try:
            rows = _QUERIES[name](ep.tools, self)
        except _psycopg().Error as exc:
            return f"(the tool failed: {_one_line(exc)})"
        self.evidence[name] = rows
        return _RENDER[name](rows)


# --------------------------------------------------------------------------- injections


def _flush(ep: _Episode) -> None:
    """Publish the app session's pending statistics now, before its final statement.

    Backends publish counters only when idle and at most every 10 s; forcing the flush here
    makes the evidence visible at once while the anomaly's own statement stays the session's
    last query in ``pg_stat_activity``.
    """
    ep.app.execute("SELECT pg_stat_force_next_flush()")


def _inject_insert(env: PostgresDiagnosisEnv, ep: _Episode, rng: random.Random) -> None:
    table = rng.choice(["events", "payments"])
    batches, size = rng.randint(40, 60), 2000
    for b in range(batches):
        if b == batches - 1:
            _flush(ep)
        if table == "events":
            ep.app.execute(
                "INSERT INTO events (kind, payload) SELECT 'sensor', repeat(md5(g::text), 2) "
                "FROM generate_series(1, %s) g",
                (size,),
            )
        else:
            start = 100_000 + b * size
            ep.app.execute(
                "INSERT INTO payments SELECT g, 1 + g %% 20000, 5 + g %% 200, now() "
                "FROM generate_series(%s, %s) g",
                (start, start + size - 1),
            )


def _inject_lock(env: PostgresDiagnosisEnv, ep: _Episode, rng: random.Random) -> None:
    table = rng.choice(["orders", "customers", "products"])
    column = {"orders": "status", "customers": "balance", "products": "stock"}[table]
    value = {"orders": "'processing'", "customers": "balance + 10", "products": "stock - 1"}[table]
    row = rng.randint(1, 500)
    sql = f"UPDATE {table} SET {column} = {value} WHERE id = %s"
    _flush(ep)
    ep.app.execute(f"SELECT * FROM {table} WHERE id = %s", (row,)).fetchall()
    # Backends notice a vanished client within 2 s, so a crash cannot leave them waiting.
    ep.holder = _connect(
        env.dsn, dbname=ep.dbname, app="batch_job", timeout=env.connect_timeout, autocommit=False
    )
    ep.holder.execute("SET client_connection_check_interval = '2s'")
    ep.holder.execute(sql, (row,))  # the open transaction now holds the row lock
    ep.pids.append(ep.holder.info.backend_pid)
    for _ in range(rng.randint(2, 3)):
        conn = _connect(env.dsn, dbname=ep.dbname, app="webapp", timeout=env.connect_timeout)
        conn.execute("SET client_connection_check_interval = '2s'")
        ep.waiters.append(conn)
        ep.pids.append(conn.info.backend_pid)
        t = threading.Thread(target=_waiter, args=(conn, sql, (row,)), daemon=True)
        ep.threads.append(t)
        t.start()


def _inject_vacuum(env: PostgresDiagnosisEnv, ep: _Episode, rng: random.Random) -> None:
    table = rng.choice(["orders", "payments"])
    col = _INDEXED[table]
    modulo = 2000 if table == "orders" else 20000
    ep.app.execute(f"ALTER TABLE {table} SET (autovacuum_enabled = false)")
    # Changing an indexed column defeats HOT, so page pruning cannot hide the dead tuples.
    for _ in range(rng.randint(2, 3)):
        ep.app.execute(f"UPDATE {table} SET {col} = 1 + ({col} % {modulo})")
    _flush(ep)
    ep.app.execute(f"DELETE FROM {table} WHERE id %% 4 = %s", (rng.randrange(4),))


def _inject_redundant(env: PostgresDiagnosisEnv, ep: _Episode, rng: random.Random) -> None:
    table = rng.choice(["orders", "payments"])
    col = _INDEXED[table]
    ep.app.execute(f"CREATE INDEX idx_{table}_{col} ON {table} ({col})")
    ep.app.execute(f"CREATE INDEX {table}_{col}_idx1 ON {table} ({col})")
    if table == "orders":
        ep.app.execute(
            "INSERT INTO orders SELECT g, 1 + g % 2000, 1 + g % 500, 1, 'new', md5(g::text), "
            "now() FROM generate_series(100001, 101500) g"
        )
    else:
        ep.app.execute(
            "INSERT INTO payments SELECT g, 1 + g % 20000, 10, now() "
            "FROM generate_series(100001, 101500) g"
        )
    for i in range(10):
        if i == 9:
            _flush(ep)
        ep.app.execute(
            f"SELECT * FROM {table} WHERE {col} = %s", (rng.randint(1, 2000),)
        ).fetchall()


def _inject_fetch(env: PostgresDiagnosisEnv, ep: _Episode, rng: random.Random) -> None:
    table = rng.choice(["orders", "payments"])
    scans = rng.randint(12, 18) if table == "orders" else rng.randint(40, 60)
    for i in range(scans):
        if i == scans - 1:
            _flush(ep)
        # The rows travel to the client; parsing them into Python would only burn CPU.
        ep.app.execute(f"SELECT * FROM {table}")


_INJECT: dict[str, Callable[[PostgresDiagnosisEnv, _Episode, random.Random], None]] = {
    "INSERT_LARGE_DATA": _inject_insert,
    "LOCK_CONTENTION": _inject_lock,
    "VACUUM": _inject_vacuum,
    "REDUNDANT_INDEX": _inject_redundant,
    "FETCH_LARGE_DATA": _inject_fetch,
}


# --------------------------------------------------------------------------- tools


def _q_table_stats(conn: Any, env: PostgresDiagnosisEnv) -> list[dict[str, Any]]:
    return _fetch(
        conn,
        "SELECT relname AS table, n_tup_ins AS inserted, n_tup_upd AS updated, "
        "n_tup_del AS deleted, n_live_tup AS live, n_dead_tup AS dead "
        "FROM pg_stat_user_tables ORDER BY n_tup_ins + n_tup_upd + n_tup_del DESC, relname",
    )


def _q_dead(conn: Any, env: PostgresDiagnosisEnv) -> list[dict[str, Any]]:
    return _fetch(
        conn,
        "SELECT s.relname AS table, s.n_live_tup AS live, s.n_dead_tup AS dead, "
        "round(100.0 * s.n_dead_tup / greatest(s.n_live_tup + s.n_dead_tup, 1), 1)::float "
        "AS dead_pct, coalesce(to_char(greatest(s.last_vacuum, s.last_autovacuum), "
        "'YYYY-MM-DD HH24:MI'), 'never') AS last_vacuum, "
        "coalesce(array_to_string(c.reloptions, ','), '-') AS options "
        "FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid "
        "ORDER BY s.n_dead_tup DESC, s.relname",
    )


def _q_locks(conn: Any, env: PostgresDiagnosisEnv) -> list[dict[str, Any]]:
    return _fetch(
        conn,
        "SELECT l.pid, a.application_name AS app, l.locktype, l.mode, "
        "coalesce(c.relname, '-') AS relation, pg_blocking_pids(l.pid) AS blocked_by, "
        "round(extract(epoch FROM now() - a.query_start))::int AS waiting_s, "
        "left(regexp_replace(a.query, '\\s+', ' ', 'g'), 70) AS query "
        "FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
        "LEFT JOIN pg_class c ON c.oid = l.relation "
        "WHERE NOT l.granted AND a.datname = current_database() AND l.pid <> pg_backend_pid() "
        "ORDER BY l.pid",
    ) + [
        {**r, "blocker": True}
        for r in _fetch(
            conn,
            "SELECT a.pid, a.application_name AS app, a.state, "
            "round(extract(epoch FROM now() - a.xact_start))::int AS xact_s, "
            "left(regexp_replace(a.query, '\\s+', ' ', 'g'), 70) AS query "
            "FROM pg_stat_activity a WHERE a.datname = current_database() AND a.pid IN ("
            "SELECT unnest(pg_blocking_pids(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database()) ORDER BY a.pid",
        )
    ]


def _q_indexes(conn: Any, env: PostgresDiagnosisEnv) -> list[dict[str, Any]]:
    rows = _fetch(
        conn,
        "SELECT s.relname AS table, s.indexrelname AS index, pg_get_indexdef(s.indexrelid) "
        "AS def, CASE WHEN i.indisprimary THEN 'primary' WHEN i.indisunique THEN 'unique' "
        "ELSE '-' END AS kind, s.idx_scan AS scans, pg_relation_size(s.indexrelid) AS bytes "
        "FROM pg_stat_user_indexes s JOIN pg_index i ON i.indexrelid = s.indexrelid "
        "ORDER BY s.relname, s.indexrelname",
    )
    for r in rows:
        m = re.search(r"USING \w+ (\(.*\))", r.pop("def"))
        r["columns"] = m.group(1) if m else "?"
    return rows


def _q_activity(conn: Any, env: PostgresDiagnosisEnv) -> list[dict[str, Any]]:
    rows = _fetch(
        conn,
        "SELECT pid, application_name AS app, state, "
        "coalesce(wait_event_type || ':' || wait_event, '-') AS wait, "
        "round(extract(epoch FROM now() - coalesce(xact_start, query_start)))::int AS age_s, "
        "left(regexp_replace(query, '\\s+', ' ', 'g'), 80) AS query "
        "FROM pg_stat_activity WHERE datname = current_database() "
        "AND backend_type = 'client backend' AND pid <> pg_backend_pid() ORDER BY pid",
    )
    if env._statements:
        rows += [
            {**r, "statement": True}
            for r in _fetch(
                conn,
                "SELECT calls, rows, round(total_exec_time)::bigint AS total_ms, "
                "left(regexp_replace(query, '\\s+', ' ', 'g'), 80) AS query "
                "FROM pg_stat_statements WHERE dbid = (SELECT oid FROM pg_database "
                "WHERE datname = current_database()) ORDER BY total_exec_time DESC LIMIT 5",
            )
        ]
    return rows


def _q_sizes(conn: Any, env: PostgresDiagnosisEnv) -> list[dict[str, Any]]:
    return _fetch(
        conn,
        "SELECT s.relname AS table, pg_total_relation_size(s.relid) AS total, "
        "pg_relation_size(s.relid) AS heap, pg_indexes_size(s.relid) AS indexes, "
        "s.n_live_tup AS live, pg_relation_size(s.relid) / greatest(s.n_live_tup, 1) "
        "AS bytes_per_row FROM pg_stat_user_tables s "
        "ORDER BY pg_total_relation_size(s.relid) DESC, s.relname",
    )


def _q_seq(conn: Any, env: PostgresDiagnosisEnv) -> list[dict[str, Any]]:
    return _fetch(
        conn,
        "SELECT relname AS table, seq_scan AS seq_scans, seq_tup_read AS seq_rows_read, "
        "seq_tup_read / greatest(seq_scan, 1) AS rows_per_scan, "
        "coalesce(idx_scan, 0) AS idx_scans, n_live_tup AS live "
        "FROM pg_stat_user_tables ORDER BY seq_tup_read DESC, relname",
    )


_QUERIES: dict[str, Callable[[Any, PostgresDiagnosisEnv], list[dict[str, Any]]]] = {
    "check_table_stats": _q_table_stats,
    "check_dead_tuples": _q_dead,
    "check_locks": _q_locks,
    "check_indexes": _q_indexes,
    "check_active_queries": _q_activity,
    "check_table_sizes": _q_sizes,
    "check_seq_scans": _q_seq,
}


def _size(n: float) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if abs(n) < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)  # pragma: no cover


def _table(
    rows: Sequence[Mapping[str, Any]],
    cols: Sequence[str],
    fmt: Mapping[str, Callable[[Any], str]] | None = None,
) -> str:
    fmt = fmt or {}
    cells = [[fmt.get(c, str)(r[c]) for c in cols] for r in rows]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def _pids(v: Any) -> str:
    return ",".join(str(p) for p in v) or "-"


def _render_locks(rows: list[dict[str, Any]]) -> str:
    waiting = [r for r in rows if not r.get("blocker")]
    blockers = [r for r in rows if r.get("blocker")]
    if not waiting:
        return "No session is waiting for a lock."
    out = [
        f"{len(waiting)} lock request(s) waiting:",
        _table(
            waiting,
            ["pid", "app", "locktype", "mode", "relation", "blocked_by", "waiting_s", "query"],
            {"blocked_by": _pids},
        ),
    ]
    if blockers:
        out += ["Blocking sessions:", _table(blockers, ["pid", "app", "state", "xact_s", "query"])]
    return "\n".join(out)


def _render_activity(rows: list[dict[str, Any]]) -> str:
    sessions = [r for r in rows if not r.get("statement")]
    stmts = [r for r in rows if r.get("statement")]
    out = (
        [
            f"{len(sessions)} other client session(s):",
            _table(
                sessions,
                ["pid", "app", "state", "wait", "age_s", "query"],
                {"state": lambda s: s or "-"},
            ),
        ]
        if sessions
        else ["No other client session is connected."]
    )
    if stmts:
        out += [
            "Top statements by total time (pg_stat_statements):",
            _table(stmts, ["calls", "rows", "total_ms", "query"]),
        ]
    return "\n".join(out)


_RENDER: dict[str, Callable[[list[dict[str, Any]]], str]] = {
    "check_table_stats": lambda rows: _table(
        rows, ["table", "inserted", "updated", "deleted", "live", "dead"]
    ),
    "check_dead_tuples": lambda rows: _table(
        rows, ["table", "live", "dead", "dead_pct", "last_vacuum", "options"]
    ),
    "check_locks": _render_locks,
    "check_indexes": lambda rows: _table(
        rows, ["table", "index", "columns", "kind", "scans", "bytes"], {"bytes": _size}
    ),
    "check_active_queries": _render_activity,
    "check_table_sizes": lambda rows: _table(
        rows,
        ["table", "total", "heap", "indexes", "live", "bytes_per_row"],
        {"total": _size, "heap": _size, "indexes": _size},
    ),
    "check_seq_scans": lambda rows: _table(
        rows, ["table", "seq_scans", "seq_rows_read", "rows_per_scan", "idx_scans", "live"]
    ),
}


# --------------------------------------------------------------------------- oracle


def _dup_indexes(rows: Sequence[Mapping[str, Any]]) -> bool:
    seen: dict[tuple[str, str], int] = {}
    for r in rows:
        key = (r["table"], r["columns"])
        seen[key] = seen.get(key, 0) + 1
    return any(n >= 2 for n in seen.values())


# Per tool: the anomaly it can prove, and the rule over its rows.
_RULES: dict[str, tuple[str, Callable[[list[dict[str, Any]]], bool]]] = {
    "check_locks": ("LOCK_CONTENTION", lambda rows: any(not r.get("blocker") for r in rows)),
    "check_dead_tuples": (
        "VACUUM",
        lambda rows: any(r["dead"] >= _DEAD_MIN and r["dead_pct"] >= _DEAD_PCT_MIN for r in rows),
    ),
    "check_indexes": ("REDUNDANT_INDEX", _dup_indexes),
    "check_seq_scans": (
        "FETCH_LARGE_DATA",
        lambda rows: any(
            r["seq_rows_read"] >= _SEQ_READ_MIN and r["seq_scans"] >= _SEQ_SCANS_MIN for r in rows
        ),
    ),
    "check_table_stats": (
        "INSERT_LARGE_DATA",
        lambda rows: any(r["inserted"] >= _INSERT_MIN for r in rows),
    ),
}
_ORACLE_PLAN = tuple(_RULES)
_ORACLE_TOOL = {anomaly: tool for tool, (anomaly, _) in _RULES.items()}


def diagnose(evidence: Mapping[str, list[dict[str, Any]]]) -> str | None:
    """The anomaly the gathered tool rows prove (checked in the oracle's order), or None."""
    for tool in _ORACLE_PLAN:
        if tool in evidence:
            anomaly, rule = _RULES[tool]
            if rule(evidence[tool]):
                return anomaly
    return None


def oracle_action(env: PostgresDiagnosisEnv) -> str:
    """Call the tools in a fixed order and answer as soon as the real rows prove a cause.

    It reads only what its own tool calls returned (``env.evidence``), never the injected
    answer, so it passing on every anomaly shows the evidence really is in the views.
    """
    found = diagnose(env.evidence)
    if found is not None:
        return f"answer:{found}"
    for tool in _ORACLE_PLAN:
        if tool not in env.evidence:
            return tool
    return "answer:INSERT_LARGE_DATA"
