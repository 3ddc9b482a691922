"""Propagation over Redis Streams: latency, throughput and traffic by topology and size.

    python bench/propagation.py --quick          # about a minute
    python bench/propagation.py --json out.json  # also write every figure as JSON

For 4, 16 and 64 agents and each topology (full, star, ring, similarity, hierarchical) it
measures, in one process with a few worker threads serving the agents' inboxes:

- latency: capsules paced so the bus carries ~400 deliveries/s (unsaturated); time from the origin's send to each receiver's
  handler (relay hops included), p50 and p99;
- throughput: a burst of capsules; deliveries (handled capsules) per second;
- raw baseline: the same fan-out with plain redis-py XADD / XREADGROUP / XACK and no
  capsules, signatures or topology, on the same server in the same run; the ratio is
  FORGE's overhead;
- traffic: messages per capsule, connections and relay load per agent, from the topology
  and checked against what the bus actually carried; star and hierarchical also with a
  relay filter that passes ~30% of capsules on.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from forge.errors import BusError
from forge.model import Unit
from forge.share.bus import Network
from forge.share.bus.redis import RedisBus
from forge.share.capsule import Capsule, Keyring
from forge.share.topology import FullMesh, Hierarchical, Ring, Similarity, Star, load

TOPOLOGIES = ["full", "star", "ring", "similarity", "hierarchical"]
PAYLOAD_TEXT = "When the scanner reports an open SSH port on a user host, restore it before analysing."


def make_topology(kind: str, agents: list[str], *, accept=None):
    if kind == "full":
        return FullMesh(agents)
    if kind == "star":
        return Star(agents, accept=accept)
    if kind == "ring":
        return Ring(agents, k=2)
    if kind == "similarity":
        rng = np.random.default_rng(7)
        centres = rng.normal(size=(max(2, len(agents) // 8), 16))
        profiles = {a: centres[i % len(centres)] + rng.normal(0, 0.3, 16) for i, a in enumerate(agents)}
        return Similarity(profiles, k=3)
    return Hierarchical.balanced(agents, accept=accept)


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


class Workers:
    """A few threads that poll the agents' inboxes round-robin and run ``step(agent)``."""

    def __init__(self, agents: list[str], step: Callable[[str], int], *, threads: int = 4) -> None:
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        shares = [agents[i::threads] for i in range(min(threads, len(agents)))]
        self.threads = [threading.Thread(target=self._run, args=(s, step), daemon=True) for s in shares]
        for t in self.threads:
            t.start()

    def _run(self, share: list[str], step: Callable[[str], int]) -> None:
        try:
            while not self.stop.is_set():
                if sum(step(a) for a in share) == 0:
                    time.sleep(0.0005)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            self.errors.append(exc)

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=5)


def wait_for(pred: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.002)
    return pred()


def run_forge(url: str, kind: str, n: int, *, latency_caps: int, burst_caps: int, pace_s: float) -> dict:
    agents = [f"a{i:02d}" for i in range(n)]
    topo = make_topology(kind, agents)
    prefix = f"forge-bench:{os.getpid()}:{kind}:{n}:"
    bus = RedisBus.from_url(url, prefix=prefix, socket_timeout=5)
    net = Network(bus, topo, keyring=Keyring.from_secret("bench"))
    inboxes = {a: net.inbox(a) for a in agents}
    lat: list[float] = []
    lock = threading.Lock()
    count = [0]

    def handle(c: Capsule) -> None:
        dt = time.time() - c.unit.created_at
        with lock:
            lat.append(dt)
            count[0] += 1

    workers = Workers(agents, lambda a: net.pump(a, inboxes[a], handle=handle, count=128))
    rng = random.Random(1)
    try:
        # latency: a steady pace, well below saturation
        expected = 0
        for _ in range(latency_caps):
            s = rng.choice(agents)
            net.send(Capsule.of(Unit(PAYLOAD_TEXT, owner=s, created_at=time.time()), sender=s))
            expected += topo.route(s).messages
            time.sleep(pace_s)
        ok = wait_for(lambda: count[0] >= expected, 30)
        lat_ms = [x * 1000 for x in lat]
        # throughput: a burst, as fast as one sender thread can publish
        with lock:
            lat.clear()
            count[0] = 0
        sent_before = sum(net.sent.values())
        burst_expected = 0
        t0 = time.perf_counter()
        for _ in range(burst_caps):
            s = rng.choice(agents)
            net.send(Capsule.of(Unit(PAYLOAD_TEXT, owner=s, created_at=time.time()), sender=s))
            burst_expected += topo.route(s).messages
        ok = wait_for(lambda: count[0] >= burst_expected, 60) and ok
        elapsed = time.perf_counter() - t0
        carried = sum(net.sent.values()) - sent_before
        if workers.errors:
            raise workers.errors[0]
    finally:
        workers.close()
        bus.purge()
        bus.close()
    return {
        "topology": kind,
        "agents": n,
        "complete": ok,
        "latency_p50_ms": round(statistics.median(lat_ms), 3) if lat_ms else None,
        "latency_p99_ms": round(pct(lat_ms, 0.99), 3),
        "burst_capsules": burst_caps,
        "deliveries": count[0],
        "deliveries_per_s": round(count[0] / elapsed, 1),
        "capsules_per_s": round(burst_caps / elapsed, 1),
        "bus_messages_checked": carried == burst_expected,
    }


