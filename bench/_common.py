"""Shared pieces of the FORGE benchmarks: synthetic data, timing, output.

Benchmarks print figures, never assert. Every script takes ``--quick`` (under a minute on
two cores) and ``--json`` (one JSON object on stdout instead of a table).

Synthetic vectors are a normalised gaussian mixture, not uniform noise: a shared mean
direction (real sentence embeddings are anisotropic), ~1000 cluster centres, a low-rank
within-cluster spread and a little isotropic noise. With the defaults, at 100k points
the mean cosine to the nearest neighbour is ~0.74, to the 10th ~0.68, and between
random pairs ~0.08 -- the same ballpark as all-MiniLM-L6-v2 on short texts.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = ROOT / ".bench"
BLOCK = 10_000  # vectors are generated in fixed blocks so any range is reproducible


# -- output -------------------------------------------------------------------------------


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small sizes; finishes within a minute")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return p


def log(msg: str) -> None:
    """Progress goes to stderr so ``--json`` output stays one clean object."""
    print(msg, file=sys.stderr, flush=True)


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [[_fmt(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, (h, w) in enumerate(zip(headers, widths, strict=True)))
    out = [title, line, "-" * len(line)]
    for r in cells:
        out.append("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    return "\n".join(out)


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1000:
            return f"{v:,.0f}"
        if abs(v) >= 10:
            return f"{v:.1f}"
        return f"{v:.3f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def emit(result: dict[str, Any], as_json: bool, render: Callable[[dict[str, Any]], str]) -> None:
    if as_json:
        print(json.dumps(result, indent=None, sort_keys=False, default=_json_default))
    else:
        print(render(result))


def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


# -- timing -------------------------------------------------------------------------------


def pg_url(base: str, schema: str) -> str:
    """A postgresql:// URL for ``schema`` of the database at ``base`` (the store's ``schema=`` option)."""
    return f"{base}{'&' if '?' in base else '?'}schema={schema}"


def percentiles_ms(samples_s: Sequence[float]) -> dict[str, float]:
    """p50 / p95 / mean in milliseconds of per-call durations in seconds."""
    if not samples_s:
        return {"p50_ms": math.nan, "p95_ms": math.nan, "mean_ms": math.nan}
    xs = sorted(samples_s)
    p95 = xs[min(len(xs) - 1, math.ceil(0.95 * len(xs)) - 1)]
    return {
        "p50_ms": round(statistics.median(xs) * 1000, 3),
        "p95_ms": round(p95 * 1000, 3),
        "mean_ms": round(statistics.fmean(xs) * 1000, 3),
    }


def time_calls(fn: Callable[[Any], Any], inputs: Sequence[Any], *, warmup: int = 3,
               cpu: list[float] | None = None) -> tuple[list[float], list[Any]]:
    """Call ``fn`` once per input, timing each call; a few warm-up calls are not counted.
    ``cpu`` (a list) also gets each call's CPU time (this process, every thread): on shared
    cores wall time includes waiting for them."""
    for x in inputs[:warmup]:
        fn(x)
    times, outs = [], []
    for x in inputs:
        c0 = time.process_time()
        t0 = time.perf_counter()
        out = fn(x)
        times.append(time.perf_counter() - t0)
        if cpu is not None:
            cpu.append(time.process_time() - c0)
        outs.append(out)
    return times, outs


def load_average() -> list[float]:
    """The 1, 5 and 15 minute load averages: how shared the cores were while a bench ran."""
    import os

    return [round(v, 2) for v in os.getloadavg()]


# -- synthetic vectors --------------------------------------------------------------------


