"""Lifelong team memory (LLMA-Mem, arXiv 2604.03295): three memories, per-layer layouts,
consolidation into procedures, hierarchical prompts, and the paper's metrics.

    from forge import Memory
    from forge.team import Action, Consolidator, Outcome, TeamMemory

    tm = TeamMemory(Memory.open("team.db"), team="red", agents=["plan", "dba"], layout="hybrid", llm=llm)
    cons = Consolidator(tm, every=5)
    got = tm.recollect("dba", task)                       # procedures, rules, past tasks
    prompt = got.block                                    # written by forge.learn.prompt.recollect
    who = tm.recollect("plan", task, layers=("transactive",)).block
    ...
    tm.record_task(task=task, outcome=Outcome(success=True, score=1.0), actions=[...], used=got.ids)
    cons.task_done()

:class:`Scoreboard` keeps the per-task metrics a runner reports (TS, CS, J, AP_t, AIP, tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from forge.errors import ValidationError
from forge.team.consolidate import (
    CONSOLIDATION_ENV,
    ClusterReport,
    ConsolidationReport,
    Consolidator,
    cluster_vectors,
    consolidate,
)
from forge.team.memories import (
    ACTOR_ROLE,
    EPS,
    LAYERS,
    TEAM_SECTIONS,
    TEAM_WEIGHTS,
    Action,
    MemoryLayout,
    Outcome,
    Procedure,
    TaskLesson,
    TaskRecord,
    TeamMemory,
    rho,
    task_lesson,
)

__all__ = [
    "ACTOR_ROLE",
    "CONSOLIDATION_ENV",
    "EPS",
    "LAYERS",
    "TEAM_SECTIONS",
    "TEAM_WEIGHTS",
    "Action",
    "ClusterReport",
    "ConsolidationReport",
    "Consolidator",
    "MemoryLayout",
    "Outcome",
    "Procedure",
    "Scoreboard",
    "TaskLesson",
    "TaskRecord",
    "TaskScore",
    "TeamMemory",
    "cluster_vectors",
    "consolidate",
    "rho",
    "task_lesson",
]


@dataclass(frozen=True, slots=True)
class TaskScore:
    """One task's metrics: J = (TS + CS) / 2 and AP_t, the mean J up to and including it."""

    t: int
    ts: float
    cs: float
    j: float
    ap: float
    tokens_in: int
    tokens_out: int


@dataclass(slots=True)
class Scoreboard:
    """Per-task TS, CS, J and AP_t; AIP (the mean of AP_t); token totals. Serialisable for resume."""

    history: list[TaskScore] = field(default_factory=list)

    def add(self, *, ts: float, cs: float, tokens_in: int = 0, tokens_out: int = 0) -> TaskScore:
        """Record task t = len(history) + 1 and return its scores."""
        for name, v in (("ts", ts), ("cs", cs)):
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
                raise ValidationError(f"{name} must be a finite number, got {v!r}")
        for name, n in (("tokens_in", tokens_in), ("tokens_out", tokens_out)):
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise ValidationError(f"{name} must be a non-negative integer, got {n!r}")
        j = (ts + cs) / 2
        t = len(self.history) + 1
        ap = (sum(s.j for s in self.history) + j) / t
        score = TaskScore(t, float(ts), float(cs), j, ap, tokens_in, tokens_out)
        self.history.append(score)
        return score

    @property
    def ap(self) -> float:
        """AP_t after the last task (0.0 before any)."""
        return self.history[-1].ap if self.history else 0.0

    @property
    def aip(self) -> float:
        """Average improvement performance: the mean of AP_1..AP_t (0.0 before any task)."""
        return sum(s.ap for s in self.history) / len(self.history) if self.history else 0.0

    @property
    def tokens_in(self) -> int:
        return sum(s.tokens_in for s in self.history)

    @property
    def tokens_out(self) -> int:
        return sum(s.tokens_out for s in self.history)

    def to_dict(self) -> dict[str, Any]:
        return {"tasks": [[s.ts, s.cs, s.tokens_in, s.tokens_out] for s in self.history]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Scoreboard:
        board = cls()
        try:
            for ts, cs, tin, tout in data.get("tasks", []):
                board.add(ts=ts, cs=cs, tokens_in=tin, tokens_out=tout)
        except (TypeError, ValueError):
            raise ValidationError("a scoreboard record must be {'tasks': [[ts, cs, tokens_in, tokens_out], ...]}") from None
        return board
