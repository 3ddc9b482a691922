"""The memory service against in-process calls: requests/s and p50/p95 latency for recall,
add and context, at 1 and 16 concurrent clients, side by side in the same run.

The store is built once into .bench/ (hashing embedder, 384-d, so the model is not what is
measured). Texts and queries come from bench/_common.Vocabulary: Zipf-distributed words
with per-topic words, as real notes have. (An earlier 32-word vocabulary put every query
word in a third of all units, which measured FTS5 ranking a third of the store per query.) The server is ``forge serve`` in
its own process with one API key (auth, rate limit and audit logging included: every
recall also writes an audit row); clients are threads with keep-alive ``forge.client.Client``
connections. In-process rows call ``Memory`` directly from the same number of threads.
Read audit records are batched by default (``--read-audit-ms 50``); the last rows compare
it with ``--read-audit-ms 0`` (a write transaction per recall, as before) in alternating rounds.

    python bench/service.py [--quick] [--json] [--units N] [--seconds S]

Targets (issue 10): HTTP adds <= 2 ms p50 over in-process for recall; >= 500 recalls/s at
100k units on 2 cores.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from _common import CACHE_DIR, ROOT, Vocabulary, log, parser, table
from forge.client import Client
from forge.engine.embed import open_embedder
from forge.engine.memory import Memory
from forge.model import Unit, Viewer
from forge.server.keys import KeyStore
from forge.store import SQLiteStore

EMBEDDER = "hash:384"
TOPICS = 1000
INDEX_FILES = (".usearch", ".usearch.json")  # beside the .db: the index and what binds it to the file
VOCAB = Vocabulary(n_clusters=TOPICS)
AUDIT_ROUNDS = 4  # alternating rounds of batched vs unbatched read audit


def build(units: int) -> Path:
    path = CACHE_DIR / f"service-zipf-{units}.db"
    if path.exists():
        return path
    CACHE_DIR.mkdir(exist_ok=True)
    tmp = path.with_suffix(".tmp.db")
    for p in (tmp, *(Path(str(tmp) + suffix) for suffix in INDEX_FILES)):
        p.unlink(missing_ok=True)
    rng = np.random.default_rng(0)
    t0 = time.perf_counter()
    with Memory.open(tmp, embedder=EMBEDDER) as mem:
        for i in range(0, units, 2000):
            ids = range(i, min(units, i + 2000))
            texts = VOCAB.texts(rng.integers(0, TOPICS, len(ids)), rng)
            batch = [Unit(text, kind=("fact", "rule", "lesson")[j % 3],
                          scope="global" if j % 10 else "private", owner="" if j % 10 else f"agent-{j % 7}")
                     for j, text in zip(ids, texts, strict=True)]
            mem.add(batch, actor="bench")
            log(f"  built {min(units, i + 2000):,}/{units:,} units ({time.perf_counter() - t0:.0f}s)")
        mem.recall("warm", viewer=Viewer.admin(), k=1, touch=False)  # builds the vector index, saved on close
        log(f"  indexed ({time.perf_counter() - t0:.0f}s)")
    for suffix in INDEX_FILES:  # the saved vector index, so opening the store does not rebuild it
        if Path(str(tmp) + suffix).exists():
            Path(str(tmp) + suffix).rename(str(path) + suffix)
    tmp.rename(path)
    return path


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) of process ``pid`` and all its descendants, from /proc (Linux;
    0.0 elsewhere): what a server and its worker processes spent, read before and after a run."""
    total, todo = 0.0, [pid]
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    while todo:
        p = todo.pop()
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / tick  # utime, stime
            for task in Path(f"/proc/{p}/task").iterdir():
                todo.extend(int(c) for c in (task / "children").read_text().split())
    return total


