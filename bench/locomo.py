"""Retrieval quality on conversational memory, in the LoCoMo format.

Input: a JSON list of samples, each ``{"sample_id", "conversation": {"speaker_a",
"speaker_b", "session_N": [{"speaker", "dia_id", "text"}, ...], "session_N_date_time"},
"qa": [{"question", "answer", "evidence": ["D1:3", ...], "category": 1..5}]}`` -- the
layout of the LoCoMo benchmark (Maharana et al., 2024). The default is the hand-written
bench/data/locomo_sample.json (3 conversations, 162 turns, 51 questions); ``--data`` takes
any file of that format, e.g. the real locomo10.json.

Each conversation gets a fresh store. Each session becomes an Episode, and each turn a
unit of kind ``episode`` ("Speaker: text"), with provenance episodes=[session id] and
meta dia_id / session / date. Every question is then recalled three ways -- vector only,
BM25 only, hybrid (the default fusion) and, for comparison, hybrid with the keyword signal
at half weight -- and scored by evidence recall@k: the share of its
evidence turns among the top k units. Questions without usable evidence are skipped.

    python bench/locomo.py [--quick] [--json] [--data PATH] [--embedder local|hash] [--limit N]
                           [--no-speaker-prefix]
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from _common import emit, parser, table
from forge import Memory
from forge.embed import open_embedder
from forge.model import Episode, Provenance, Step, Unit, Viewer
from forge.recall import Weights, recall
from forge.store import SQLiteStore

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "locomo_sample.json"
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
MODES = {
    "vector": Weights(vector=1.0, keyword=0.0, graph=0.0),
    "bm25": Weights(vector=0.0, keyword=1.0, graph=0.0),
    "hybrid": Weights(),  # the shipped default: keyword weight 0.5
    # equal-weight fusion, for comparison: a weak keyword signal pulls it below vector-only
    "hybrid_kw1.0": Weights(keyword=1.0),
}
KS = (5, 10)
_DIA = re.compile(r"D\d+:\d+")
_SESSION = re.compile(r"session_(\d+)$")


def load(path: Path) -> list[dict[str, Any]]:
    data = json.loads(Path(path).read_text())
    if isinstance(data, dict):  # a single sample
        data = [data]
    if not isinstance(data, list) or not all(isinstance(s, dict) and "conversation" in s for s in data):
        raise SystemExit(f"{path}: expected a JSON list of LoCoMo samples with 'conversation' and 'qa'")
    return data


def _parse_date(text: str | None) -> float | None:
    if not text:
        return None
    for fmt in ("%I:%M %p on %d %B, %Y", "%I:%M %p on %d %b, %Y", "%Y-%m-%d %H:%M", "%Y-%m-%d"):
        try:
            return datetime.strptime(text.strip(), fmt).timestamp()
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


def ingest(mem: Memory, sample: dict[str, Any], *, speaker_prefix: bool = True) -> int:
    """Store a sample's sessions as episodes and its turns as units; returns the unit count.

    The speaker goes in front of the text ("Maya: ...") unless ``speaker_prefix`` is off (then
    it is only in meta, so neither the embedding nor the keyword index sees it).
    """
    sid = str(sample.get("sample_id", "sample"))
    units: list[Unit] = []
    seen: set[str] = set()
    for n, date, turns in sessions(sample["conversation"]):
        ts = _parse_date(date) or time.time()
        ep = Episode(id=f"{sid}:session_{n}", task="conversation", env="locomo", created_at=ts,
                     steps=tuple(Step(observation=turn_text(t), role=str(t.get("speaker", ""))) for t in turns),
                     meta={"date_time": date or "", "session": n})
        mem.add_episode(ep)
        for i, t in enumerate(turns):
            text = turn_text(t)
            dia = str(t.get("dia_id") or f"D{n}:{i + 1}")
            if not text or dia in seen:
                continue
            seen.add(dia)
            speaker = str(t.get("speaker", ""))
            units.append(Unit(f"{speaker}: {text}" if speaker_prefix and speaker else text, kind="episode",
                              id=f"{sid}:{dia}", created_at=ts + i,
                              provenance=Provenance(source="locomo", episodes=(ep.id,)),
                              meta={"dia_id": dia, "session": n, "date_time": date or "", "speaker": speaker}))
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


def run(data: Path = DEFAULT_DATA, *, embedder: str = "local", limit: int | None = None,
        ks: Sequence[int] = KS, speaker_prefix: bool = True) -> dict[str, Any]:
    samples = load(data)[:limit] if limit else load(data)
    t0 = time.perf_counter()
    emb = open_embedder(embedder)
    load_s = time.perf_counter() - t0
    kmax = max(ks)
    per_q: list[dict[str, Any]] = []
    n_units = n_skipped = 0
    ingest_s = query_s = 0.0
    admin = Viewer.admin()
    for sample in samples:
        mem = Memory(SQLiteStore(":memory:"), emb)
        t1 = time.perf_counter()
        n_units += ingest(mem, sample, speaker_prefix=speaker_prefix)
        ingest_s += time.perf_counter() - t1
        known = {u_id.split(":", 1)[1] for u_id in _unit_ids(mem)}
        qa = [q for q in sample.get("qa", []) if isinstance(q, dict) and q.get("question")]
        usable = []
        for q in qa:
            ev = [e for e in evidence_ids(q) if e in known]
            if ev:
                usable.append((q, ev))
            else:
                n_skipped += 1
        if not usable:
            mem.close()
            continue
        t2 = time.perf_counter()
        qvecs = mem.embed([q["question"] for q, _ in usable])
        for (q, ev), qv in zip(usable, qvecs, strict=True):
            row: dict[str, Any] = {"sample": sample.get("sample_id"), "question": q["question"],
                                   "category": int(q.get("category") or 0), "evidence": ev}
            for mode, w in MODES.items():
                got = recall(mem.store, query=q["question"], query_vector=qv, viewer=admin, k=kmax, weights=w,
                             hops=1, touch=False)
                ranked = [r.unit.meta.get("dia_id") for r in got]
                row[mode] = {f"r@{k}": len(set(ranked[:k]) & set(ev)) / len(ev) for k in ks}
                row[mode]["rank"] = next((i + 1 for i, d in enumerate(ranked) if d in ev), None)
            per_q.append(row)
        query_s += time.perf_counter() - t2
        mem.close()
    return {"bench": "locomo", "data": str(data), "embedder": emb.name, "speaker_prefix": speaker_prefix,
            "samples": len(samples),
            "units": n_units, "questions": len(per_q), "skipped_no_evidence": n_skipped, "ks": list(ks),
            "model_load_s": round(load_s, 2), "ingest_s": round(ingest_s, 2),
            "ms_per_question_all_modes": round(query_s / max(len(per_q), 1) * 1000, 2),
            "by_category": _aggregate(per_q, ks), "misses_hybrid@10": _misses(per_q, kmax), "per_question": per_q}


def _unit_ids(mem: Memory) -> list[str]:
    return [u.id for u in mem.store.list(viewer=Viewer.admin(), limit=1_000_000)]


def _aggregate(rows: list[dict[str, Any]], ks: Sequence[int]) -> dict[str, Any]:
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
        for mode in MODES:
            for k in ks:
                out[name][f"{mode}@{k}"] = round(sum(r[mode][f"r@{k}"] for r in rs) / len(rs), 3)
    return out


def _misses(rows: list[dict[str, Any]], k: int) -> list[str]:
    return [f"[{CATEGORIES.get(r['category'], r['category'])}] {r['question']}" for r in rows
            if r["hybrid"][f"r@{k}"] == 0]


def render(r: dict[str, Any]) -> str:
    ks = r["ks"]
    heads = ["category", "n"] + [f"{m}@{k}" for m in MODES for k in ks]
    rows = [[name, v["n"], *[v[f"{m}@{k}"] for m in MODES for k in ks]] for name, v in r["by_category"].items()]
    title = (f"LoCoMo evidence recall@k: {r['data']} ({r['samples']} conversations, {r['units']} turns, "
             f"{r['questions']} questions; {r['skipped_no_evidence']} without evidence skipped), embedder {r['embedder']}"
             f"{'' if r.get('speaker_prefix', True) else ', no speaker prefix'}")
    out = [table(title, heads, rows)]
    o = r["by_category"].get("overall")
    if o:
        k = max(ks)
        best_single = max(o[f"vector@{k}"], o[f"bm25@{k}"])
        ratio = o[f"hybrid@{k}"] / best_single if best_single else float("nan")
        out.append(f"hybrid@{k} / best single signal@{k}: {ratio:.2f}; vector@{k} / bm25@{k}: "
                   f"{(o[f'vector@{k}'] / o[f'bm25@{k}']) if o[f'bm25@{k}'] else float('nan'):.2f}")
    out.append(f"timing: model load {r['model_load_s']} s, ingest {r['ingest_s']} s, "
               f"{r['ms_per_question_all_modes']} ms per question (embedding + 3 recalls)")
    if r["misses_hybrid@10"]:
        out.append("hybrid found no evidence in the top 10 for:\n  " + "\n  ".join(r["misses_hybrid@10"]))
    return "\n\n".join(out)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=DEFAULT_DATA, help="a LoCoMo-format JSON file")
    p.add_argument("--embedder", default="local", help="local (all-MiniLM-L6-v2, default) or hash[:DIM]")
    p.add_argument("--limit", type=int, default=None, help="only the first N conversations (quick: 1)")
    p.add_argument("--no-speaker-prefix", action="store_true",
                   help="store turns without 'Speaker: ' in front (the speaker is kept in meta only)")
    a = p.parse_args()
    result = run(a.data, embedder=a.embedder, limit=a.limit or (1 if a.quick else None),
                 speaker_prefix=not a.no_speaker_prefix)
    if a.json:
        result = {k: v for k, v in result.items() if k != "per_question"} | {"per_question": result["per_question"]}
    emit(result, a.json, render)


if __name__ == "__main__":
    main()
