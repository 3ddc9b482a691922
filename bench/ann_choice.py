"""Which HNSW library backs the vector index: usearch vs hnswlib vs faiss-cpu.

Same clustered 384-d unit vectors (bench/_common.Mixture), the store's graph settings for
all three (src/forge/store/vectors.py: M 16, construction ef 128), then a sweep of the
search-time ef. Per library: build time (all cores), single-query p50 (one thread, one
query at a time, as the store searches), and recall@10 against exact numpy search. The row
at the shipped ef_search is what the store does; ``store-style`` repeats it the way
SQLiteStore.vector_search asks: 40 candidates (max(4k, 40)) of which the best 10 are kept.

    python bench/ann_choice.py [--quick] [--json] [--n N] [--queries Q] [--dataset clustered|diffuse]

``--filtered`` compares ways to search exactly among the units a selective filter admits
(0.5-3.3% of N, a new set each query, as bench/recall_latency.py's varying filter): usearch's
per-key gather (what the store did), a contiguous f32 / f16 / int8 copy of every vector gathered
by row (the reduced copies searched with usearch's SIMD kernel, their best candidates
re-scored from the f32 index), and faiss HNSW filtering while it searches (IDSelectorBitmap).
Per method: p50 wall and CPU time, recall@10 against exact search among the admitted, and the
copy's bytes per vector. The usearch index is the one bench/recall_latency.py built for N when
it is in .bench/ (built here otherwise), so the 1M fixture is built once.

    python bench/ann_choice.py --filtered [--n 1000000] [--queries Q] [--libs ...]
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from _common import Mixture, emit, exact_topk, log, parser, percentiles_ms, recall_at_k, table
from forge.store.vectors import CONNECTIVITY, EXPANSION_ADD, EXPANSION_SEARCH

M = CONNECTIVITY  # the shipped settings, so this bench always measures what the store uses
EF_CONSTRUCTION = EXPANSION_ADD
SHIPPED_EF = EXPANSION_SEARCH
EF_SWEEP = tuple(sorted({32, 64, 96, 128, 256, SHIPPED_EF}))
K = 10


class _Lib:
    name = ""

    def build(self, x: np.ndarray) -> None: ...

    def set_ef(self, ef: int) -> None: ...

    def query(self, q: np.ndarray, k: int) -> list[int]: ...


class _USearch(_Lib):
    name = "usearch"

    def build(self, x: np.ndarray) -> None:
        from usearch.index import Index

        self.index = Index(ndim=x.shape[1], metric="cos", dtype="f32", connectivity=M,
                           expansion_add=EF_CONSTRUCTION, expansion_search=SHIPPED_EF)
        self.index.add(np.arange(len(x), dtype=np.uint64), x, threads=0)

    def set_ef(self, ef: int) -> None:
        self.index.expansion_search = ef

    def query(self, q: np.ndarray, k: int) -> list[int]:
        return self.index.search(q, k, threads=1).keys.tolist()


class _Hnswlib(_Lib):
    name = "hnswlib"

    def build(self, x: np.ndarray) -> None:
        import hnswlib

        self.index = hnswlib.Index(space="ip", dim=x.shape[1])  # vectors are unit-norm: ip == cosine
        self.index.init_index(max_elements=len(x), ef_construction=EF_CONSTRUCTION, M=M, random_seed=1)
        self.index.add_items(x, np.arange(len(x)), num_threads=os.cpu_count() or 1)

    def set_ef(self, ef: int) -> None:
        self.index.set_ef(ef)

    def query(self, q: np.ndarray, k: int) -> list[int]:
        labels, _ = self.index.knn_query(q, k=k, num_threads=1)
        return labels[0].tolist()


class _Faiss(_Lib):
    name = "faiss-hnsw"

    def build(self, x: np.ndarray) -> None:
        import faiss

        faiss.omp_set_num_threads(os.cpu_count() or 1)
        self.index = faiss.IndexHNSWFlat(x.shape[1], M, faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efConstruction = EF_CONSTRUCTION
        self.index.add(x)

    def set_ef(self, ef: int) -> None:
        import faiss

        faiss.omp_set_num_threads(1)
        self.index.hnsw.efSearch = ef

    def query(self, q: np.ndarray, k: int) -> list[int]:
        _, labels = self.index.search(q.reshape(1, -1), k)
        return labels[0].tolist()


DATASETS = {
    # the default mixture: nearest-neighbour cosine ~0.74, like MiniLM on short texts
    "clustered": {},
    # isotropic noise dominates the low-rank spread: high intrinsic dimension, a stress case
    "diffuse": {"noise": 1.2, "spread": 0.6},
}


def run(n: int, n_queries: int, *, efs: tuple[int, ...] = EF_SWEEP, libs: tuple[str, ...] = (),
        dataset: str = "clustered") -> dict[str, Any]:
    mix = Mixture(**DATASETS[dataset])
    log(f"generating {n:,} {dataset} 384-d vectors ...")
    x, _ = mix.corpus(0, n)
    q, _ = mix.queries(n_queries)
    t0 = time.perf_counter()
    truth = exact_topk(lambda: iter([(0, x)]), q, K)
    exact_s = time.perf_counter() - t0
    rows: list[dict[str, Any]] = []
    chosen = [c for c in (_USearch, _Hnswlib, _Faiss) if not libs or c.name in libs]
    for cls in chosen:
        lib = cls()
        log(f"{lib.name}: building ...")
        t0 = time.perf_counter()
        lib.build(x)
        build_s = time.perf_counter() - t0
        for ef in efs:
            lib.set_ef(ef)
            for qq in q[:5]:
                lib.query(qq, K)
            times, found = [], []
            for qq in q:
                t1 = time.perf_counter()
                found.append(lib.query(qq, K))
                times.append(time.perf_counter() - t1)
            rows.append({"lib": lib.name, "ef_search": ef, "build_s": round(build_s, 2),
                         "build_per_s": round(n / build_s), **percentiles_ms(times),
                         "recall@10": round(recall_at_k(found, truth, K), 4)})
            log(f"  ef={ef}: recall@10 {rows[-1]['recall@10']:.3f}  p50 {rows[-1]['p50_ms']:.3f} ms")
        if lib.name == "usearch":  # the way SQLiteStore.vector_search asks (k=10 -> 40 candidates)
            lib.set_ef(SHIPPED_EF)
            times, found = [], []
            for qq in q:
                t1 = time.perf_counter()
                found.append(lib.query(qq, max(4 * K, 40))[:K])
                times.append(time.perf_counter() - t1)
            rows.append({"lib": "usearch store-style", "ef_search": SHIPPED_EF, "build_s": round(build_s, 2),
                         "build_per_s": round(n / build_s), **percentiles_ms(times),
                         "recall@10": round(recall_at_k(found, truth, K), 4)})
        del lib
    shipped = next((r for r in rows if r["lib"] == "usearch" and r["ef_search"] == SHIPPED_EF), None)
    summary: dict[str, Any] = {"shipped_ef_search": SHIPPED_EF}
    if shipped:
        summary["shipped_usearch_recall@10"] = shipped["recall@10"]
        summary["shipped_meets_0.95"] = shipped["recall@10"] >= 0.95
        store_style = next(r for r in rows if r["lib"] == "usearch store-style")
        summary["store_style_recall@10"] = store_style["recall@10"]
        for name in ("hnswlib", "faiss-hnsw"):
            other = next((r for r in rows if r["lib"] == name and r["ef_search"] == SHIPPED_EF), None)
            if other:
                summary[f"{name}_recall@10_at_shipped_ef"] = other["recall@10"]
                summary[f"{name}_build_vs_usearch"] = round(other["build_s"] / shipped["build_s"], 2)
                summary[f"{name}_p50_vs_usearch"] = round(other["p50_ms"] / shipped["p50_ms"], 2)
        for r in rows:
            if r["recall@10"] >= 0.95 and "store-style" not in r["lib"]:
                summary.setdefault(f"min_ef_for_0.95_{r['lib']}", r["ef_search"])
    return {"bench": "ann_choice", "dataset": dataset, "n": n, "dim": int(x.shape[1]), "queries": n_queries, "k": K,
            "M": M, "ef_construction": EF_CONSTRUCTION, "cpus": os.cpu_count(),
            "exact_numpy_s_per_query": round(exact_s / n_queries * 1000, 3), "rows": rows, "summary": summary}


# -- filtered exact search: which copy of the vectors to search a filter's units in --------

FILTER_SHARES = (0.005, 0.01, 0.02, 0.033)  # of N admitted: bench/recall_latency.py's varying filters span 0.5-3.3%
RESCORE = (40, 100)  # candidates of a reduced copy re-scored from the f32 index
FAISS_EFS = (64, 256, 1024)


def _store_index(n: int, x: np.ndarray) -> tuple[Any, str]:
    """A usearch index of ``x`` under keys 1..n (the store's row ids): bench/recall_latency.py's
    1M fixture's own index when it is there (its vectors are this corpus), else built here."""
    from usearch.index import Index

    from _common import CACHE_DIR

    path = CACHE_DIR / f"latency-{n}.db.usearch"
    index = Index(ndim=x.shape[1], metric="cos", dtype="f32", connectivity=M,
                  expansion_add=EF_CONSTRUCTION, expansion_search=SHIPPED_EF)
    if path.exists():
        index.load(str(path))
        if len(index) == n:
            return index, f"loaded {path.name}"
        index.reset()
    log(f"usearch: building {n:,} (no fixture index at {path}) ...")
    index.add(np.arange(1, n + 1, dtype=np.uint64), x, threads=0)
    return index, "built here"


def _top(keys: np.ndarray, sims: np.ndarray, k: int) -> list[int]:
    k = min(k, len(sims))
    part = np.argpartition(-sims, k - 1)[:k] if k < len(sims) else np.arange(len(sims))
    return keys[part[np.argsort(-sims[part], kind="stable")]].tolist()


def filtered(n: int, n_queries: int, *, libs: tuple[str, ...] = (), dataset: str = "clustered") -> dict[str, Any]:
    from usearch.index import MetricKind, ScalarKind
    from usearch.index import search as brute

    from forge.store.vectors import VectorIndex

    mix = Mixture(**DATASETS[dataset])
    log(f"generating {n:,} {dataset} 384-d vectors ...")
    x, _ = mix.corpus(0, n)
    q, _ = mix.queries(n_queries)
    d = x.shape[1]
    index, source = _store_index(n, x)
    compiled = index._compiled  # noqa: SLF001 - the store calls get_many the same way

    def f32_of(keys: np.ndarray) -> np.ndarray:
        return np.concatenate(compiled.get_many(keys, ScalarKind.F32)).reshape(len(keys), d)

    # the copies, by row id (row 0 unused, as the store's row ids start at 1)
    x32 = np.zeros((n + 1, d), dtype=np.float32)
    x32[1:] = x
    x16 = x32.astype(np.float16)
    amax = np.abs(x32).max(axis=1)
    x8 = np.round(x32 / np.where(amax > 0, amax, 1.0)[:, None] * 127).astype(np.int8)
    rng = np.random.default_rng([0, 11])
    sets = []
    for i in range(n_queries):
        m = max(10, int(FILTER_SHARES[i % len(FILTER_SHARES)] * n))
        sets.append(np.sort(rng.choice(n, m, replace=False)).astype(np.uint64) + 1)
    truth = []
    for qq, keys in zip(q, sets, strict=True):
        truth.append(set(_top(keys, x32[keys.astype(np.intp)] @ qq, K)))

    def reduced(copy: np.ndarray, scale: float, depth: int) -> Any:
        def search(qq: np.ndarray, keys: np.ndarray) -> list[int]:
            rows = np.take(copy, keys.astype(np.intp), axis=0)
            qc = (qq / np.abs(qq).max() * scale).astype(copy.dtype) if scale else qq.astype(copy.dtype)
            cand = brute(rows, qc, min(depth, len(keys)), MetricKind.Cos, exact=True, threads=1).keys.astype(np.intp)
            ck = keys[cand]
            return _top(ck, f32_of(ck) @ qq, K)  # re-scored from the f32 index
        return search

    store = VectorIndex(dim=d, path=None)
    store._index, store._complete = index, False  # noqa: SLF001 - the store's own search, on this index, as after a load
    t0 = time.process_time()
    store.fill_copy()  # what the store's warm-up thread does after loading an index
    fill_s = time.process_time() - t0

    methods: dict[str, Any] = {
        "usearch get_many": lambda qq, keys: _top(keys, (lambda v: v @ qq / np.linalg.norm(v, axis=1))(f32_of(keys)), K),
        "f32 copy": lambda qq, keys: _top(keys, np.take(x32, keys.astype(np.intp), axis=0) @ qq, K),
        **{f"f16 copy, re-score {r}": reduced(x16, 0.0, r) for r in RESCORE},
        **{f"i8 copy, re-score {r}": reduced(x8, 127.0, r) for r in RESCORE},
        "store (shipped)": lambda qq, keys: [k for k, _ in store.search_exact_among(qq, keys, K)],
    }
    bytes_per = {"usearch get_many": 0, "f32 copy": 4 * d, "store (shipped)": None}
    bytes_per.update({m: (2 if "f16" in m else 1) * d for m in methods if "copy," in m})  # cosine: no scale kept
    if not libs or "faiss-hnsw" in libs:
        import faiss

        log(f"faiss-hnsw: building {n:,} ...")
        faiss.omp_set_num_threads(os.cpu_count() or 1)
        t0 = time.perf_counter()
        fi = faiss.IndexHNSWFlat(d, M, faiss.METRIC_INNER_PRODUCT)
        fi.hnsw.efConstruction = EF_CONSTRUCTION
        fi.add(x32)  # ids = row ids, row 0 a zero vector nothing admits
        log(f"  built in {time.perf_counter() - t0:.0f}s")
        faiss.omp_set_num_threads(1)

        def faiss_search(ef: int) -> Any:
            def search(qq: np.ndarray, keys: np.ndarray) -> list[int]:
                mask = np.zeros(n + 1, dtype=bool)
                mask[keys.astype(np.intp)] = True
                bits = np.packbits(mask, bitorder="little")
                params = faiss.SearchParametersHNSW(sel=faiss.IDSelectorBitmap(n + 1, faiss.swig_ptr(bits)), efSearch=ef)
                _, labels = fi.search(qq.reshape(1, -1), K, params=params)
                return [int(v) for v in labels[0] if v >= 0]
            return search

        for ef in FAISS_EFS:
            methods[f"faiss HNSW + bitmap, ef {ef}"] = faiss_search(ef)
            bytes_per[f"faiss HNSW + bitmap, ef {ef}"] = None
    rows: list[dict[str, Any]] = []
    for name, fn in methods.items():
        for qq, keys in list(zip(q, sets, strict=True))[:3]:
            fn(qq, keys)
        walls, cpus, hit = [], [], 0.0
        for qq, keys, t in zip(q, sets, truth, strict=True):
            w, c = time.perf_counter(), time.process_time()
            found = fn(qq, keys)
            walls.append(time.perf_counter() - w)
            cpus.append(time.process_time() - c)
            hit += len(set(found[:K]) & t) / K
        cpu = percentiles_ms(cpus)
        rows.append({"method": name, **percentiles_ms(walls), "cpu_p50_ms": cpu["p50_ms"], "cpu_mean_ms": cpu["mean_ms"],
                     "recall@10": round(hit / len(truth), 4), "copy_bytes_per_vector": bytes_per.get(name)})
        log(f"  {name}: p50 {rows[-1]['p50_ms']:.2f} ms (cpu {cpu['p50_ms']:.2f})  recall@10 {rows[-1]['recall@10']:.4f}")
    return {"bench": "ann_choice", "mode": "filtered", "dataset": dataset, "n": n, "dim": d, "queries": n_queries,
            "k": K, "shares": FILTER_SHARES, "index": source, "store_fill_cpu_s": round(fill_s, 2), "cpus": os.cpu_count(),
            "load_average": [round(v, 2) for v in os.getloadavg()], "rows": rows}


def render_filtered(r: dict[str, Any]) -> str:
    head = (f"filtered exact search: {r['n']:,} x {r['dim']} {r['dataset']} vectors, a new admitted set per query "
            f"({', '.join(f'{s:.1%}' for s in r['shares'])} of N), {r['queries']} queries, k={r['k']}, "
            f"usearch index {r['index']}, the store's int8 copy filled from it in {r['store_fill_cpu_s']} s of CPU, "
            f"load average {r['load_average']}")
    rows = [[x["method"], x["p50_ms"], x["p95_ms"], x["cpu_p50_ms"], x["recall@10"], x["copy_bytes_per_vector"]]
            for x in r["rows"]]
    return table(head, ["method", "p50 ms", "p95 ms", "CPU p50 ms", "recall@10", "copy B/vector"], rows)


def render(r: dict[str, Any]) -> str:
    head = (f"ANN choice: {r['n']:,} x {r['dim']} {r.get('dataset', 'clustered')} unit vectors, {r['queries']} queries, "
            f"M={r['M']}, ef_construction={r['ef_construction']}, {r['cpus']} cpus "
            f"(exact numpy: {r['exact_numpy_s_per_query']} ms/query batched)")
    rows = [[x["lib"], x["ef_search"], x["build_s"], x["build_per_s"], x["p50_ms"], x["p95_ms"], x["recall@10"]]
            for x in r["rows"]]
    out = table(head, ["library", "ef_search", "build s", "vec/s", "p50 ms", "p95 ms", "recall@10"], rows)
    s = r["summary"]
    lines = [f"  {k}: {v}" for k, v in s.items()]
    return out + "\nsummary (ratios are other / usearch at the shipped ef_search):\n" + "\n".join(lines)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=None, help="corpus size (default 100k, quick 20k)")
    p.add_argument("--queries", type=int, default=None, help="number of queries (default 500, quick 200)")
    p.add_argument("--libs", default="", help="comma-separated subset: usearch,hnswlib,faiss-hnsw")
    p.add_argument("--dataset", choices=sorted(DATASETS), default="clustered",
                   help="clustered (default, MiniLM-like) or diffuse (harder: high intrinsic dimension)")
    p.add_argument("--filtered", action="store_true",
                   help="exact search among a filter's units: gather, f32/f16/int8 copies, faiss with an ID selector")
    a = p.parse_args()
    if a.filtered:
        n = a.n or (50_000 if a.quick else 1_000_000)
        nq = a.queries or (40 if a.quick else 200)
        emit(filtered(n, nq, libs=tuple(x for x in a.libs.split(",") if x), dataset=a.dataset), a.json, render_filtered)
        return
    n = a.n or (20_000 if a.quick else 100_000)
    nq = a.queries or (200 if a.quick else 500)
    libs = tuple(x for x in a.libs.split(",") if x)
    emit(run(n, nq, libs=libs, dataset=a.dataset), a.json, render)


if __name__ == "__main__":
    main()