def run_raw(url: str, n: int, *, latency_caps: int, burst_caps: int, pace_s: float) -> dict:
    """Full-mesh fan-out with plain redis-py: the floor FORGE's numbers are compared with."""
    import redis

    prefix = f"forge-bench-raw:{os.getpid()}:{n}:"
    r = redis.Redis.from_url(url, socket_timeout=5)
    agents = [f"a{i:02d}" for i in range(n)]
    keys = {a: f"{prefix}{a}" for a in agents}
    for a in agents:
        r.xgroup_create(keys[a], a, "0", mkstream=True)
    payload = os.urandom(len(PAYLOAD_TEXT) * 6)  # about a capsule's JSON size
    lat: list[float] = []
    lock = threading.Lock()
    count = [0]

    def step(a: str) -> int:
        resp = r.xreadgroup(a, a, {keys[a]: ">"}, count=128)
        if not resp:
            return 0
        entries = resp[0][1]
        now = time.time()
        with lock:
            for _, f in entries:
                lat.append(now - float(f[b"t"]))
            count[0] += len(entries)
        r.xack(keys[a], a, *[mid for mid, _ in entries])
        return len(entries)

    def send(s: str) -> int:
        pipe = r.pipeline(transaction=False)
        t = repr(time.time())
        for a in agents:
            if a != s:
                pipe.xadd(keys[a], {b"p": payload, b"t": t})
        pipe.execute()
        return n - 1

    workers = Workers(agents, step)
    rng = random.Random(1)
    try:
        expected = 0
        for _ in range(latency_caps):
            expected += send(rng.choice(agents))
            time.sleep(pace_s)
        wait_for(lambda: count[0] >= expected, 30)
        lat_ms = [x * 1000 for x in lat]
        with lock:
            lat.clear()
            count[0] = 0
        t0 = time.perf_counter()
        burst_expected = sum(send(rng.choice(agents)) for _ in range(burst_caps))
        ok = wait_for(lambda: count[0] >= burst_expected, 60)
        elapsed = time.perf_counter() - t0
        if workers.errors:
            raise workers.errors[0]
    finally:
        workers.close()
        r.delete(*keys.values())
        r.close()
    return {
        "topology": "raw redis-py (full fan-out)",
        "agents": n,
        "complete": ok,
        "latency_p50_ms": round(statistics.median(lat_ms), 3),
        "latency_p99_ms": round(pct(lat_ms, 0.99), 3),
        "deliveries": count[0],
        "deliveries_per_s": round(count[0] / elapsed, 1),
        "capsules_per_s": round(burst_caps / elapsed, 1),
    }


