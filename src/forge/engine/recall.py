"""Hybrid recall: vector + BM25 + graph expansion, fused, weighted, explained, packed.

Each signal ranks candidates independently inside the store (so scope and filters are
enforced there). Fusion is score-aware by default: each signal's raw scores are normalised
over its own candidate list (min-max), then combined convexly, so a strong BM25 match is not
flattened to the same credit as a weak cosine neighbour the way reciprocal rank fusion does
(RRF stays available as ``Weights(fusion="rrf")``; bench/locomo.py measures both on the
public LoCoMo benchmark). Graph expansion pulls in units linked to the best seeds; optional
boosts favour recent, validated and important units, and units whose event time falls in
a time window the query names. Every result says which signals returned it and why, and
:func:`pack` fits the best of them into a token budget.
"""

from __future__ import annotations

import dataclasses
import math
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from forge.errors import ValidationError
from forge.model import Kind, RelationType, Rule, Unit, Viewer
from forge.store.base import SPEAKER, Filter, Store

__all__ = [
    "DEFAULT_SECTIONS",
    "Packed",
    "Recalled",
    "Recalls",
    "Reranker",
    "Weights",
    "approx_tokens",
    "event_time",
    "pack",
    "recall",
    "time_window",
]


@dataclass(frozen=True, slots=True)
class Weights:
    """How much each signal and boost counts. Zero switches a signal off.

    ``fusion`` is how the signals' ranked lists are combined:

    - ``"score"`` (default): each signal's raw scores (cosine, BM25) are min-max normalised
      over that signal's candidate list and added with these weights; a unit one signal did
      not return gets nothing from it. The keyword weight was tuned on the public LoCoMo
      benchmark's tuning half (bench/locomo.py --tune, five conversations, 997 questions):
      3.0 gave the best recall@10 (0.761) and the smallest loss to the best single signal in
      any category (-0.003; 2.0: -0.019, RRF: -0.053). On the held-out half (984 questions)
      it gives 0.709 against BM25's 0.695, above both single signals in every category.
    - ``"rrf"``: reciprocal rank fusion, ``weight / (rrf_k + rank)``; ``rrf_k`` is its
      constant (60 in the original paper): larger values flatten the difference between ranks.

    ``temporal`` boosts units whose event time (``meta["event_at"]`` or ``created_at``) falls
    in a time window the query names ("in May 2023", "last week"); see :func:`time_window`.

    ``attribution`` boosts, by ``1 + attribution``, units said by someone the query names
    (``meta[forge.store.SPEAKER]``, i.e. ``"speaker"``) or owned by them (``owner``), matched
    as whole words, any case:
    "what does Nate feed his turtles" prefers Nate's own turns to Joanna's "how are Nate's
    turtles?". Chosen on LoCoMo's tuning half (bench/locomo.py --tune) by the rule that set
    the keyword weight: the best recall@10 (0.765, against 0.755 without the boost) with the
    smallest loss to the best single signal in any category (-0.006, temporal vs BM25; 0.2:
    0.764 / -0.016; 0.5: 0.765 / -0.017). On the held-out half it gives recall@5 / @10
    0.647 / 0.732 against 0.630 / 0.721 without it. Larger values gain more on questions
    about one person but sink the benchmark's adversarial questions (which ask about one
    speaker what the other said) to BM25 alone.
    """

    vector: float = 1.0
    keyword: float = 3.0  # BM25 over chat turns with their context beat cosine on LoCoMo
    graph: float = 0.5
    rrf_k: float = 60.0
    recency: float = 0.0
    validation: float = 1.0  # credit ranks: a unit that keeps failing drops below one that helps
    importance: float = 0.0
    half_life_s: float = 7 * 24 * 3600.0
    fusion: str = "score"
    temporal: float = 0.0
    attribution: float = 0.3

    def __post_init__(self) -> None:
        if self.fusion not in ("score", "rrf"):
            raise ValidationError(f"unknown fusion {self.fusion!r}; expected 'score' or 'rrf'")


