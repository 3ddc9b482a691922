"""Curation on and off over one synthetic stream of writes, side by side.

The stream (seeded, reproducible, one write a minute): new facts ("The port of relay 17 is
8080."), exact re-writes (other case and spacing), paraphrases (a lead word added), value
changes (the same fact with a new value: the old one is now false) and short-lived notes
("Ticket 42 is open.", a one-day TTL). Off: every write is a bare ``Memory.add``. On: every
write goes through admission (``forge.curate.admit``) and one curation pass runs at the end.

Printed per side: active units, duplicate rate (active units that repeat a fact already
held), recall@10 of the facts still true, the share of recalls whose top 10 hold a false
(superseded or expired) fact, and ms per write (p50/p95); then the pass's time at 1k and
10k units.

    python bench/curation.py --quick          # 2,000 writes, hashing embedder
    python bench/curation.py --writes 20000
    python bench/curation.py --embedder local # all-MiniLM-L6-v2 (slower)
"""

from __future__ import annotations

import random
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit, log, parser, percentiles_ms, table  # noqa: E402
from forge.curate import CurationPolicy, admit, curate  # noqa: E402
from forge.engine.memory import Memory  # noqa: E402
from forge.model import Unit, Viewer  # noqa: E402
from forge.store.base import ANY_STATUS  # noqa: E402

T0 = 1_767_225_600.0
ATTRS = ("port", "door code", "backup hour", "owner", "rack")
THINGS = ("relay", "vault", "printer", "router", "server", "sensor", "camera", "gateway")
NAMES = ("Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivo", "Jun")
LEADS = ("Note:", "FYI", "Reminder:", "Heads-up:")
ADMIN = Viewer.admin()


def _value(rng: random.Random, attr: str) -> str:
    return rng.choice(NAMES) if attr == "owner" else str(rng.randint(10, 9999))


def stream(n: int, seed: int = 7) -> tuple[list[dict[str, Any]], dict[tuple[str, str], str]]:
    """``n`` writes and the truth at the end: {(thing, attr): current value}."""
    rng = random.Random(seed)
    truth: dict[tuple[str, str], str] = {}
    writes: list[dict[str, Any]] = []
    tickets = 0
    for i in range(n):
        at = T0 + i * 60.0
        r = rng.random()
        if r < 0.45 or not truth:
            key = (f"{rng.choice(THINGS)} {rng.randint(1, max(50, n // 8))}", rng.choice(ATTRS))
            truth[key] = truth.get(key) or _value(rng, key[1])
            writes.append({"text": f"The {key[1]} of {key[0]} is {truth[key]}.", "key": key, "value": truth[key], "at": at, "kind": "new"})
        elif r < 0.65:
            key = rng.choice(list(truth))
            text = f"the {key[1]} of {key[0]}  is {truth[key]}."
            writes.append({"text": text.upper() if rng.random() < 0.3 else text, "key": key, "value": truth[key], "at": at, "kind": "repeat"})
        elif r < 0.75:
            key = rng.choice(list(truth))
            writes.append({"text": f"{rng.choice(LEADS)} the {key[1]} of {key[0]} is {truth[key]}.", "key": key, "value": truth[key], "at": at, "kind": "paraphrase"})
        elif r < 0.9:
            key = rng.choice(list(truth))
            new = _value(rng, key[1])
            while new == truth[key]:
                new = _value(rng, key[1])
            truth[key] = new
            writes.append({"text": f"The {key[1]} of {key[0]} is {new}.", "key": key, "value": new, "at": at, "kind": "change"})
        else:
            tickets += 1
            writes.append({"text": f"Ticket {tickets} is open.", "key": ("ticket", str(tickets)), "value": "open", "at": at, "kind": "note", "ttl": 86_400.0})
    return writes, truth


