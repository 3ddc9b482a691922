"""Offline embedders side by side: load time, one-query latency by thread count, batch throughput.

Every ``local:*`` model that is installed is measured the same way: a recall embeds one
short question at a time, so single-query latency is what an agent waits for; ingest embeds
batches. Torch's default thread count is measured next to one thread, because on a loaded
2-core machine thread hand-offs dominated (issue 13: 395-904 ms vs ~50 ms per query).
Retrieval quality of each model is bench/locomo.py --embedder local:NAME.

    python bench/embedders.py [--quick] [--json] [--models minilm,minilm-int8] [--queries N]
"""

from __future__ import annotations

import os
import time
from typing import Any

from _common import emit, log, parser, percentiles_ms, table
from forge.engine.embed import DEFAULT_LOCAL, LOCAL_MODELS, open_embedder
from forge.errors import ConfigError

QUESTIONS = [
    "When did Caroline go to the LGBTQ support group?",
    "What did Melanie paint recently?",
    "Where did Jon go on his trip last May?",
    "What instrument does Gina play?",
    "How many children does John have?",
]
TURN = "Caroline: I went to an LGBTQ support group yesterday and it was so powerful, everyone shared their stories."


def _time(embed: Any, texts: list[str], n: int) -> dict[str, float]:
    embed(texts[:1])
    times = []
    for i in range(n):
        t0 = time.perf_counter()
        embed([texts[i % len(texts)]])
        times.append(time.perf_counter() - t0)
    return percentiles_ms(times)


def measure(model: str, n_queries: int, batch: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        emb = open_embedder(f"local:{model}")
    except ConfigError as exc:
        return {"model": model, "error": str(exc)}
    load_s = time.perf_counter() - t0
    row: dict[str, Any] = {"model": model, "name": emb.name, "dim": emb.dim, "load_s": round(load_s, 2)}
    row["query_1thread"] = _time(emb.embed, QUESTIONS, n_queries)
    if hasattr(emb, "query_threads"):  # torch: what a query costs on torch's default threads
        emb.query_threads = 0
        import torch

        row["torch_threads"] = torch.get_num_threads()
        row["query_default_threads"] = _time(emb.embed, QUESTIONS, n_queries)
        emb.query_threads = 1
    texts = [f"{TURN} ({i})" for i in range(batch)]
    t1 = time.perf_counter()
    emb.embed(texts)
    row["batch_texts_per_s"] = round(batch / (time.perf_counter() - t1), 1)
    log(f"  {model}: {row}")
    return row


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(LOCAL_MODELS), help="comma-separated local model names")
    p.add_argument("--queries", type=int, default=None, help="single queries timed per setting (default 100, quick 30)")
    a = p.parse_args()
    n = a.queries or (30 if a.quick else 100)
    rows = [measure(m, n, 64 if a.quick else 256) for m in a.models.split(",") if m]
    res = {"bench": "embedders", "default": DEFAULT_LOCAL, "cpus": os.cpu_count(), "load_avg_1m": round(os.getloadavg()[0], 2),
           "rows": rows}

    def render(r: dict[str, Any]) -> str:
        heads = ["model", "dim", "load s", "1 thread p50 / p95 ms", "default threads p50 / p95 ms", "batch texts/s"]
        out = []
        for x in r["rows"]:
            if "error" in x:
                out.append([x["model"], "-", "-", x["error"], "-", "-"])
                continue
            d = x.get("query_default_threads")
            out.append([x["model"] + (" (default)" if x["model"] == r["default"] else ""), x["dim"], x["load_s"],
                        f"{x['query_1thread']['p50_ms']:.1f} / {x['query_1thread']['p95_ms']:.1f}",
                        f"{d['p50_ms']:.1f} / {d['p95_ms']:.1f} ({x['torch_threads']} threads)" if d else "-",
                        x["batch_texts_per_s"]])
        return table(f"offline embedders, {r['cpus']} CPUs, load average {r['load_avg_1m']}", heads, out)

    emit(res, a.json, render)


if __name__ == "__main__":
    main()