@dataclass(frozen=True, slots=True)
class Recalled:
    """A recalled unit with its fused score and the evidence for it."""

    unit: Unit
    score: float
    why: dict[str, Any] = field(default_factory=dict)

    @property
    def reasons(self) -> list[str]:
        """Human-readable reasons, e.g. ``["vector #1 (cos 0.82)", "keyword #3 (bm25 4.1)"]``."""
        out = []
        if "vector" in self.why:
            v = self.why["vector"]
            out.append(f"vector #{v['rank']} (cos {v['similarity']:.2f})")
        if "keyword" in self.why:
            v = self.why["keyword"]
            out.append(f"keyword #{v['rank']} (bm25 {v['bm25']:.2f})")
        for g in self.why.get("graph", []):
            out.append(f"graph: {g['relation']} of {g['from']} ({g['hops']} hop{'s' if g['hops'] > 1 else ''})")
        if "named" in self.why:
            out.append(f"by {self.why['named']}, whom the query names")
        if "boost" in self.why:
            out.append("boost x{:.2f}".format(self.why["boost"]))
        if "rerank" in self.why:
            out.append(f"rerank {self.why['rerank']:.2f}")
        return out


class Reranker(Protocol):
    """Reorders (and may rescore) the fused candidates, e.g. a cross-encoder or an LLM judge."""

    def __call__(self, query: str, results: Sequence[Recalled]) -> list[Recalled]: ...


_EXPAND_DEFAULT = tuple(t for t in RelationType if t is not RelationType.CONTRADICTS)


