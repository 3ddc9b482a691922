"""Hierarchical retrieval (LLMA-Mem): procedures first, episodes when no procedure fits.

1. The ``top_k`` (3) procedures nearest the query by cosine, from the pools the agent may
   read; each is kept if its cosine reaches ``relevance`` and its success rate ``rho``
   reaches ``min_rho``.
2. If none is kept, the nearest ``candidates`` episodes are rescored as
   ``0.2 * recency + 0.4 * cosine + 0.4 * importance`` (importance 1.0 for a success, 0.3 for
   a failure; recency halves every ``half_life`` episodes recorded since) and the best
   ``episode_k`` are returned.

The issue quotes the weights and k but not the two thresholds; 0.5 and 0.5 are our defaults.
The result records the path taken, why, and every candidate rejected with its reason.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from forge.errors import ValidationError
from forge.model import Kind, Unit
from forge.recall import approx_tokens
from forge.store.base import Filter
from forge.team.memories import Procedure, TeamMemory, _clip

__all__ = ["Retrieval", "RetrievalConfig", "Scored", "retrieve"]


@dataclass(frozen=True, slots=True)
class RetrievalConfig:
    """Thresholds and weights; the defaults are the paper's where it gives them."""

    top_k: int = 3
    relevance: float = 0.5
    min_rho: float = 0.5
    episode_k: int = 3
    candidates: int = 20
    w_recency: float = 0.2
    w_cosine: float = 0.4
    w_importance: float = 0.4
    success_importance: float = 1.0
    failure_importance: float = 0.3
    half_life: float = 10.0  # episodes

    def __post_init__(self) -> None:
        for name in ("top_k", "episode_k", "candidates"):
            if getattr(self, name) < 1:
                raise ValidationError(f"retrieval {name} must be at least 1")
        if self.half_life <= 0:
            raise ValidationError("retrieval half_life must be positive")


@dataclass(frozen=True, slots=True)
class Scored:
    """A retrieved unit with its score and the parts of it."""

    unit: Unit
    score: float
    parts: dict[str, float] = field(default_factory=dict)

    @property
    def procedure(self) -> Procedure | None:
        return Procedure.of(self.unit) if self.unit.kind is Kind.PROCEDURE else None


@dataclass(frozen=True, slots=True)
class Retrieval:
    """What an agent gets before acting. ``path`` is ``"procedures"``, ``"episodes"`` or ``"none"``."""

    path: str
    reason: str
    items: list[Scored]
    rejected: list[dict[str, Any]]

    @property
    def procedure_ids(self) -> list[str]:
        """Ids to pass to :meth:`TeamMemory.record_use` (or ``used_procedures``) after the task."""
        return [s.unit.id for s in self.items if s.unit.kind is Kind.PROCEDURE]

    def render(self, *, budget: int = 512, count_tokens: Callable[[str], int] = approx_tokens) -> str:
        """The prompt block, best first, whole lines only, within ``budget`` tokens."""
        if budget <= 0:
            raise ValidationError("budget must be positive")
        if not self.items:
            return ""
        header = "## Procedures that worked" if self.path == "procedures" else "## Similar past tasks"
        used = count_tokens(header)
        if used > budget:
            return ""
        lines = [header]
        for s in self.items:
            line = _line(s.unit)
            cost = count_tokens(line)
            if used + cost > budget:
                continue
            lines.append(line)
            used += cost
        return "\n".join(lines) if len(lines) > 1 else ""


def _line(unit: Unit) -> str:
    m = unit.meta
    if unit.kind is Kind.PROCEDURE:
        p = Procedure.of(unit)
        return f"- {p.title} (worked {p.successes}/{p.successes + p.failures}): {p.knowledge}"
    outcome = m.get("outcome", {})
    status = "succeeded" if outcome.get("success") else "failed"
    text = f"- {_clip(str(m.get('task', '')), 200)} -> {status}. Lessons: {' '.join(m.get('lessons', []))}"
    if m.get("diagnosis"):
        text += f" Root cause: {m['diagnosis']}"
    return text


def retrieve(
    tm: TeamMemory,
    query: str,
    *,
    agent: str,
    config: RetrievalConfig = RetrievalConfig(),
    touch: bool = True,
) -> Retrieval:
    """Procedures (or, failing that, episodes) for ``agent`` facing ``query``.

    Only pools ``agent`` may read under ``tm``'s topology are searched; the store enforces
    that inside its query. Kept procedures have their view count (``access_count``) bumped
    when ``touch``.
    """
    if not query.strip():
        raise ValidationError("retrieval query is empty")
    viewer = tm.viewer(agent)
    store = tm.memory.store
    qv = tm.memory.embed([query])[0]
    rejected: list[dict[str, Any]] = []
    hits = store.vector_search(qv, k=config.top_k, viewer=viewer, filter=tm.layer_filter("procedural", Kind.PROCEDURE))
    units = {u.id: u for u in store.get_many([h.id for h in hits], viewer=viewer)}
    kept: list[Scored] = []
    for h in hits:
        u = units.get(h.id)
        if u is None:
            continue
        p = Procedure.of(u)
        if h.score < config.relevance:
            rejected.append({"id": u.id, "kind": "procedure", "reason": f"cosine {h.score:.2f} < relevance {config.relevance}"})
        elif p.rho < config.min_rho:
            rejected.append({"id": u.id, "kind": "procedure", "reason": f"rho {p.rho:.2f} < min_rho {config.min_rho}"})
        else:
            kept.append(Scored(u, h.score, {"cosine": round(h.score, 4), "rho": round(p.rho, 4)}))
    if kept:
        if touch:
            store.touch([s.unit.id for s in kept])
        reason = f"{len(kept)} of the top {len(hits)} procedures passed relevance >= {config.relevance} and rho >= {config.min_rho}"
        return Retrieval("procedures", reason, kept, rejected)
    why = "no procedures to search" if not hits else f"none of the top {len(hits)} procedures passed the thresholds"

    ef = tm.layer_filter("episodic", Kind.EPISODE)
    hits = store.vector_search(qv, k=config.candidates, viewer=viewer, filter=ef)
    if not hits:
        return Retrieval("none", why + "; no episodes to fall back on", [], rejected)
    units = {u.id: u for u in store.get_many([h.id for h in hits], viewer=viewer)}
    scored: list[Scored] = []
    for h in hits:
        u = units.get(h.id)
        if u is None:
            continue
        # Episodes recorded after this one, among those the agent can read: age in tasks seen.
        age = max(store.count(viewer=viewer, filter=_since(ef, u.created_at)) - 1, 0)
        recency = 0.5 ** (age / config.half_life)
        success = bool(u.meta.get("outcome", {}).get("success"))
        importance = config.success_importance if success else config.failure_importance
        score = config.w_recency * recency + config.w_cosine * h.score + config.w_importance * importance
        parts = {"recency": recency, "cosine": h.score, "importance": importance, "age": age}
        scored.append(Scored(u, score, parts))
    scored.sort(key=lambda s: s.score, reverse=True)
    reason = (
        f"{why}; fell back to {min(len(scored), config.episode_k)} of {len(scored)} episodes scored "
        f"{config.w_recency}*recency + {config.w_cosine}*cosine + {config.w_importance}*importance"
    )
    return Retrieval("episodes", reason, scored[: config.episode_k], rejected)


def _since(f: Filter, ts: float) -> Filter:
    return replace(f, since=ts)