def _unit(w: dict[str, Any]) -> Unit:
    meta = {"ttl_s": w["ttl"]} if "ttl" in w else {}
    return Unit(w["text"], kind="fact", created_at=w["at"], owner="stream", meta=meta)


_FACT = re.compile(r"(?:the )?(?P<attr>[a-z ]+?) of (?P<thing>[a-z]+ \d+)\s+is (?P<value>\w+)\.?$", re.IGNORECASE)


def _parse(content: str) -> tuple[tuple[str, str], str] | None:
    text = content.split(" ", 1)[1] if content.split(" ", 1)[0] in LEADS or content.startswith("FYI ") else content
    m = _FACT.search(text.strip())
    if not m:
        return None
    return (m["thing"].lower(), m["attr"].lower()), m["value"]


def measure(mem: Memory, truth: dict[tuple[str, str], str], *, now: float, queries: int, seed: int) -> dict[str, Any]:
    active = mem.store.list(viewer=ADMIN, limit=1_000_000)
    seen: set[tuple[Any, ...]] = set()
    dups = 0
    for u in active:
        got = _parse(u.content)
        key = (got[0], got[1].lower()) if got else (u.content.lower(),)
        dups += key in seen
        seen.add(key)
    rng = random.Random(seed)
    keys = rng.sample(sorted(truth), min(queries, len(truth)))
    found = false_hits = 0
    for key in keys:
        hits = mem.recall(f"{key[1]} of {key[0]}", viewer=ADMIN, k=10, touch=False)
        facts = [(_parse(h.unit.content), h.unit) for h in hits]
        found += any(f is not None and f[0] == key and f[1].lower() == truth[key].lower() for f, _ in facts)
        stale = any(f is not None and f[0] == key and f[1].lower() != truth[key].lower() for f, _ in facts)
        stale |= any(f is None and u.content.startswith("Ticket") and now - u.created_at > 86_400 for f, u in facts)
        false_hits += stale
    return {
        "active": len(active),
        "duplicates": dups,
        "duplicate_rate": dups / len(active) if active else 0.0,
        "recall_at_10": found / len(keys) if keys else 0.0,
        "false_recall_share": false_hits / len(keys) if keys else 0.0,
    }


def side(writes: list[dict[str, Any]], truth: dict[tuple[str, str], str], *, on: bool, embedder: str, workdir: Path, queries: int) -> dict[str, Any]:
    mem = Memory.open(workdir / f"{'on' if on else 'off'}.db", embedder=embedder)
    try:
        times: list[float] = []
        actions: dict[str, int] = {}
        for i, w in enumerate(writes):
            u = _unit(w)
            t = time.perf_counter()
            if on:
                [d] = admit(mem, u, actor="stream", now=w["at"])
                actions[d.action] = actions.get(d.action, 0) + 1
            else:
                mem.add(u, actor="stream")
            times.append(time.perf_counter() - t)
            if (i + 1) % 2000 == 0:
                log(f"  {'on' if on else 'off'}: {i + 1}/{len(writes)} writes")
        now = writes[-1]["at"] + 60.0
        pass_s = None
        if on:
            t = time.perf_counter()
            plan = curate(mem, policy=CurationPolicy(), now=now)
            pass_s = time.perf_counter() - t
            actions.update({f"pass:{k}": v for k, v in plan.counts().items()})
        out = measure(mem, truth, now=now, queries=queries, seed=1)
        out.update(percentiles_ms(times), stored=mem.store.count(viewer=ADMIN, filter=ANY_STATUS), actions=actions, pass_s=pass_s)
        return out
    finally:
        mem.close()