def recall(
    store: Store,
    *,
    query: str,
    query_vector: np.ndarray | None,
    viewer: Viewer,
    k: int = 10,
    filter: Filter = Filter(),
    weights: Weights = Weights(),
    hops: int = 1,
    expand: Iterable[RelationType] = _EXPAND_DEFAULT,
    rerank: Reranker | None = None,
    touch: bool = True,
    now: float | None = None,
    min_score: float = 0.0,
) -> list[Recalled]:
    """The ``k`` best units for ``query`` that ``viewer`` may see, best first.

    Scores are on 0-1: the fused score over the most a unit could earn (full credit from
    every signal searched, times the largest boost among the top k), so 1.0 means best by every
    signal. Units below ``min_score`` are left out. A reranker's scores are its own.
    """
    if k <= 0:
        raise ValidationError("k must be positive")
    if isinstance(min_score, bool) or not isinstance(min_score, int | float) or not 0.0 <= min_score <= 1.0:
        raise ValidationError(f"min_score must be a number from 0 to 1, got {min_score!r}")
    if hops < 0:
        raise ValidationError("hops must be zero or more")
    n = max(3 * k, VECTOR_CANDIDATES)
    scores: dict[str, float] = {}
    why: dict[str, dict[str, Any]] = {}
    # (signal, raw score name, {id: (rank, raw score)}): explanations are written out only
    # for the units returned, not for every candidate
    lists: list[tuple[str, str, dict[str, tuple[int, float]]]] = []

    def fuse(hits: list[Any], signal: str, weight: float, raw_name: str) -> None:
        if weights.fusion == "rrf":
            credit = [weight / (weights.rrf_k + rank) for rank in range(1, len(hits) + 1)]
        else:
            credit = [weight * x for x in _minmax([h.score for h in hits])]
        seen: dict[str, tuple[int, float]] = {}
        for rank, (hit, c) in enumerate(zip(hits, credit, strict=True), 1):
            scores[hit.id] = scores.get(hit.id, 0.0) + c
            seen[hit.id] = (rank, hit.score)
        lists.append((signal, raw_name, seen))

    if weights.vector > 0 and query_vector is not None:
        fuse(store.vector_search(query_vector, k=n, viewer=viewer, filter=filter), "vector", weights.vector, "similarity")
    if weights.keyword > 0 and query.strip():
        # the longer list calibrates score fusion; RRF would only spread its credit thinner
        kn = max(3 * k, KEYWORD_CANDIDATES) if weights.fusion == "score" else n
        fuse(store.keyword_search(query, k=kn, viewer=viewer, filter=filter), "keyword", weights.keyword, "bm25")

    if weights.graph > 0 and hops > 0 and scores:
        # Graph expansion is a third ranked list: units linked to the best seeds, ranked by
        # seed strength x link weight (halved per hop). Units a direct signal already found
        # keep their score and only gain the explanation, so a well-linked hub cannot jump
        # over the units that actually match the query.
        direct = set(scores)
        strength: dict[str, float] = {}
        frontier = sorted(scores, key=scores.get, reverse=True)[:k]  # type: ignore[arg-type]
        seen = set(scores)
        expand = tuple(expand)
        for hop in range(1, hops + 1):
            nxt: list[str] = []
            for neighbor, rel in store.neighbors(frontier, viewer=viewer, types=expand, filter=filter):
                source = rel.src if rel.dst == neighbor else rel.dst
                base = scores.get(source, 0.0) or strength.get(source, 0.0)
                s = base * max(rel.weight, 0.0) * (0.5 ** (hop - 1))
                strength[neighbor] = max(strength.get(neighbor, 0.0), s)
                why.setdefault(neighbor, {}).setdefault("graph", []).append(
                    {"from": source, "relation": rel.type.value, "hops": hop}
                )
                if neighbor not in seen:
                    seen.add(neighbor)
                    nxt.append(neighbor)
            frontier = nxt
            if not frontier:
                break
        found = sorted((u for u in strength if u not in direct), key=strength.get, reverse=True)  # type: ignore[arg-type]
        top = max(scores.values())
        for rank, uid in enumerate(found, 1):
            if weights.fusion == "rrf":
                scores[uid] = weights.graph / (weights.rrf_k + rank)
            else:  # in score units: a linked unit ranks below its seed, scaled by the graph weight
                scores[uid] = weights.graph * min(strength[uid], top) / (weights.vector + weights.keyword or 1.0)

    if not scores:
        return []
    now = time.time() if now is None else now
    window = time_window(query, now=now) if weights.temporal else None
    named = _mentions(query) if weights.attribution and query.strip() else None
    order = sorted(scores, key=scores.get, reverse=True)  # type: ignore[arg-type]
    # Boosts and rerankers can reorder beyond the top k, so they may see up to `wide`
    # candidates (not all n: each one they see is a unit read from the store).
    wide = max(3 * k, REORDER_DEPTH)
    lift = _max_boost(weights, window is not None, named is not None)
    searched = [w for w, on in ((weights.vector, any(s == "vector" for s, _, _ in lists)), (weights.keyword, any(s == "keyword" for s, _, _ in lists))) if on]
    most = sum(searched) if weights.fusion == "score" else sum(w / (weights.rrf_k + 1) for w in searched)
    results: list[Recalled] = []
    boosts: dict[str, float] = {}

    def read(ids: Sequence[str]) -> None:
        units = {u.id: u for u in store.get_many(ids, viewer=viewer)}
        for uid in ids:
            unit = units.get(uid)
            if unit is None:
                continue
            by = next((who for who in _attributed(unit) if named(who)), None) if named is not None else None
            boost = _boost(unit, weights, now, window, attributed=by is not None)
            entry = dict(why.get(uid, {}))
            for signal, raw_name, seen in lists:
                if uid in seen:
                    entry[signal] = {"rank": seen[uid][0], raw_name: round(seen[uid][1], 4)}
            if by is not None:
                entry["named"] = by
            if boost != 1.0:
                entry["boost"] = round(boost, 4)
            boosts[uid] = boost
            results.append(Recalled(unit, scores[uid] * boost, entry))

    if rerank is not None:
        read(order[:wide])  # a reranker may reorder anything it is shown
    else:
        # Read the top k, then only the candidates the largest possible boost could lift
        # above the k-th boosted score so far: the same answer as reading all `wide`.
        read(order[:k])
        at = k
        while at < min(wide, len(order)):
            if len(results) >= k:
                if lift <= 1.0:  # no boost: nothing below can overtake the top k
                    break
                kth = sorted((r.score for r in results), reverse=True)[k - 1]
            else:  # units the viewer may not read were skipped: fill up
                kth = -math.inf
            more = []  # a prefix of what is left: the order is by score
            for uid in order[at:min(wide, at + k)]:
                if scores[uid] * lift < kth:
                    break
                more.append(uid)
            if not more:
                break
            read(more)
            at += len(more)
    results.sort(key=lambda r: r.score, reverse=True)
    # On 0-1, order kept: over full credit from every signal searched and the largest boost in
    # the top k (a boost none could get, like naming a speaker nobody is, would only shrink all).
    ceiling = max(most or max(scores.values()), 1e-12) * max([1.0, *(boosts[r.unit.id] for r in results[:k])])
    results = [dataclasses.replace(r, score=min(1.0, r.score / ceiling)) for r in results]
    if rerank is not None:
        results = list(rerank(query, results))
    results = [r for r in results[:k] if r.score >= min_score] if min_score else results[:k]
    if touch and results:
        store.touch([r.unit.id for r in results], at=now)
    return results