def drive(n_clients: int, seconds: float, make: Callable[[], Any], op: Callable[[Any, random.Random], None],
          server: int | None = None) -> dict[str, float]:
    """Run ``op`` from ``n_clients`` threads for ``seconds``; latencies in ms, and the CPU each
    request cost this process (the clients, or the engine in-process) and the ``server``'s."""
    lat: list[list[float]] = [[] for _ in range(n_clients)]
    start = threading.Barrier(n_clients + 1)
    stop = [0.0]

    def worker(i: int) -> None:
        rng = random.Random(i)
        handle = make()
        op(handle, rng)  # warm the connection / caches
        start.wait()
        while time.perf_counter() < stop[0]:
            t = time.perf_counter()
            op(handle, rng)
            lat[i].append((time.perf_counter() - t) * 1000)
        if hasattr(handle, "close") and isinstance(handle, Client):
            handle.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_clients)]
    for t in threads:
        t.start()
    stop[0] = time.perf_counter() + 3600
    start.wait()
    c0, s0 = time.process_time(), cpu_seconds(server) if server else 0.0
    t0 = time.perf_counter()
    stop[0] = t0 + seconds
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    own, srv = time.process_time() - c0, (cpu_seconds(server) - s0) if server else 0.0
    flat = sorted(x for xs in lat for x in xs)
    # the threads' first and last calls straddle the window's edges; at thousands of calls per run that is noise
    return {"rps": len(flat) / wall, "p50": statistics.median(flat), "p95": flat[int(0.95 * (len(flat) - 1))], "n": len(flat),
            "cpu_ms": 1000 * own / len(flat), "server_cpu_ms": 1000 * srv / len(flat)}


