"""Database diagnosis env against the real PostgreSQL server (skipped when it is unreachable).

Every anomaly is really injected into a scratch database and must be visible through the
tools; the oracle reads only what its tool calls return. Cleanup is checked on the server
itself: the scratch database, its backends and their locks are gone after close, after an
abandoning reset and after the env is dropped unclosed.
"""

from __future__ import annotations

import gc
import os
import sys
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from forge.envs import Env
from forge.envs.postgres import (
    ANOMALIES,
    DEFAULT_DSN,
    TOOLS,
    PostgresDiagnosisEnv,
    PostgresEnvError,
    accuracy,
    cleanup_leftovers,
    diagnosis_stream,
    task_for_seed,
)
from forge.errors import BackendError, ConfigError, UserError, ValidationError

DSN = os.environ.get("FORGE_PG_DSN", DEFAULT_DSN)


def _server() -> Any | None:
    try:
        import psycopg

        return psycopg.connect(DSN, connect_timeout=2, autocommit=True)
    except Exception:  # noqa: BLE001 - any failure means: skip
        return None


_probe = _server()
HAVE_SERVER = _probe is not None
if _probe is not None:
    _probe.close()
needs_server = pytest.mark.skipif(
    not HAVE_SERVER, reason=f"PostgreSQL is not reachable at {DSN} (or psycopg is missing)"
)


def seed_for(anomaly: str, *, difficulty: int | None = None) -> int:
    return next(
        s
        for s in range(10_000)
        if task_for_seed(s).anomaly == anomaly
        and (difficulty is None or task_for_seed(s).difficulty == difficulty)
    )


@pytest.fixture(scope="module")
def admin() -> Iterator[Any]:
    import psycopg

    conn = psycopg.connect(DSN, connect_timeout=2, autocommit=True)
    yield conn
    conn.close()


@pytest.fixture(scope="module")
def env() -> Iterator[PostgresDiagnosisEnv]:
    e = PostgresDiagnosisEnv(dsn=DSN)
    yield e
    e.close()


def databases(admin: Any, name: str) -> int:
    return admin.execute("SELECT count(*) FROM pg_database WHERE datname = %s", (name,)).fetchone()[
        0
    ]


def assert_gone(admin: Any, db: str, pids: list[int]) -> None:
    assert databases(admin, db) == 0
    sessions = admin.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = %s OR pid = ANY(%s)", (db, pids)
    ).fetchone()[0]
    locks = admin.execute("SELECT count(*) FROM pg_locks WHERE pid = ANY(%s)", (pids,)).fetchone()[
        0
    ]
    assert (sessions, locks) == (0, 0)


# ----------------------------------------------------------------------------- no server


def test_unreachable_server_is_a_one_line_backend_error() -> None:
    pytest.importorskip("psycopg")
    with pytest.raises(PostgresEnvError) as err:
        PostgresDiagnosisEnv(dsn="postgresql://postgres@127.0.0.1:1/postgres", connect_timeout=1)
    assert isinstance(err.value, BackendError)
    message = str(err.value)
    assert "\n" not in message and "127.0.0.1:1" in message and "dsn=" in message