#: How many candidates each signal returns, at least (``3k`` if more). Min-max fusion is
#: calibrated over each list, and a longer keyword list lets more units earn credit from
#: both signals: on LoCoMo's tuning half, keyword 100 / vector 30 gave recall@5 / @10
#: 0.680 / 0.764 against 0.669 / 0.761 for 30 / 30 (attribution 0.2), and 100 / 100 no more
#: (0.680 / 0.766). A longer BM25 list is cheap (numpy top-k); a longer HNSW one is not
#: (k=100 took 2x the ANN time of k=30 at 100k units, bench/recall_latency.py). RRF keeps
#: 30 / 30: its credit does not depend on the list, and deeper lists cost it 0.09 @10.
VECTOR_CANDIDATES = 30
KEYWORD_CANDIDATES = 100
#: Boosts and rerankers see the top ``max(3k, REORDER_DEPTH)`` of the fused list.
REORDER_DEPTH = 30

#: A signal's scores are stretched over at least this share of its best score, so a list of
#: near-equal candidates stays near-equal (two rules at cosine 0.52 and 0.51 must not become
#: 1 and 0, or no boost could ever reorder them).
MIN_RANGE_SHARE = 0.5

#: The credit each candidate gets when a signal cannot tell them apart (every score equal):
#: "widget 0" ranked 3rd for "widget 5" when a tied BM25 list gave every hit full credit.
TIED_CREDIT = 0.5


def _minmax(xs: Sequence[float]) -> list[float]:
    """Scores mapped onto [0, 1] over one candidate list: the best gets 1.

    Min-max (not divide-by-max) because cosine similarities of a sentence model crowd into a
    narrow band (0.3-0.6): divided by the max they would all sit near 1 and drown BM25. The
    range is at least MIN_RANGE_SHARE of the best score, so near-ties stay near-ties.
    """
    if not xs:
        return []
    lo, hi = min(xs), max(xs)
    if len(xs) > 1 and hi - lo <= 1e-12 * max(1.0, abs(hi)):
        return [TIED_CREDIT] * len(xs)  # all tied (BM25 of a word every unit has): equal, not full, credit
    span = max(hi - lo, MIN_RANGE_SHARE * abs(hi))
    if span <= 1e-12:
        return [1.0] * len(xs)
    return [max(0.0, 1.0 - (hi - x) / span) for x in xs]


def _mentions(query: str) -> Callable[[str], bool]:
    """Whether ``query`` names someone: the whole name as words ("agent-3", "Mary Ann"), any case."""
    text = query.lower()
    seen: dict[str, bool] = {}

    def names(who: str) -> bool:
        if who not in seen:
            seen[who] = re.search(rf"(?<!\w){re.escape(who)}(?!\w)", text) is not None
        return seen[who]

    return names


def _attributed(unit: Unit) -> Iterable[str]:
    """Who a unit is by: its speaker (``meta[SPEAKER]``) and its owner, lower-cased."""
    speaker = unit.meta.get(SPEAKER) if isinstance(unit.meta, dict) else None
    for who in (speaker, unit.owner):
        if isinstance(who, str) and who.strip():
            yield who.strip().lower()


def _max_boost(w: Weights, window: bool, named: bool) -> float:
    """The largest factor :func:`_boost` can give any unit under these weights."""
    b = 1.0 + (max(w.temporal, 0.0) if window else 0.0) + (max(w.attribution, 0.0) if named else 0.0)
    b += max(w.recency, 0.0) + 0.5 * abs(w.validation) + 0.5 * abs(w.importance)
    return b