def pass_times(sizes: list[int], *, embedder: str, workdir: Path) -> list[dict[str, Any]]:
    """One dry and one applied pass over ``n`` bare-added units (a tenth of them expired notes)."""
    out = []
    for n in sizes:
        writes, _ = stream(n, seed=11)
        mem = Memory.open(workdir / f"pass-{n}.db", embedder=embedder)
        try:
            for i in range(0, n, 500):
                mem.add([_unit(w) for w in writes[i : i + 500]])
            now = writes[-1]["at"] + 2 * 86_400.0  # the early notes have expired
            t = time.perf_counter()
            dry = curate(mem, now=now, dry_run=True)
            dry_s = time.perf_counter() - t
            t = time.perf_counter()
            curate(mem, now=now)
            out.append({"units": n, "dry_run_s": dry_s, "pass_s": time.perf_counter() - t, "changes": len(dry.changes)})
        finally:
            mem.close()
    return out


def side_rows(off: dict[str, Any], on: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The off / on rows both this bench and ``lifecycle.py`` print."""
    return [
        ("active units", off["active"], on["active"]),
        ("stored units (all states)", off["stored"], on["stored"]),
        ("duplicates (active units repeating a held fact)", off["duplicates"], on["duplicates"]),
        ("duplicate rate", off["duplicate_rate"], on["duplicate_rate"]),
        ("recall@10 of true facts", off["recall_at_10"], on["recall_at_10"]),
        ("recalls with a false (superseded/expired) fact in top 10", off["false_recall_share"], on["false_recall_share"]),
        ("ms per write p50", off["p50_ms"], on["p50_ms"]),
        ("ms per write p95", off["p95_ms"], on["p95_ms"]),
    ]


def render(r: dict[str, Any]) -> str:
    a = table(
        f"Curation off vs on: {r['writes']:,} writes ({r['mix']}), {r['queries']} queries, embedder {r['embedder']}",
        ["", "off", "on"],
        side_rows(r["off"], r["on"]),
    )
    b = table("Curation pass time", ["units", "dry run s", "pass s", "changes"], [(p["units"], p["dry_run_s"], p["pass_s"], p["changes"]) for p in r["pass"]])
    return f"{a}\n  admission decisions: {r['on']['actions']}\n\n{b}"


def both_sides(writes: int, *, embedder: str, queries: int, workdir: Path) -> dict[str, Any]:
    """Curation off and on over one stream of ``writes``: the comparison both benches print."""
    stream_, truth = stream(writes)
    mix: dict[str, int] = {}
    for w in stream_:
        mix[w["kind"]] = mix.get(w["kind"], 0) + 1
    log(f"stream: {writes} writes {mix}")
    return {
        "writes": writes,
        "mix": ", ".join(f"{k} {v}" for k, v in mix.items()),
        "queries": min(queries, len(truth)),
        "embedder": embedder,
        "off": side(stream_, truth, on=False, embedder=embedder, workdir=workdir, queries=queries),
        "on": side(stream_, truth, on=True, embedder=embedder, workdir=workdir, queries=queries),
    }


def run(*, writes: int = 10_000, embedder: str = "hash", queries: int = 300, pass_sizes: tuple[int, ...] = (1_000, 10_000)) -> dict[str, Any]:
    """Both sides over one stream, and the pass times; the result ``main`` prints."""
    with tempfile.TemporaryDirectory(prefix="forge-curation-") as tmp:
        work = Path(tmp)
        r = both_sides(writes, embedder=embedder, queries=queries, workdir=work)
        log("pass times ...")
        passes = pass_times(list(pass_sizes), embedder=embedder, workdir=work)
    return {"bench": "curation", **r, "pass": passes}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--writes", type=int, default=None, help="writes in the stream (default 10,000; --quick 2,000)")
    p.add_argument("--embedder", default="hash", help="hash | local (default hash: the pipeline, not the model)")
    p.add_argument("--queries", type=int, default=300)
    args = p.parse_args()
    n = args.writes or (2_000 if args.quick else 10_000)
    sizes = (1_000,) if args.quick else (1_000, 10_000)
    emit(run(writes=n, embedder=args.embedder, queries=args.queries, pass_sizes=sizes), args.json, render)


if __name__ == "__main__":
    main()
