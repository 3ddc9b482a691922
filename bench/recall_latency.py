"""Recall latency at 10k / 100k / 1M units, query embedding excluded.

Each size is a SQLite file store of synthetic units: clustered 384-d vectors
(bench/_common.Mixture) and texts from a Zipf vocabulary with per-cluster topic words, so
FTS5 has realistic postings; 8 kinds, 40 skewed tags, 80% global / 10% group / 10%
private scopes. Stores are built once into .bench/ and reused (building 1M takes a while:
progress is printed). Modes, k=10, one query at a time:

  vector          store.vector_search
  keyword         store.keyword_search (BM25 over the in-memory index, forge.store.keywords)
  hybrid          forge.engine.recall.recall (score fusion, the default), precomputed query vector, touch=False
  hybrid, no boost ... without the attribution boost (what it costs)
  hybrid rrf      ... with reciprocal rank fusion
  hybrid+touch    ... touch=True: access statistics are batched, not one write per recall
  hybrid+filter   ... with Filter(kinds={rule}, tags_all={tag05})
  hybrid+filter, varying  ... with one of 24 kind + tag filters, never the previous query's
  hybrid+agent    ... as Viewer.of("agent-7", groups=["g3"]) instead of the operator
  vector k=30 / keyword k=100  what hybrid asks each signal for (forge.engine.recall's VECTOR_ / KEYWORD_CANDIDATES)
  keyword / hybrid / hybrid+filter fts5   the same on a second handle of the same file
                  opened with keyword_index=False: FTS5 ranks, as before the in-memory index

plus ANN recall@10 of store.vector_search against exact numpy search over the same
vectors, and the first recall after opening the file (the index is loaded beside the
caller at open, so it should not pay for it). Targets (issue 26): ANN recall@10 >= 0.97;
hybrid p50 <= 3 ms at 100k and <= 5 ms at 1M; hybrid+filter p50 <= 20 ms and a new filter per
query <= 15 ms at 1M, on wall time and on this process's CPU time (shared cores). Where hybrid
misses its target at 100k (or with --profile), cProfile shows where the time goes.

    python bench/recall_latency.py [--quick] [--json] [--sizes 10000,100000,1000000]
                                   [--queries Q] [--profile] [--rebuild] [--build-only]
"""

from __future__ import annotations

import cProfile
import io
import itertools
import json
import pstats
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np

from _common import (
    BLOCK,
    CACHE_DIR,
    Mixture,
    Vocabulary,
    emit,
    exact_topk,
    load_average,
    log,
    parser,
    percentiles_ms,
    table,
    time_calls,
)
from forge.engine.recall import KEYWORD_CANDIDATES, VECTOR_CANDIDATES, Weights, recall
from forge.model import Context, Unit, Viewer
from forge.store import ANY_STATUS, Filter, SQLiteStore

BUILD_VERSION = 1  # bump when the synthetic data changes, so cached stores are rebuilt
BATCH = 2000
K = 10
KINDS = ("fact", "rule", "episode", "lesson", "example", "preference", "procedure", "profile")
KIND_P = np.array([0.3, 0.12, 0.2, 0.1, 0.08, 0.08, 0.06, 0.06])
N_TAGS = 40
TAG_P = 1.0 / np.arange(1, N_TAGS + 1)
TAG_P /= TAG_P.sum()
FILTER = Filter.make(kinds=["rule"], tags_all=["tag05"])
# A different filter on every query (kind x tag, 0.3-3% of units each): nothing an earlier
# query listed or gathered is reused, as for an agent whose every recall narrows differently.
FILTERS = [Filter.make(kinds=[kind], tags_all=[f"tag{t:02d}"]) for t in range(3, 9) for kind in KINDS[:4]]
AGENT = Viewer.of("agent-7", groups=["g3"])
ADMIN = Viewer.admin()
# Targets (issue 26, tightening issue 13's 5 / 10 / 20 ms and 0.95): p50 wall time, also
# checked on CPU time because these cores are shared.
TARGET_P50_MS = {100_000: 3.0, 1_000_000: 5.0}
TARGET_FILTER_P50_MS = {1_000_000: 20.0}
TARGET_VARYING_P50_MS = {1_000_000: 15.0}
TARGET_RECALL = 0.97