@dataclass
class Mixture:
    """A reproducible gaussian mixture on the unit sphere (see the module docstring)."""

    dim: int = 384
    seed: int = 0
    n_clusters: int = 1000
    rank: int = 32
    spread: float = 0.8
    noise: float = 0.4
    mean_weight: float = 0.4

    def __post_init__(self) -> None:
        g = np.random.default_rng([self.seed, 0])
        m = g.standard_normal(self.dim)
        self._mean = m / np.linalg.norm(m)
        c = g.standard_normal((self.n_clusters, self.dim))
        self._centres = c / np.linalg.norm(c, axis=1, keepdims=True)
        self._basis = g.standard_normal((self.dim, self.rank)) / math.sqrt(self.dim * self.rank)

    def _sample(self, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
        cl = rng.integers(0, self.n_clusters, n)
        x = self.mean_weight * self._mean + self._centres[cl]
        x = x + self.spread * (rng.standard_normal((n, self.rank)) @ self._basis.T)
        x = x + self.noise * rng.standard_normal((n, self.dim)) / math.sqrt(self.dim)
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        return x.astype(np.float32), cl

    def block(self, b: int) -> tuple[np.ndarray, np.ndarray]:
        """Block ``b`` of the corpus: BLOCK vectors and their cluster ids."""
        return self._sample(np.random.default_rng([self.seed, 1, b]), BLOCK)

    def corpus(self, start: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Corpus vectors ``start .. start+count`` (the same whatever the chunking)."""
        vs, cs = [], []
        b0, b1 = start // BLOCK, (start + count - 1) // BLOCK
        for b in range(b0, b1 + 1):
            v, c = self.block(b)
            lo = max(start - b * BLOCK, 0)
            hi = min(start + count - b * BLOCK, BLOCK)
            vs.append(v[lo:hi])
            cs.append(c[lo:hi])
        return np.concatenate(vs), np.concatenate(cs)

    def iter_corpus(self, n: int, chunk: int = BLOCK) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
        for start in range(0, n, chunk):
            v, c = self.corpus(start, min(chunk, n - start))
            yield start, v, c

    def queries(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Fresh points from the same mixture (not in the corpus)."""
        return self._sample(np.random.default_rng([self.seed, 2]), n)


def exact_topk(corpus_chunks: Callable[[], Iterator[tuple[int, np.ndarray]]], queries: np.ndarray, k: int) -> np.ndarray:
    """Exact top-k corpus indices by inner product, streaming the corpus in chunks."""
    nq = len(queries)
    best_s = np.full((nq, k), -np.inf, dtype=np.float32)
    best_i = np.zeros((nq, k), dtype=np.int64)
    for start, chunk in corpus_chunks():
        s = queries @ chunk.T
        kk = min(k, s.shape[1])
        part = np.argpartition(-s, kk - 1, axis=1)[:, :kk]
        ps = np.take_along_axis(s, part, axis=1)
        all_s = np.concatenate([best_s, ps], axis=1)
        all_i = np.concatenate([best_i, part + start], axis=1)
        sel = np.argsort(-all_s, axis=1)[:, :k]
        best_s = np.take_along_axis(all_s, sel, axis=1)
        best_i = np.take_along_axis(all_i, sel, axis=1)
    return best_i


def recall_at_k(found: Sequence[Sequence[int]], truth: np.ndarray, k: int) -> float:
    """Mean fraction of the exact top-k that the approximate top-k found."""
    total = 0.0
    for f, t in zip(found, truth, strict=True):
        total += len(set(list(f)[:k]) & set(t[:k].tolist())) / k
    return total / len(truth)


# -- synthetic texts ----------------------------------------------------------------------

_ONSETS = ["b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "br", "cr", "dr", "fr", "gr", "kl", "pl", "pr", "st", "tr", "sk", "sl", "sp"]
_VOWELS = ["a", "e", "i", "o", "u", "ai", "ea", "io", "ou"]
_CODAS = ["", "", "", "n", "r", "s", "l", "m", "k", "t", "nd", "st"]


class Vocabulary:
    """Pseudo-words with a Zipf distribution and per-cluster topic words.

    Texts are ~55% topic words of their vector's cluster and ~45% background words drawn
    by Zipf's law, so FTS5 sees realistic postings: a few words in a large share of the
    rows, a long tail of rare ones, and keyword matches that agree with vector neighbours.
    """

    def __init__(self, size: int = 30_000, *, n_clusters: int = 1000, topic_words: int = 40, seed: int = 0) -> None:
        from forge.store.common import STOPWORDS as _STOPWORDS

        g = np.random.default_rng([seed, 7])
        words: list[str] = []
        seen: set[str] = set()
        integers = g.integers
        while len(words) < size:
            n_syl = int(integers(2, 4))
            w = "".join(
                _ONSETS[integers(len(_ONSETS))] + _VOWELS[integers(len(_VOWELS))] + _CODAS[integers(len(_CODAS))]
                for _ in range(n_syl)
            )
            if w in seen or w in _STOPWORDS:  # keyword queries drop stopwords
                continue
            seen.add(w)
            words.append(w)
        self.words = np.array(words)
        ranks = np.arange(1, size + 1, dtype=np.float64)
        p = 1.0 / (ranks + 2.7) ** 1.07
        self._cdf = np.cumsum(p / p.sum())
        # topic words come from the mid-frequency band, like real content words
        self.topics = g.integers(200, size, (n_clusters, topic_words))

    def _zipf(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.minimum(np.searchsorted(self._cdf, rng.random(n)), len(self.words) - 1)

    def texts(self, clusters: np.ndarray, rng: np.random.Generator, *, lo: int = 8, hi: int = 28) -> list[str]:
        n = len(clusters)
        lengths = rng.integers(lo, hi + 1, n)
        total = int(lengths.sum())
        owner = np.repeat(np.arange(n), lengths)
        topical = rng.random(total) < 0.55
        topic_pick = self.topics[clusters[owner], rng.integers(0, self.topics.shape[1], total)]
        ids = np.where(topical, topic_pick, self._zipf(rng, total))
        words = self.words[ids]
        out, pos = [], 0
        for ln in lengths.tolist():
            out.append(" ".join(words[pos : pos + ln].tolist()))
            pos += ln
        return out

    def queries(self, clusters: np.ndarray, rng: np.random.Generator) -> list[str]:
        """Short keyword queries: 2-4 topic words of the cluster plus one background word."""
        out = []
        for c in clusters.tolist():
            n = int(rng.integers(2, 5))
            ws = list(self.words[self.topics[c, rng.choice(self.topics.shape[1], n, replace=False)]])
            ws.append(str(self.words[self._zipf(rng, 1)[0]]))
            out.append(" ".join(ws))
        return out


# -- intervals ----------------------------------------------------------------------------


def bootstrap_mean(table: Sequence[Sequence[float]], *, resamples: int = 2000, level: float = 0.95,
                   seed: int = 0) -> tuple[float, float, float]:
    """The mean of a runs x items table (run seeds x games) with a percentile bootstrap
    interval that resamples both ways: run seeds with replacement, then items with
    replacement, so the interval holds the spread between runs and between games.
    A single row resamples items only."""
    m = np.asarray(table, dtype=np.float64)
    if m.ndim != 2 or m.size == 0:
        raise ValueError("bootstrap_mean needs a non-empty runs x items table")
    g = np.random.default_rng(seed)
    rows = g.integers(0, m.shape[0], (resamples, m.shape[0]))
    cols = g.integers(0, m.shape[1], (resamples, m.shape[1]))
    means = np.array([m[np.ix_(r, c)].mean() for r, c in zip(rows, cols, strict=True)])
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(m.mean()), float(lo), float(hi)