def traffic(sizes: list[int]) -> list[dict]:
    """Messages per capsule and per agent, structurally and with a ~30% relay filter."""
    rows = []
    rng = random.Random(3)
    for n in sizes:
        agents = [f"a{i:02d}" for i in range(n)]
        caps = {a: Capsule.of(Unit(PAYLOAD_TEXT, owner=a, importance=rng.random()), sender=a) for a in agents}
        for kind in TOPOLOGIES:
            row = {"topology": kind, **load(make_topology(kind, agents)).to_dict()}
            if kind in ("star", "hierarchical"):
                filt = make_topology(kind, agents, accept=lambda relay, c: c.unit.importance >= 0.7)
                row["messages_per_capsule_filtered"] = round(
                    sum(filt.route(a, caps[a]).messages for a in agents) / n, 2
                )
            rows.append(row)
    return rows


def table(rows: list[dict], cols: list[str]) -> str:
    widths = [max(len(c), *(len(str(r.get(c, ""))) for r in rows)) for c in cols]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True))]
    for r in rows:
        lines.append("  ".join(str(r.get(c, "")).ljust(w) for c, w in zip(cols, widths, strict=True)))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", default="redis://127.0.0.1:6379/0")
    ap.add_argument("--quick", action="store_true", help="fewer capsules; about a minute")
    ap.add_argument("--json", nargs="?", const="-", default=None, help="write results as JSON (to a file or stdout)")
    ap.add_argument("--sizes", default="4,16,64")
    ap.add_argument("--offered", type=float, default=400.0, help="deliveries/s offered in the latency phase")
    args = ap.parse_args(argv)
    sizes = [int(x) for x in args.sizes.split(",")]
    lat_caps, burst, pace = (20, 40, 0.005) if args.quick else (100, 200, 0.005)

    probe = RedisBus.from_url(args.url, socket_timeout=0.5, retries=0)
    try:
        probe.ping()
    except BusError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        probe.close()

    t_start = time.monotonic()
    results, raw = [], []
    for n in sizes:
        agents = [f"a{i:02d}" for i in range(n)]
        # latency is measured unsaturated: capsules are paced so the bus carries about
        # --offered deliveries per second whatever the fan-out
        raw_pace = max(pace, (n - 1) / args.offered)
        raw.append(run_raw(args.url, n, latency_caps=lat_caps, burst_caps=burst, pace_s=raw_pace))
        for kind in TOPOLOGIES:
            per = max(1.0, load(make_topology(kind, agents)).messages_per_capsule)
            # the burst is sized so every run carries a similar number of deliveries
            caps = max(20, min(burst * 8, int(burst * (n - 1) / per)))
            row = run_forge(args.url, kind, n, latency_caps=lat_caps, burst_caps=caps,
                            pace_s=max(pace, per / args.offered))
            if kind == "full":  # the same workload as the raw run: the ratios mean something
                base = raw[-1]
                row["throughput_vs_raw"] = round(base["deliveries_per_s"] / row["deliveries_per_s"], 2)
                row["p50_vs_raw"] = round(row["latency_p50_ms"] / base["latency_p50_ms"], 2)
            results.append(row)
            print(f"  {kind:<13} n={n:<3} p50={row['latency_p50_ms']:.2f}ms p99={row['latency_p99_ms']:.2f}ms "
                  f"{row['deliveries_per_s']:.0f} deliveries/s", file=sys.stderr)
    traffic_rows = traffic(sizes)
    cols = ["topology", "agents", "latency_p50_ms", "latency_p99_ms", "deliveries_per_s", "capsules_per_s",
            "throughput_vs_raw", "p50_vs_raw", "complete"]
    print("\nPropagation over Redis Streams (one process, 4 worker threads, one inbox stream per agent)")
    print("*_vs_raw: raw / FORGE for the same full fan-out (only the full mesh carries the raw workload)")
    print(table(raw + results, cols))
    print("\nTraffic per topology (every agent sends one capsule)")
    print(table(traffic_rows, ["topology", "agents", "messages_per_capsule", "messages_per_capsule_filtered",
                               "reach", "peers_max", "sent_per_agent_max", "received_per_agent_max"]))
    print(f"\ntotal {time.monotonic() - t_start:.1f}s")
    if args.json:
        doc = {"raw": raw, "forge": results, "traffic": traffic_rows, "quick": args.quick}
        if args.json == "-":
            print(json.dumps(doc, indent=2))
        else:
            with open(args.json, "w") as f:
                json.dump(doc, f, indent=2)
    return 0 if all(r["complete"] for r in raw + results) else 1


if __name__ == "__main__":
    sys.exit(main())