def ops(agent: str) -> dict[str, Callable[[Any, random.Random], None]]:
    viewer = Viewer.of(agent)

    def q(rng: random.Random) -> str:
        return VOCAB.queries(np.array([rng.randrange(TOPICS)]), np.random.default_rng(rng.randrange(2**32)))[0]

    return {
        "recall": lambda h, rng: h.recall(q(rng), viewer=viewer, k=10, touch=False),
        "add": lambda h, rng: h.add(Unit(q(rng) + " added", kind="fact")),
        "context": lambda h, rng: h.context(q(rng), viewer=viewer, budget=256),
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serving(db: Path, work: Path, workers: int, *extra: str) -> Iterator[tuple[str, int]]:
    """``forge serve`` on ``db`` in its own process(es) until the block ends; yields its URL and pid."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    log_path = work / f"serve-{workers}{'-'.join(('', *extra))}.log"
    with open(log_path, "wb") as server_log:
        server = subprocess.Popen([sys.executable, "-m", "forge.cli", "--db", str(db), "serve", "--port", str(port), "--no-dashboard", "--no-mcp",
                                   "--workers", str(workers), *extra], env=env, stderr=server_log)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    with httpx.Client(timeout=10) as c:  # each process answers once before we measure
                        answers = [c.get(f"{url}/v1/health", headers={"Connection": "close"}).json() for _ in range(8 * workers)]
                        # each process has answered, with its search indexes loaded
                        if len({a["pid"] for a in answers if not a.get("warming")}) >= workers:
                            break
                except Exception:  # noqa: BLE001 - not up yet
                    pass
                if time.monotonic() > deadline or server.poll() is not None:
                    tail = log_path.read_text(errors="replace").strip().splitlines()[-5:]
                    raise RuntimeError("forge serve did not start: " + " | ".join(tail))
                time.sleep(0.2)
            yield url, server.pid
        finally:
            server.terminate()
            server.wait(timeout=30)


def layers(db: Path, rounds: int) -> dict[str, float]:
    """CPU per recall of each layer a served recall passes, in this process, one call at a time:
    the engine (Memory.recall), the service (its audit record, what the caller may see), the
    request's validation, the response (dicts, then FastAPI's response model and json, or the
    JSON the app writes), the thread-pool hop, and the whole ASGI app (auth, routing, all of the
    above) called without a socket. What uvicorn adds is the served server's CPU less the app's."""
    import asyncio
    import json

    from starlette.concurrency import run_in_threadpool

    from forge.server import app as served
    from forge.server import models as m

    mem = Memory.open(db, embedder=EMBEDDER)
    while mem.store.info.get("warming"):
        time.sleep(0.1)
    token = KeyStore.beside(db).create(agent="layers-agent", rate=1e9)
    app = served.create_app(mem, keys=KeyStore.beside(db), mcp=False, dashboard=False, rate=1e9)
    service = app.state.service
    who = app.state.auth.principal(token, "127.0.0.1")
    rng = random.Random(5)
    queries = [VOCAB.queries(np.array([rng.randrange(TOPICS)]), np.random.default_rng(rng.randrange(2**32)))[0]
               for _ in range(rounds)]
    bodies = [json.dumps({"query": q, "k": 10, "touch": False}).encode() for q in queries]

    def cpu(fn: Callable[[Any], Any], xs: list[Any]) -> float:
        for x in xs[:3]:
            fn(x)
        c0 = time.process_time()
        for x in xs:
            fn(x)
        return 1000 * (time.process_time() - c0) / len(xs)

    out: dict[str, float] = {}
    out["engine"] = cpu(lambda q: mem.recall(q, viewer=who.viewer, k=10, touch=False), queries)
    out["service"] = cpu(lambda q: service.recall(who, q, k=10, touch=False), queries)
    out["request validation"] = cpu(m.RecallIn.model_validate_json, bodies)
    results = [service.recall(who, q, k=10, touch=False) for q in queries[:50]]
    dicts = [{"results": [served._recalled(r) for r in rs]} for rs in results]  # noqa: SLF001
    out["response dicts"] = cpu(lambda rs: {"results": [served._recalled(r) for r in rs]}, results)  # noqa: SLF001
    out["response model + json"] = cpu(
        lambda d: json.dumps(m.RecallOut.model_validate(d).model_dump(mode="json"), separators=(",", ":")).encode(), dicts)
    out["json.dumps"] = cpu(lambda d: json.dumps(d, separators=(",", ":")).encode(), dicts)
    with contextlib.suppress(ImportError):
        import orjson

        out["orjson.dumps"] = cpu(orjson.dumps, dicts)

    async def hops(n: int) -> None:
        for _ in range(n):
            await run_in_threadpool(int)

    c0 = time.process_time()
    asyncio.run(hops(2000))
    out["thread-pool hop"] = 1000 * (time.process_time() - c0) / 2000

    async def asgi(body: bytes) -> int:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
                 "path": "/v1/recall", "raw_path": b"/v1/recall", "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"127.0.0.1"), (b"authorization", f"Bearer {token}".encode()),
                             (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
                 "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8765), "state": {}}
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await app(scope, receive, send)
        return int(sent[0]["status"])

    async def many(xs: list[bytes]) -> float:
        for b in xs[:3]:
            assert await asgi(b) == 200
        c0 = time.process_time()
        for b in xs:
            await asgi(b)
        return 1000 * (time.process_time() - c0) / len(xs)

    out["ASGI app (no socket)"] = asyncio.run(many(bodies))
    service.close()
    mem.close()
    # Over HTTP: forge serve in its own process (its CPU from /proc), this process the client.
    with serving(db, db.parent, 1) as (url, pid):
        client = Client(url, token, timeout=120)
        for q in queries[:5]:
            client.recall(q, k=10, touch=False)
        c0, s0 = time.process_time(), cpu_seconds(pid)
        for q in queries:
            client.recall(q, k=10, touch=False)
        out["HTTP: client (Client.recall)"] = 1000 * (time.process_time() - c0) / len(queries)
        out["HTTP: server (forge serve)"] = 1000 * (cpu_seconds(pid) - s0) / len(queries)
        client.close()
    return {k: round(v, 3) for k, v in out.items()}


def main() -> None:
    ap = parser(__doc__.split("\n\n")[0])
    ap.add_argument("--units", type=int, default=None, help="store size (default 100000; --quick 5000)")
    ap.add_argument("--seconds", type=float, default=None, help="seconds per measurement (default 8; --quick 2)")
    ap.add_argument("--layers", action="store_true", help="only the CPU per recall of each layer, in this process")
    args = ap.parse_args()
    units = args.units or (5000 if args.quick else 100_000)
    seconds = args.seconds or (2.0 if args.quick else 8.0)
    src = build(units)
    if args.layers:
        work = CACHE_DIR / f"service-layers-{os.getpid()}"
        work.mkdir(parents=True, exist_ok=True)
        try:
            shutil.copy(src, work / "m.db")
            for suffix in INDEX_FILES:
                if Path(str(src) + suffix).exists():
                    shutil.copy(str(src) + suffix, str(work / "m.db") + suffix)
            got = layers(work / "m.db", 100 if args.quick else 400)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        engine, app_ms = got["engine"], got["ASGI app (no socket)"]
        got["app beyond the engine"] = round(app_ms - engine, 3)
        got["server beyond the engine (HTTP)"] = round(got["HTTP: server (forge serve)"] - engine, 3)
        got["uvicorn and the socket (HTTP server less the app)"] = round(got["HTTP: server (forge serve)"] - app_ms, 3)
        if args.json:
            import json

            print(json.dumps({"units": units, "layers_cpu_ms": got, "load_average": list(os.getloadavg())}))
            return
        print(table(f"CPU per recall by layer, {units:,} units, hashing embedder, this process "
                    f"(load average {', '.join(f'{x:.1f}' for x in os.getloadavg())})",
                    ["layer", "CPU ms"], [[k, v] for k, v in got.items()]))
        return
    work = CACHE_DIR / f"service-run-{os.getpid()}"
    work.mkdir(parents=True, exist_ok=True)
    db = work / "m.db"
    shutil.copy(src, db)
    for suffix in INDEX_FILES:
        if Path(str(src) + suffix).exists():
            shutil.copy(str(src) + suffix, str(db) + suffix)
    results: dict[str, dict[str, dict[str, float]]] = {}
    agent = "bench-agent"
    try:
        # In-process: Memory from 1 and 16 threads (one Memory, as a server has).
        mem = Memory.open(db, embedder=EMBEDDER)
        while mem.store.info.get("warming"):  # the search indexes load beside the caller
            time.sleep(0.1)
        for name, op in ops(agent).items():
            for n in (1, 16):
                results.setdefault(name, {})[f"in-process x{n}"] = drive(n, seconds, lambda: mem, op)
                log(f"  in-process {name} x{n}: {results[name][f'in-process x{n}']}")
        mem.close()
        # The same 16 threads with every read on one shared connection (as before reads had
        # a connection per thread): what concurrent reads buy.
        mem = Memory(SQLiteStore(db, concurrent_reads=False), open_embedder(EMBEDDER))
        while mem.store.info.get("warming"):
            time.sleep(0.1)
        results["recall"]["in-process x16, one connection"] = drive(16, seconds, lambda: mem, ops(agent)["recall"])
        log(f"  in-process recall x16, one connection: {results['recall']['in-process x16, one connection']}")
        mem.close()
        # HTTP: forge serve in its own process, an agent key, keep-alive clients; then the
        # recall again with one server process per core (--workers).
        token = KeyStore.beside(db).create(agent=agent, rate=1e9)
        workers = os.cpu_count() or 2
        for n_workers in (1, workers):
            with serving(db, work, n_workers) as (url, pid):
                for name, op in ops(agent).items():
                    for n in (1, 16):
                        if n_workers > 1 and (name, n) != ("recall", 16):
                            continue
                        col = f"HTTP x{n}" + (f", {n_workers} workers" if n_workers > 1 else "")
                        results[name][col] = drive(n, seconds, lambda: Client(url, token, timeout=120), op, server=pid)
                        log(f"  {col} {name}: {results[name][col]}")
        # Batched read audit against the old way (each recall's record in its own write
        # transaction): two servers on the same file, measured in alternating rounds, since
        # one 5-second window on a shared machine varies more than the difference.
        with serving(db, work, 1) as (batched, _), serving(db, work, 1, "--read-audit-ms", "0") as (unbatched, _):
            for n in (1, 16):
                for col in (f"HTTP x{n}, audit batched", f"HTTP x{n}, audit unbatched"):
                    results["recall"][col] = {"rps": 0.0, "p50": 0.0, "p95": 0.0, "n": 0}
                for rnd in range(AUDIT_ROUNDS):
                    order = ((f"HTTP x{n}, audit batched", batched), (f"HTTP x{n}, audit unbatched", unbatched))
                    for col, url in order if rnd % 2 == 0 else order[::-1]:
                        r = drive(n, seconds / 2, lambda url=url: Client(url, token, timeout=120), ops(agent)["recall"])
                        acc = results["recall"][col]
                        for key in ("rps", "p50", "p95"):
                            acc[key] += r[key] / AUDIT_ROUNDS
                        acc["n"] += r["n"]
                        log(f"  {col} round {rnd}: {r}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        import json

        print(json.dumps({"units": units, "seconds": seconds, "results": results}, indent=1))
        return
    cols = ["in-process x1", "HTTP x1", "in-process x16", "HTTP x16"]
    rows = []
    for name, res in results.items():
        rows.append([name, *(f"{res[c]['rps']:,.0f}/s  {res[c]['p50']:.2f} / {res[c]['p95']:.2f}" for c in cols)])
    print(table(f"Service vs in-process, {units:,} units, hashing embedder, {os.cpu_count()} cores (req/s  p50 / p95 ms)", ["op", *cols], rows))
    rec = results["recall"]
    one = rec["in-process x16, one connection"]["rps"]
    print(f"\nIn-process recalls/s at 16 threads: {rec['in-process x16']['rps']:,.0f} with a read connection per thread, "
          f"{one:,.0f} on one shared connection ({rec['in-process x16']['rps'] / one:.2f}x)")
    many = [c for c in rec if c.startswith("HTTP x16, ")]
    if many:
        print(f"HTTP recalls/s at 16 clients: {rec['HTTP x16']['rps']:,.0f} with one server process, "
              f"{rec[many[0]]['rps']:,.0f} with {many[0].split(', ')[1]} ({rec[many[0]]['rps'] / rec['HTTP x16']['rps']:.2f}x)")
    if "HTTP x1, audit unbatched" in rec:
        for n in (1, 16):
            b, u = rec[f"HTTP x{n}, audit batched"], rec[f"HTTP x{n}, audit unbatched"]
            print(f"HTTP recall at {n} client(s), read audit batched vs one write per recall ({AUDIT_ROUNDS} alternating rounds, mean): "
                  f"{b['rps']:,.0f}/s vs {u['rps']:,.0f}/s ({b['rps'] / u['rps']:.2f}x), p50 {b['p50']:.2f} vs {u['p50']:.2f} ms")
    cores = os.cpu_count() or 1
    print(f"\nCPU per recall (ms; the bench's clients and the server share these {cores} cores):")
    for col in (c for c in cols + many if "cpu_ms" in rec.get(c, {})):
        r = rec[col]
        total = r["cpu_ms"] + r["server_cpu_ms"]
        who = "engine" if col.startswith("in-process") else f"clients {r['cpu_ms']:.2f} + server {r['server_cpu_ms']:.2f}"
        print(f"  {col:<28} {who} = {total:.2f} -> at most {1000 * cores / total:,.0f} recalls/s on {cores} cores")
    print(f"HTTP overhead on recall p50 at 1 client: {rec['HTTP x1']['p50'] - rec['in-process x1']['p50']:+.2f} ms (target <= 2 ms); "
          f"recalls/s over HTTP at 16 clients: {rec['HTTP x16']['rps']:,.0f} (target >= 500)")


if __name__ == "__main__":
    main()