def _units(start: int, vecs_clusters: tuple[np.ndarray, np.ndarray], vocab: Vocabulary) -> list[Unit]:
    _, clusters = vecs_clusters
    n = len(clusters)
    rng = np.random.default_rng([0, 5, start])
    texts = vocab.texts(clusters, rng)
    kinds = rng.choice(len(KINDS), n, p=KIND_P)
    n_tags = rng.integers(1, 4, n)
    tags = rng.choice(N_TAGS, (n, 3), p=TAG_P)
    scope_roll = rng.random(n)
    group = rng.integers(0, 10, n)
    owner = rng.integers(0, 100, n)
    out = []
    for i in range(n):
        if scope_roll[i] < 0.8:
            scope, own = "global", ""
        elif scope_roll[i] < 0.9:
            scope, own = f"group:g{group[i]}", ""
        else:
            scope, own = "private", f"agent-{owner[i]}"
        out.append(Unit(texts[i], kind=KINDS[kinds[i]], id=f"u{start + i:08d}", scope=scope, owner=own,
                        context=Context(tags=tuple(f"tag{t:02d}" for t in tags[i, : n_tags[i]]))))
    return out


def build(n: int, cache: Path, *, rebuild: bool = False) -> tuple[Path, dict[str, Any]]:
    """The cached store for size ``n``, built (with progress) when missing or stale.

    An interrupted build resumes where it stopped: the data is generated deterministically
    per 10k block, every ``store.add`` is one transaction, and every 100k units the ANN
    index is caught up and saved (the store replays rows written after its last save on open).
    """
    cache.mkdir(parents=True, exist_ok=True)
    db = cache / f"latency-{n}.db"
    marker = cache / f"latency-{n}.json"
    info: dict[str, Any] = json.loads(marker.read_text()) if marker.exists() else {}
    stale = rebuild or info.get("version", BUILD_VERSION) != BUILD_VERSION
    if not stale and db.exists() and info.get("complete") and info.get("n") == n:
        return db, {**info, "cached": True}
    if stale or not db.exists():
        for p in cache.glob(f"latency-{n}.*"):
            p.unlink() if p.is_file() else shutil.rmtree(p)
        info = {}
    marker.write_text(json.dumps({"n": n, "version": BUILD_VERSION, "complete": False}))
    mix, vocab = Mixture(), Vocabulary()
    t0 = time.perf_counter()
    gen_s = 0.0
    store = SQLiteStore(db)
    try:
        done = store.count(viewer=ADMIN, filter=ANY_STATUS)
        if done:
            last = store.list(viewer=ADMIN, filter=ANY_STATUS, limit=1, offset=done - 1)[0].id
            if last != f"u{done - 1:08d}":
                raise SystemExit(f"{db}: unexpected content; delete it or pass --rebuild")
            log(f"resuming the {n:,}-unit store at {db} from {done:,} units (catching the index up) ...")
        else:
            log(f"building {n:,}-unit store at {db} ...")
        first = done
        t_last, n_last = time.perf_counter(), done
        for b in range(done // BLOCK, (n + BLOCK - 1) // BLOCK):
            g0 = time.perf_counter()
            start = b * BLOCK
            vecs, clusters = mix.corpus(start, min(BLOCK, n - start))
            units = _units(start, (vecs, clusters), vocab)
            skip = max(done - start, 0)
            units, vecs = units[skip:], vecs[skip:]
            gen_s += time.perf_counter() - g0
            for i in range(0, len(units), BATCH):
                store.add(units[i : i + BATCH], vecs[i : i + BATCH])
            done += len(units)
            if done % 100_000 == 0 or done == n:
                # the first search opens the index and catches it up with the rows written since
                # its last save (the whole store on the first round); then save it
                store.vector_search(vecs[0] if len(vecs) else mix.queries(1)[0][0], k=1, viewer=ADMIN)
                store.flush()
            if done % max(n // 20, BLOCK) == 0 or done == n:
                now = time.perf_counter()
                el = now - t0
                rate = (done - n_last) / (now - t_last)
                t_last, n_last = now, done
                avg = (done - first) / el
                log(f"  {done:>9,} / {n:,} units  {rate:,.0f}/s now, {avg:,.0f}/s average  elapsed {el:,.0f}s  "
                    f"eta {(n - done) / max(avg, 1):,.0f}s")
            del units, vecs, clusters
        t1 = time.perf_counter()
        store.close()
        save_s = time.perf_counter() - t1
    except BaseException:
        store.close()
        raise
    total = time.perf_counter() - t0
    built = n - first
    info = {"n": n, "version": BUILD_VERSION, "complete": True, "build_s": round(total, 1),
            "units_per_s": round(built / max(total - gen_s, 1e-9)) if built else None,
            "resumed_from": first or None, "datagen_s": round(gen_s, 1), "index_save_s": round(save_s, 1),
            "bytes": sum(p.stat().st_size for p in cache.glob(f"latency-{n}.db*"))}
    marker.write_text(json.dumps(info))
    return db, {**info, "cached": False}


def _profile(fn: Any, inputs: list[Any], top: int = 14) -> list[dict[str, Any]]:
    prof = cProfile.Profile()
    prof.enable()
    for x in inputs:
        fn(x)
    prof.disable()
    st = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, func), (_cc, nc, tt, ct, _callers) in st.stats.items():  # type: ignore[attr-defined]
        rows.append({"function": f"{Path(file).name}:{line}({func})", "calls_per_query": round(nc / len(inputs), 1),
                     "cum_ms_per_query": round(ct / len(inputs) * 1000, 3), "own_ms_per_query": round(tt / len(inputs) * 1000, 3)})
    rows.sort(key=lambda r: r["cum_ms_per_query"], reverse=True)
    return rows[:top]


def measure(n: int, n_queries: int, *, cache: Path, rebuild: bool = False, profile: bool = False) -> dict[str, Any]:
    db, build_info = build(n, cache, rebuild=rebuild)
    mix, vocab = Mixture(), Vocabulary()
    qv, qc = mix.queries(n_queries)
    qt = vocab.queries(qc, np.random.default_rng([0, 9]))
    queries = list(zip(qt, qv, strict=True))
    t0 = time.perf_counter()
    store = SQLiteStore(db)
    opened_s = time.perf_counter() - t0
    fts = SQLiteStore(db, keyword_index=False)
    try:
        time.sleep(0.5)  # an agent opens its memory a moment before its first question
        t1 = time.perf_counter()
        recall(store, query=qt[0], query_vector=qv[0], viewer=ADMIN, k=K, touch=False)
        first_ms = (time.perf_counter() - t1) * 1000
        if store._warming is not None:  # noqa: SLF001 - how long the background load took
            store._warming.join()
        open_s = time.perf_counter() - t0
        log(f"{n:,}: opened in {opened_s * 1000:.0f} ms, first recall {first_ms:.0f} ms, index ready after "
            f"{open_s:.1f}s; timing {n_queries} queries per mode ...")
        turn = itertools.count()  # the varying filter: consecutive queries never share one
        modes = {
            "vector": lambda q: store.vector_search(q[1], k=K, viewer=ADMIN),
            "keyword": lambda q: store.keyword_search(q[0], k=K, viewer=ADMIN),
            "hybrid": lambda q: recall(store, query=q[0], query_vector=q[1], viewer=ADMIN, k=K, touch=False),
            "hybrid, no boost": lambda q: recall(store, query=q[0], query_vector=q[1], viewer=ADMIN, k=K, touch=False,
                                                 weights=Weights(attribution=0.0)),
            "hybrid rrf": lambda q: recall(store, query=q[0], query_vector=q[1], viewer=ADMIN, k=K, touch=False,
                                           weights=Weights(fusion="rrf")),
            "hybrid+touch": lambda q: recall(store, query=q[0], query_vector=q[1], viewer=ADMIN, k=K, touch=True),
            "hybrid+filter": lambda q: recall(store, query=q[0], query_vector=q[1], viewer=ADMIN, k=K,
                                              filter=FILTER, touch=False),
            "hybrid+filter, varying": lambda q: recall(store, query=q[0], query_vector=q[1], viewer=ADMIN, k=K,
                                                       filter=FILTERS[next(turn) % len(FILTERS)], touch=False),
            "hybrid+agent": lambda q: recall(store, query=q[0], query_vector=q[1], viewer=AGENT, k=K, touch=False),
            "vector k=30": lambda q: store.vector_search(q[1], k=max(3 * K, VECTOR_CANDIDATES), viewer=ADMIN),
            "keyword k=100": lambda q: store.keyword_search(q[0], k=max(3 * K, KEYWORD_CANDIDATES), viewer=ADMIN),
            "keyword fts5": lambda q: fts.keyword_search(q[0], k=K, viewer=ADMIN),
            "hybrid fts5": lambda q: recall(fts, query=q[0], query_vector=q[1], viewer=ADMIN, k=K, touch=False),
            "hybrid+filter fts5": lambda q: recall(fts, query=q[0], query_vector=q[1], viewer=ADMIN, k=K,
                                                   filter=FILTER, touch=False),
        }
        lat: dict[str, dict[str, float]] = {}
        found_vec: list[list[int]] = []
        for name, fn in modes.items():
            cpu: list[float] = []
            times, outs = time_calls(fn, queries, cpu=cpu)
            lat[name] = percentiles_ms(times)
            lat[name]["cpu_p50_ms"] = percentiles_ms(cpu)["p50_ms"]
            if name == "vector":
                found_vec = [[int(h.id[1:]) for h in hits] for hits in outs]
            if name in ("hybrid+filter", "hybrid+filter, varying", "hybrid+agent"):
                lat[name]["mean_results"] = round(float(np.mean([len(o) for o in outs])), 1)
            log(f"  {name:<14} p50 {lat[name]['p50_ms']:8.2f} ms  p95 {lat[name]['p95_ms']:8.2f} ms  "
                f"CPU p50 {lat[name]['cpu_p50_ms']:8.2f} ms")
        selectivity = store.count(viewer=ADMIN, filter=FILTER) / n
        varying = [store.count(viewer=ADMIN, filter=f) / n for f in FILTERS]
        agent_visible = store.count(viewer=AGENT) / n
        prof_rows = None
        if profile or (n >= 100_000 and lat["hybrid"]["p50_ms"] > TARGET_P50_MS.get(n, 10.0)):
            prof_rows = {m: _profile(modes[m], queries[: min(60, len(queries))]) for m in ("hybrid", "hybrid+filter")}
        same = sum(
            [h.id for h in store.keyword_search(q[0], k=K, viewer=ADMIN)] == [h.id for h in fts.keyword_search(q[0], k=K, viewer=ADMIN)]
            for q in queries
        ) / len(queries)
    finally:
        store.close()
        fts.close()
    log(f"{n:,}: exact search for ground truth ...")
    truth = exact_topk(lambda: ((s, v) for s, v, _ in mix.iter_corpus(n)), qv, K)
    ann = round(sum(len(set(f) & set(t.tolist())) / K for f, t in zip(found_vec, truth, strict=True)) / len(truth), 4)
    targets: dict[str, bool | None] = {f"ann_recall@10>={TARGET_RECALL:g}": ann >= TARGET_RECALL}
    for mode, goal in (("hybrid", TARGET_P50_MS), ("hybrid+filter", TARGET_FILTER_P50_MS),
                       ("hybrid+filter, varying", TARGET_VARYING_P50_MS)):
        if n in goal:
            targets[f"{mode}_p50<={goal[n]:g}ms"] = lat[mode]["p50_ms"] <= goal[n]
            targets[f"{mode}_cpu_p50<={goal[n]:g}ms"] = lat[mode]["cpu_p50_ms"] <= goal[n]
    return {"n": n, "build": build_info, "index_open_s": round(open_s, 2), "open_ms": round(opened_s * 1000, 1),
            "first_recall_ms": round(first_ms, 1), "latency": lat, "keyword_same_top10_as_fts5": round(same, 3),
            "ann_recall@10": ann, "filter_selectivity": round(selectivity, 5),
            "varying_filter_share": [round(min(varying), 5), round(max(varying), 5)],
            "agent_visible_share": round(agent_visible, 4),
            "targets": targets, "profile": prof_rows}


def run(sizes: list[int], n_queries: int, *, cache: Path = CACHE_DIR, rebuild: bool = False,
        profile: bool = False) -> dict[str, Any]:
    results = [measure(n, n_queries, cache=cache, rebuild=rebuild, profile=profile) for n in sizes]
    ratios = {}
    base = results[0]
    for r in results[1:]:
        ratios[f"hybrid_p50_{r['n']}_vs_{base['n']}"] = round(r["latency"]["hybrid"]["p50_ms"] / base["latency"]["hybrid"]["p50_ms"], 2)
        ratios[f"keyword_p50_{r['n']}_vs_{base['n']}"] = round(r["latency"]["keyword"]["p50_ms"] / base["latency"]["keyword"]["p50_ms"], 2)
    for r in results:
        lat = r["latency"]
        for mode in ("keyword", "hybrid", "hybrid+filter"):
            ratios[f"{mode}_p50_fts5_over_index_{r['n']}"] = round(lat[f"{mode} fts5"]["p50_ms"] / lat[mode]["p50_ms"], 2)
    return {"bench": "recall_latency", "k": K, "queries": n_queries, "filter": "kinds={rule}, tags_all={tag05}",
            "load_average_after": load_average(),
            "agent": "agent-7, groups={g3}", "sizes": results, "ratios": ratios}


def render(r: dict[str, Any]) -> str:
    modes = list(r["sizes"][0]["latency"])
    rows = []
    for m in modes:
        row: list[Any] = [m]
        for s in r["sizes"]:
            row += [s["latency"][m]["p50_ms"], s["latency"][m]["p95_ms"], s["latency"][m].get("cpu_p50_ms")]
        rows.append(row)
    heads = ["mode"] + [f"{s['n'] // 1000}k {p}" for s in r["sizes"] for p in ("p50 ms", "p95 ms", "CPU p50 ms")]
    out = [table(f"recall latency, k={r['k']}, {r['queries']} queries per mode, query embedding excluded "
                 f"(wall time; CPU time of this process beside it; load average after: {r.get('load_average_after')})",
                 heads, rows)]
    facts = []
    for s in r["sizes"]:
        b = s["build"]
        facts.append([f"{s['n']:,}", s["ann_recall@10"], s["keyword_same_top10_as_fts5"], s["filter_selectivity"],
                      "-".join(map(str, s.get("varying_filter_share", []))), s["agent_visible_share"],
                      "cached" if b.get("cached") else b["build_s"], b["units_per_s"], round(b["bytes"] / 2**20),
                      s["open_ms"], s["first_recall_ms"], s["index_open_s"]])
    out.append(table("per size", ["units", "ANN recall@10", "same keyword top 10 as FTS5", "filter share", "varying filters' shares", "agent sees", "build s", "build u/s",
                                  "MiB", "open ms", "first recall ms", "index ready s"], facts))
    t = [f"  {s['n']:,}: " + ", ".join(f"{k} {'ok' if v else 'MISSED'}" for k, v in s["targets"].items() if v is not None)
         for s in r["sizes"]]
    out.append("targets:\n" + "\n".join(t))
    if r["ratios"]:
        out.append("ratios: " + ", ".join(f"{k} {v}" for k, v in r["ratios"].items()))
    for s in r["sizes"]:
        if s["profile"]:
            for mode, prow in s["profile"].items():
                out.append(table(f"profile of {mode} at {s['n']:,} (per query)", ["function", "calls", "cum ms", "own ms"],
                                 [[p["function"], p["calls_per_query"], p["cum_ms_per_query"], p["own_ms_per_query"]]
                                  for p in prow]))
    return "\n\n".join(out)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sizes", default="", help="comma-separated unit counts (default 10k,100k,1M; quick 10k)")
    p.add_argument("--queries", type=int, default=None, help="queries per mode (default 200, quick 100)")
    p.add_argument("--profile", action="store_true", help="cProfile hybrid recall at every size")
    p.add_argument("--rebuild", action="store_true", help="rebuild cached stores")
    p.add_argument("--build-only", action="store_true", help="build (or resume) the cached stores, measure nothing")
    p.add_argument("--cache", type=Path, default=CACHE_DIR, help="where built stores are kept (default .bench/)")
    a = p.parse_args()
    sizes = [int(float(s)) for s in a.sizes.split(",") if s] or ([10_000] if a.quick else [10_000, 100_000, 1_000_000])
    nq = a.queries or (100 if a.quick else 200)
    if a.build_only:
        for n in sizes:
            _, info = build(n, a.cache, rebuild=a.rebuild)
            log(f"{n:,}: {info}")
        return
    emit(run(sizes, nq, cache=a.cache, rebuild=a.rebuild, profile=a.profile), a.json, render)


if __name__ == "__main__":
    main()
