"""Which HNSW library backs the vector index: usearch vs hnswlib vs faiss-cpu.

Same clustered 384-d unit vectors (bench/_common.Mixture), the store's graph settings for
all three (src/forge/store/vectors.py: M 16, construction ef 128), then a sweep of the
search-time ef. Per library: build time (all cores), single-query p50 (one thread, one
query at a time, as the store searches), and recall@10 against exact numpy search. The row
at the shipped ef_search is what the store does; ``store-style`` repeats it the way
SQLiteStore.vector_search asks: 40 candidates (max(4k, 40)) of which the best 10 are kept.

    python bench/ann_choice.py [--quick] [--json] [--n N] [--queries Q] [--dataset clustered|diffuse]
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
    a = p.parse_args()
    n = a.n or (20_000 if a.quick else 100_000)
    nq = a.queries or (200 if a.quick else 500)
    libs = tuple(x for x in a.libs.split(",") if x)
    emit(run(n, nq, libs=libs, dataset=a.dataset), a.json, render)


if __name__ == "__main__":
    main()