def test_missing_psycopg_is_a_config_error_with_an_install_hint(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # makes "import psycopg" fail
    with pytest.raises(ConfigError, match=r"pip install 'forge-memory\[postgres\]'"):
        PostgresDiagnosisEnv(dsn=DSN)


def test_task_choice_is_a_pure_function_of_the_seed() -> None:
    tasks = [task_for_seed(s) for s in range(200)]
    assert tasks == [task_for_seed(s) for s in range(200)]
    assert set(Counter(t.anomaly for t in tasks)) == set(ANOMALIES)
    assert {t.difficulty for t in tasks} == {0, 1, 2}


def test_stream_is_balanced_rising_and_replayable() -> None:
    stream = list(diagnosis_stream(15, seed=7))
    assert stream == list(diagnosis_stream(15, seed=7))
    assert stream != list(diagnosis_stream(15, seed=8))
    for block in range(3):
        assert {t.anomaly for t in stream[5 * block : 5 * block + 5]} == set(ANOMALIES)
    assert [t.difficulty for t in stream] == [0] * 5 + [1] * 5 + [2] * 5
    assert [t.index for t in stream] == list(range(15))
    assert len({t.seed for t in stream}) == 15
    for t in stream:  # the seed alone replays the task
        assert (task_for_seed(t.seed).anomaly, task_for_seed(t.seed).difficulty) == (
            t.anomaly,
            t.difficulty,
        )
    assert {t.difficulty for t in diagnosis_stream(6, seed=1, difficulty=1)} == {1}
    with pytest.raises(UserError):
        list(diagnosis_stream(3, seed=1, difficulty=5))


def test_accuracy_counts_missing_answers_as_wrong() -> None:
    assert accuracy([("VACUUM", "VACUUM"), ("VACUUM", "LOCK_CONTENTION"), ("VACUUM", None)]) == (
        pytest.approx(1 / 3)
    )
    assert accuracy([]) == 0.0


# ----------------------------------------------------------------------------- real server

# anomaly -> (a second tool that also shows it, text that tool must contain)
SECOND_LOOK = {
    "INSERT_LARGE_DATA": ("check_table_sizes", None),
    "LOCK_CONTENTION": ("check_active_queries", "Lock:"),
    "VACUUM": ("check_table_sizes", None),
    "REDUNDANT_INDEX": ("check_locks", "No session is waiting"),
    "FETCH_LARGE_DATA": ("check_active_queries", "SELECT * FROM"),
}


@pytest.mark.slow
@needs_server
@pytest.mark.parametrize("anomaly", ANOMALIES)
def test_each_anomaly_is_injected_visible_and_solved_by_the_oracle(
    env: PostgresDiagnosisEnv, admin: Any, anomaly: str
) -> None:
    seed = seed_for(anomaly, difficulty=2)  # with distractors
    obs = env.reset(seed=seed)
    assert isinstance(env, Env) and env.task is not None and env.task.anomaly == anomaly
    assert "slow" in obs and all(t in obs for t in TOOLS) and "answer:VACUUM" in obs
    assert databases(admin, env.database) == 1

    tool, text = SECOND_LOOK[anomaly]
    second = env.step(tool)
    assert second.reward == pytest.approx(-env.tool_cost) and not second.done
    if text is not None:
        assert text in second.observation
    rows = env.evidence[tool]
    if anomaly == "INSERT_LARGE_DATA":  # the table it filled is now the biggest
        assert rows[0]["live"] >= 50_000
    elif anomaly == "VACUUM":  # the bloated table takes far more bytes per live row
        per_row = sorted(r["bytes_per_row"] for r in rows)
        assert per_row[-1] >= 1.5 * per_row[len(per_row) // 2]

    total, trace = second.reward, []
    while True:
        action = env.oracle_action()
        result = env.step(action)
        total += result.reward
        trace.append((action, result.observation))
        if result.done:
            break
    assert action == f"answer:{anomaly}" and result.reward == 1.0
    assert result.info["correct"] and result.info["anomaly"] == anomaly
    assert total >= env.spec.success_return

    # The tool that proved it, as the agent saw it (real numbers from the stats views).
    proof_tool, proof_text = trace[-2]
    rows = env.evidence[proof_tool]
    if anomaly == "INSERT_LARGE_DATA":
        assert proof_tool == "check_table_stats" and max(r["inserted"] for r in rows) >= 50_000
    elif anomaly == "LOCK_CONTENTION":
        assert proof_tool == "check_locks" and "waiting" in proof_text
        assert any(r.get("blocker") and r["state"] == "idle in transaction" for r in rows)
    elif anomaly == "VACUUM":
        assert proof_tool == "check_dead_tuples" and "autovacuum_enabled=false" in proof_text
        assert max(r["dead"] for r in rows) >= 10_000
    elif anomaly == "REDUNDANT_INDEX":
        assert proof_tool == "check_indexes"
        cols = Counter((r["table"], r["columns"]) for r in rows)
        (table, col), n = cols.most_common(1)[0]
        assert n == 3
        scans = sorted(r["scans"] for r in rows if (r["table"], r["columns"]) == (table, col))
        assert scans[0] == 0  # at least one copy is never used
    else:
        assert proof_tool == "check_seq_scans"
        top = rows[0]
        assert top["seq_scans"] >= 10 and top["seq_rows_read"] >= 150_000


@pytest.mark.slow
@needs_server
def test_oracle_graduates_on_a_clean_episode(env: PostgresDiagnosisEnv) -> None:
    env.reset(seed=seed_for("INSERT_LARGE_DATA", difficulty=0))  # the longest oracle plan
    total = 0.0
    while True:
        result = env.step(env.oracle_action())
        total += result.reward
        if result.done:
            break
    assert result.info["correct"] and total >= env.spec.theta


@needs_server
def test_wrong_answer_is_below_tau_and_ends_the_episode(env: PostgresDiagnosisEnv) -> None:
    env.reset(seed=seed_for("REDUNDANT_INDEX", difficulty=0))
    result = env.step("answer:VACUUM")
    assert result.done and result.reward < env.spec.tau
    assert result.reward <= env.spec.major_failure_return
    assert result.info == {
        "step": 1,
        "action": "answer:VACUUM",
        "answer": "VACUUM",
        "anomaly": "REDUNDANT_INDEX",
        "correct": False,
        "truncated": False,
        "difficulty": 0,
    }
    assert "wrong: it was REDUNDANT_INDEX" in result.observation
    with pytest.raises(UserError, match="episode is over"):
        env.step("check_locks")


@needs_server
def test_step_limit_ends_an_episode_without_an_answer(env: PostgresDiagnosisEnv) -> None:
    env.reset(seed=seed_for("REDUNDANT_INDEX", difficulty=0))
    with pytest.raises(ValidationError, match="check_locks"):
        env.step("drop database")
    results = [env.step(" CHECK_LOCKS ") for _ in range(env.spec.max_steps)]
    assert [r.done for r in results] == [False] * (env.spec.max_steps - 1) + [True]
    assert results[-1].info["truncated"] and results[-1].info["correct"] is False
    total = sum(r.reward for r in results)
    assert env.spec.major_failure_return < total < env.spec.success_return


@pytest.mark.slow
@needs_server
def test_same_seed_injects_the_same_episode(env: PostgresDiagnosisEnv) -> None:
    seed = seed_for("REDUNDANT_INDEX", difficulty=1)
    seen = []
    for _ in range(2):
        env.reset(seed=seed)
        env.step("check_indexes")
        rows = env.evidence["check_indexes"]
        seen.append(
            (env.task, env.distractors, [(r["table"], r["index"], r["columns"]) for r in rows])
        )
    assert seen[0] == seen[1]


@pytest.mark.slow
@needs_server
def test_close_mid_episode_releases_locks_sessions_and_database(admin: Any) -> None:
    env = PostgresDiagnosisEnv(dsn=DSN)
    env.reset(seed=seed_for("LOCK_CONTENTION"))
    db, pids = env.database, env.backend_pids
    waiting = admin.execute(
        "SELECT count(*) FROM pg_locks WHERE NOT granted AND pid = ANY(%s)", (pids,)
    ).fetchone()[0]
    assert waiting >= 2 and len(pids) >= 5  # tools, app, holder, 2-3 waiters
    env.step("check_locks")  # abandoned after one tool
    env.close()
    assert_gone(admin, db, pids)
    env.close()  # idempotent


@pytest.mark.slow
@needs_server
def test_reset_abandons_the_previous_episode_cleanly(admin: Any) -> None:
    env = PostgresDiagnosisEnv(dsn=DSN)
    try:
        env.reset(seed=seed_for("LOCK_CONTENTION", difficulty=0))
        db, pids = env.database, env.backend_pids
        env.reset(seed=seed_for("VACUUM", difficulty=0))
        assert_gone(admin, db, pids)
        assert env.database != db and databases(admin, env.database) == 1
    finally:
        env.close()


@pytest.mark.slow
@needs_server
def test_an_env_dropped_unclosed_still_cleans_up(admin: Any) -> None:
    env = PostgresDiagnosisEnv(dsn=DSN)
    env.reset(seed=seed_for("LOCK_CONTENTION", difficulty=0))
    db, pids = env.database, env.backend_pids
    del env
    gc.collect()
    assert_gone(admin, db, pids)


def _dead_pid() -> int:
    pid = 4_000_000
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return pid
        except PermissionError:
            pass
        pid -= 1


@pytest.mark.slow
@needs_server
def test_leftovers_of_crashed_runs_are_dropped_but_live_runs_are_kept(admin: Any) -> None:
    import psycopg

    crashed = f"forge_diag_1000_{_dead_pid()}_abc123"
    live = f"forge_diag_1000_{os.getppid()}_def456"
    for name in (crashed, live):
        admin.execute(f'CREATE DATABASE "{name}" TEMPLATE template0')
    # A lingering backend on each, as a crashed process or a running one would leave.
    sessions = [
        psycopg.connect(DSN, dbname=n, connect_timeout=2, autocommit=True) for n in (crashed, live)
    ]
    try:
        dropped = cleanup_leftovers(dsn=DSN)
        assert crashed in dropped and live not in dropped
        assert databases(admin, crashed) == 0 and databases(admin, live) == 1
    finally:
        for conn in sessions:
            conn.close()
        admin.execute(f'DROP DATABASE IF EXISTS "{live}" WITH (FORCE)')
        admin.execute(f'DROP DATABASE IF EXISTS "{crashed}" WITH (FORCE)')