def _boost(unit: Unit, w: Weights, now: float, window: tuple[float, float] | None = None, *, attributed: bool = False) -> float:
    b = 1.0
    if attributed:
        b += w.attribution
    if window is not None and w.temporal:
        at = event_time(unit)
        if window[0] <= at < window[1]:
            b += w.temporal
    if w.recency:
        age = max(now - (unit.last_access or unit.updated_at or unit.created_at), 0.0)
        b += w.recency * math.exp(-age * math.log(2) / w.half_life_s)
    if w.validation:
        b += w.validation * (unit.validation - 0.5)
    if w.importance:
        b += w.importance * (unit.importance - 0.5)
    return max(b, 0.0)


# -- time ---------------------------------------------------------------------------------

_MONTHS = {m: i for i, m in enumerate(
    ["january", "february", "march", "april", "may", "june", "july", "august", "september",
     "october", "november", "december"], 1)}
_MONTH_RE = "|".join(_MONTHS)
# phrase: (first day, day after the last), counted from today's midnight (UTC)
_RELATIVE = {"yesterday": (-1, 0), "today": (0, 1), "last week": (-7, 1), "this week": (-7, 1),
             "last month": (-31, 1), "this month": (-31, 1), "last year": (-365, 1)}


def event_time(unit: Unit) -> float:
    """When what a unit records happened: ``meta["event_at"]`` (epoch seconds) if set, else its creation time."""
    at = unit.meta.get("event_at") if isinstance(unit.meta, dict) else None
    return float(at) if isinstance(at, int | float) else unit.created_at


def time_window(query: str, *, now: float) -> tuple[float, float] | None:
    """The time span a query names, as ``(start, end)`` epoch seconds (UTC), or None.

    Understands a day ("7 May 2023", "May 7, 2023"), a month ("May 2023", "last May", "in
    May" = the latest May not after ``now``), a year ("in 2022") and a few relative phrases
    ("yesterday", "last week", "last month", "last year"), which end at ``now``. Anything
    fancier belongs to a real date parser; a query with no time words gets no window.
    """
    from datetime import UTC, datetime, timedelta

    q = query.lower()
    today = datetime.fromtimestamp(now, UTC)

    def span(a: datetime, b: datetime) -> tuple[float, float]:
        return a.timestamp(), b.timestamp()

    def month(y: int, m: int) -> tuple[float, float]:
        a = datetime(y, m, 1, tzinfo=UTC)
        b = datetime(y + (m == 12), m % 12 + 1, 1, tzinfo=UTC)
        return span(a, b)

    m = re.search(rf"\b(\d{{1,2}})(?:st|nd|rd|th)?\s+({_MONTH_RE}),?\s+(\d{{4}})\b", q) or re.search(
        rf"\b({_MONTH_RE})\s+(\d{{1,2}})(?:st|nd|rd|th)?,?\s+(\d{{4}})\b", q)
    if m:
        g = m.groups()
        day, mon = (int(g[0]), g[1]) if g[0].isdigit() else (int(g[1]), g[0])
        try:
            a = datetime(int(g[2]), _MONTHS[mon], day, tzinfo=UTC)
        except ValueError:
            return None
        return span(a, a + timedelta(days=1))
    m = re.search(rf"\b({_MONTH_RE}),?\s+(\d{{4}})\b", q)
    if m:
        return month(int(m.group(2)), _MONTHS[m.group(1)])
    for phrase, (first, after) in _RELATIVE.items():
        if re.search(rf"\b{phrase}\b", q):
            midnight = today.replace(hour=0, minute=0, second=0, microsecond=0)
            return span(midnight + timedelta(days=first), midnight + timedelta(days=after))
    m = re.search(rf"\b(?:last|in|during|this)\s+({_MONTH_RE})\b", q)
    if m:
        mon = _MONTHS[m.group(1)]
        year = today.year if mon <= today.month else today.year - 1
        return month(year, mon)
    m = re.search(r"\b(?:in|during|since|of)\s+((?:19|20)\d{2})\b", q)
    if m:
        y = int(m.group(1))
        return span(datetime(y, 1, 1, tzinfo=UTC), datetime(y + 1, 1, 1, tzinfo=UTC))
    return None


