"""Ingest throughput into a fresh SQLite file store.

(a) precomputed vectors, ``store.add`` in batches of 1000 -- three ways, on fresh files:
    ``cold``: the ANN index is not loaded yet (a fresh store builds it on the first search),
    so adds only write SQLite + FTS5; the first search then builds the index, timed apart;
    ``live``: the index is open (one search after the first batch), so every add also
    inserts into the HNSW graph, as a running service does;
    both include the close (index saved to disk).
(b) texts through ``Memory.add`` with an embedder (the local all-MiniLM-L6-v2 on CPU by
    default; ``--embedder hash`` for a fast check), next to the embedder alone on the same
    texts, so the share of time spent embedding is visible.

    python bench/ingest.py [--quick] [--json] [--n N] [--n-embed N] [--embedder local|hash]
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from _common import Mixture, Vocabulary, emit, log, parser, table
from forge import Memory, Unit, Viewer
from forge.engine.embed import open_embedder
from forge.model import Context
from forge.store import SQLiteStore

BATCH = 1000
KINDS = ("fact", "rule", "episode", "lesson", "example", "preference", "procedure", "profile")


def synthetic_units(n: int, *, seed: int = 0, start: int = 0) -> tuple[list[Unit], np.ndarray]:
    """``n`` units with vocabulary texts, kinds, tags, and mixture vectors."""
    mix = Mixture(seed=seed)
    vocab = _vocab(seed, min(30_000, max(2_000, n // 3)))
    vecs, clusters = mix.corpus(start, n)
    rng = np.random.default_rng([seed, 3, start])
    texts = vocab.texts(clusters, rng)
    kinds = rng.choice(len(KINDS), n)
    tags = rng.integers(0, 40, (n, 2))
    units = [
        Unit(texts[i], kind=KINDS[kinds[i]], id=f"u{start + i:08d}",
             context=Context(tags=(f"tag{tags[i, 0]:02d}", f"tag{tags[i, 1]:02d}")))
        for i in range(n)
    ]
    return units, vecs


_VOCABS: dict[tuple[int, int], Vocabulary] = {}


def _vocab(seed: int, size: int) -> Vocabulary:
    if (seed, size) not in _VOCABS:
        _VOCABS[seed, size] = Vocabulary(size, seed=seed)
    return _VOCABS[seed, size]


_SUBJ = ["the door", "the server", "a red agent", "the planner", "the build", "the user", "the cache",
         "the login page", "the scanner", "the database", "the firewall", "the report", "a teammate"]
_VERB = ["fails", "times out", "is locked", "returns an error", "is slow", "restarts", "asks for help",
         "looks suspicious", "runs out of memory", "drops connections", "needs approval"]
_ACT = ["check the logs first", "retry with a smaller batch", "look for a key in the hallway",
        "restore the last snapshot", "ask the analyst before acting", "block the host and report it",
        "lower the temperature", "split the task into steps", "prefer the cached answer",
        "write down what happened", "escalate to the operator", "try the backup route"]


def english_texts(n: int, seed: int = 0) -> list[str]:
    """Short rule-like English sentences (realistic token counts for a sentence encoder)."""
    rng = np.random.default_rng([seed, 11])
    out = []
    for i in range(n):
        s, v, a = _SUBJ[rng.integers(len(_SUBJ))], _VERB[rng.integers(len(_VERB))], _ACT[rng.integers(len(_ACT))]
        out.append(f"When {s} {v}, {a} (case {i}).")
    return out


def bench_vectors(n: int, workdir: Path, *, live: bool) -> dict[str, Any]:
    units, vecs = synthetic_units(n)
    path = workdir / f"ingest-{'live' if live else 'cold'}.db"
    t0 = time.perf_counter()
    store = SQLiteStore(path)
    index_s = 0.0
    for i in range(0, n, BATCH):
        store.add(units[i : i + BATCH], vecs[i : i + BATCH])
        if live and i == 0:
            store.vector_search(vecs[0], k=1, viewer=Viewer.admin())  # opens the index
    add_s = time.perf_counter() - t0
    if not live:
        t1 = time.perf_counter()
        store.vector_search(vecs[0], k=1, viewer=Viewer.admin())  # builds the index from the rows
        index_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    store.close()
    close_s = time.perf_counter() - t2
    total = add_s + index_s + close_s
    size = sum(p.stat().st_size for p in workdir.glob(path.name + "*"))
    return {"mode": "live index" if live else "cold (index on first search)", "units": n,
            "add_s": round(add_s, 3), "add_units_per_s": round(n / add_s), "index_build_s": round(index_s, 3),
            "close_s": round(close_s, 3), "total_units_per_s": round(n / total),
            "bytes_per_unit": round(size / n)}


def bench_embedder(n: int, workdir: Path, embedder: str) -> dict[str, Any]:
    texts = english_texts(n)
    t0 = time.perf_counter()
    emb = open_embedder(embedder)
    load_s = time.perf_counter() - t0
    emb.embed(texts[:64])  # warm-up
    t1 = time.perf_counter()
    emb.embed(texts)
    embed_s = time.perf_counter() - t1
    mem = Memory(SQLiteStore(workdir / "ingest-embed.db"), emb)
    units = [Unit(t, kind="rule") for t in texts]
    t2 = time.perf_counter()
    mem.add(units)
    mem.store.vector_search(mem.embed(["probe"])[0], k=1, viewer=Viewer.admin())  # index built
    add_s = time.perf_counter() - t2
    mem.close()
    t3 = time.perf_counter()  # once more, after: the faster of the two is the embedder's speed
    emb.embed(texts)
    embed_s = min(embed_s, time.perf_counter() - t3)
    return {"embedder": emb.name, "units": n, "model_load_s": round(load_s, 2),
            "embed_only_units_per_s": round(n / embed_s), "memory_add_units_per_s": round(n / add_s),
            "embedding_share_of_add": round(embed_s / add_s, 3)}


def run(n_vec: int, n_embed: int, *, embedder: str = "local", workdir: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        d = Path(tmp)
        log(f"(a) {n_vec:,} units with precomputed vectors ...")
        vec_rows = [bench_vectors(n_vec, d, live=False), bench_vectors(n_vec, d, live=True)]
        log(f"(b) {n_embed:,} units through Memory.add with the {embedder} embedder ...")
        emb_row = bench_embedder(n_embed, d, embedder) if n_embed else None
    cold, live = vec_rows
    return {"bench": "ingest", "batch": BATCH, "precomputed": vec_rows, "embedded": emb_row,
            "ratios": {"sqlite_only_vs_live_index": round(cold["add_units_per_s"] / live["add_units_per_s"], 2),
                       "cold_total_vs_live_total": round(cold["total_units_per_s"] / live["total_units_per_s"], 2),
                       "precomputed_live_vs_embedded": round(live["total_units_per_s"] / emb_row["memory_add_units_per_s"], 1)
                       if emb_row else None}}


def render(r: dict[str, Any]) -> str:
    a = table(f"(a) store.add with precomputed 384-d vectors, batches of {r['batch']}",
              ["mode", "units", "add s", "add u/s", "index s", "close s", "total u/s", "B/unit"],
              [[x["mode"], x["units"], x["add_s"], x["add_units_per_s"], x["index_build_s"], x["close_s"],
                x["total_units_per_s"], x["bytes_per_unit"]] for x in r["precomputed"]])
    out = [a]
    e = r["embedded"]
    if e:
        out.append(table("(b) Memory.add (embed + store + index)",
                         ["embedder", "units", "load s", "embed-only u/s", "Memory.add u/s", "embed share"],
                         [[e["embedder"], e["units"], e["model_load_s"], e["embed_only_units_per_s"],
                           e["memory_add_units_per_s"], e["embedding_share_of_add"]]]))
    out.append("ratios: " + ", ".join(f"{k} {v}" for k, v in r["ratios"].items()))
    return "\n\n".join(out)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=None, help="units with precomputed vectors (default 100k, quick 5k)")
    p.add_argument("--n-embed", type=int, default=None, help="units through the embedder (default 2000, quick 128)")
    p.add_argument("--embedder", default="local", help="local (all-MiniLM-L6-v2) or hash[:DIM]")
    a = p.parse_args()
    n = a.n or (5_000 if a.quick else 100_000)
    ne = a.n_embed if a.n_embed is not None else (128 if a.quick else 2000)
    emit(run(n, ne, embedder=a.embedder), a.json, render)


if __name__ == "__main__":
    main()