# -- prompt packing ---------------------------------------------------------------------

#: Prompt sections in the order they are written, and the kinds each one holds.
DEFAULT_SECTIONS: dict[str, frozenset[Kind]] = {
    "rules": frozenset({Kind.RULE, Kind.LESSON, Kind.PREFERENCE}),
    "examples": frozenset({Kind.EXAMPLE, Kind.PROCEDURE}),
    "facts": frozenset({Kind.FACT, Kind.EPISODE, Kind.PROFILE}),
}


def approx_tokens(text: str) -> int:
    """A tokenizer-free estimate: words and punctuation, scaled for sub-word splits."""
    return max(1, math.ceil(len(re.findall(r"\w+|[^\w\s]", text)) * 1.3))


@dataclass(frozen=True, slots=True)
class Packed:
    """Recalled units fitted into a token budget, grouped in prompt sections."""

    sections: dict[str, list[Recalled]]
    tokens: int
    budget: int
    dropped: list[Recalled]
    #: Names what was shown, to whom: an outcome that names it credits these units
    #: (:meth:`forge.engine.memory.Memory.outcome`). Empty for a viewer that is no agent.
    recall_id: str = ""

    @property
    def units(self) -> list[Unit]:
        return [r.unit for rs in self.sections.values() for r in rs]

    @property
    def rules(self) -> list[tuple[Unit, Rule]]:
        """The shown units that carry a typed rule, with it: advice a client loop can enforce
        (forbid ``avoid`` where ``when`` holds) rather than only read."""
        return [(u, rule) for u in self.units if (rule := u.rule) is not None]

    def render(self) -> str:
        parts = []
        for name, items in self.sections.items():
            if items:
                parts.append(f"## {name.capitalize()}\n" + "\n".join(_line(r.unit) for r in items))
        return "\n\n".join(parts)


class Recalls(list[Recalled]):
    """What :meth:`forge.engine.memory.Memory.recall` returns: the ranked units, and the
    ``recall_id`` an outcome names to credit them (empty for a viewer that is no agent)."""

    recall_id: str = ""


def _line(unit: Unit) -> str:
    title = unit.meta.get("name") if isinstance(unit.meta, dict) else None
    body = unit.content.strip()
    if _unverified(unit):  # shown, but with whose it is and that nothing vouched for it yet
        body = f"(unverified, from {unit.owner or unit.provenance.source or 'an agent'}) {body}"
    return f"- {title}: {body}" if title else f"- {body}"


def _unverified(unit: Unit) -> bool:
    """A unit the screen's model doubted that no second origin has vouched for yet
    (``meta["doubt"]`` without ``lifted``; see :mod:`forge.share.doubt`)."""
    mark = unit.meta.get("doubt") if isinstance(unit.meta, Mapping) else None
    return isinstance(mark, Mapping) and "lifted" not in mark


def pack(
    results: Sequence[Recalled],
    *,
    budget: int,
    count_tokens: Callable[[str], int] = approx_tokens,
    sections: dict[str, frozenset[Kind]] = DEFAULT_SECTIONS,
) -> Packed:
    """Greedily keep the best-scoring units that fit in ``budget`` tokens, each unit once.

    Section headers count against the budget. Units of kinds no section holds are dropped.
    """
    if budget <= 0:
        raise ValidationError("budget must be positive")
    out: dict[str, list[Recalled]] = {name: [] for name in sections}
    used = 0
    dropped: list[Recalled] = []
    seen_ids: set[str] = set()
    seen_text: set[str] = set()
    for r in sorted(results, key=lambda r: r.score, reverse=True):
        key = " ".join(r.unit.content.lower().split())
        if r.unit.id in seen_ids or key in seen_text:
            continue
        section = next((name for name, kinds in sections.items() if r.unit.kind in kinds), None)
        if section is None:
            dropped.append(r)
            continue
        cost = count_tokens(_line(r.unit)) + (0 if out[section] else count_tokens(f"## {section}") + 1)
        if used + cost > budget:
            dropped.append(r)
            continue
        out[section].append(r)
        used += cost
        seen_ids.add(r.unit.id)
        seen_text.add(key)
    return Packed(sections=out, tokens=used, budget=budget, dropped=dropped)
