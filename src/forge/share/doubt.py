"""The doubt path: a received unit the screen is unsure of waits for a witness, not for an operator.

The screen's semantic layer is a classifier, and on writers it never saw it flags honest rules
("When a user cannot log in, tell them to clear cookies" scored p=0.97). Sending everything it
flags to the operator's review queue drowns the operator; accepting it risks an attack that
reads like advice. So the exchange sorts what it receives three ways (:func:`sort`):

- **review** (:class:`~forge.share.verdict.Held`): what a pattern names (an instruction
  override, a secret, personal data, malformed or oversized text) is quarantined for an
  operator, as before;
- **doubt** (:class:`Doubt`): what only the semantic layer flags, at or above its ``doubt``
  level, is stored *quarantined* with ``meta["doubt"]`` and ``meta["quarantine"]["review"]
  = False``: out of recall (only active units are recalled), out of the review queue
  (:func:`review_queue`), and released to active when an independent origin sends the same
  memory (:func:`corroborating`; a doubted rediscovery of a memory already active
  corroborates that one instead of being kept): two agents that found the same rule on their own are
  evidence a single insider cannot forge with one key. An honest rule pays a delay (or, if
  nobody else ever learns it, stays hidden); an attack stays out unless a second key signs
  it. Once active, credit from outcomes (:mod:`forge.learn.online`) retires a released unit
  that keeps failing;
- **pass**: everything else goes on to the usefulness assessment, and so does a unit from a
  known peer (origin and sender at :data:`TRUSTED` reputation or more) that the semantic layer
  doubts below its block level.

What each path costs on the outside writers' held-out sets is in docs/figures/sharing.md
(``bench/poisoning.py --held-out-only``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from forge.engine.port import MemoryPort
from forge.model import Status, Unit, Viewer
from forge.share.screen import BLOCKING, Finding, Screen
from forge.share.verdict import Held
from forge.store import Filter

__all__ = ["DOUBT", "TRUSTED", "Doubt", "corroborating", "doubted", "lift", "review_queue", "sort"]

#: The meta key a doubted unit carries (and keeps, with ``lifted``, once released).
DOUBT = "doubt"

#: The reputation (:class:`~forge.share.consensus.Reputation`, 0.5 for a stranger) at which an
#: origin and its sender are known peers: three useful units more than failed ones. A known
#: peer's doubtful unit is judged on usefulness like any other ("When valve 3 leaks, close
#: valve 13 first." scored 0.41, at the doubt level); what fails is retired by credit, and
#: each failure lowers the peer's reputation below this level again.
TRUSTED = 0.8


@dataclass(frozen=True, slots=True)
class Doubt:
    """Why a unit waits for an independent witness: the semantic layer's P(harmful)."""

    p: float
    finding: Finding

    def record(self, at: float) -> dict[str, Any]:
        """What ``meta["doubt"]`` keeps of it."""
        return {"p": round(self.p, 4), "rule": self.finding.rule, "at": at, "until": "an independent origin sends the same memory"}

    def __str__(self) -> str:
        return str(self.finding)


def sort(screen: Screen, unit: Unit, *, block: Iterable[str] = BLOCKING, redact: bool = True) -> Any:
    """The screen's verdict for the doubt path: a :class:`~forge.share.verdict.Held` (for
    review), a :class:`Doubt` (wait for a witness), or None (judge its usefulness).

    A unit is reviewed when a pattern finds something, doubted when only the semantic layer
    does (its block level or its doubt level): the patterns name what they saw, the model
    gives a probability, and a probability alone is not a reason to page an operator.
    """
    block = frozenset(block)
    findings = [f for f in screen.check_unit(unit) if f.category in block]
    named = [f for f in findings if f.rule != "intent"]
    if named:
        redacted = redact and any(f.category in ("secret", "pii") for f in named)
        return Held(tuple(findings), screen.redact(unit.content) if redacted else unit.content, redacted)
    if "injection" not in block:
        return None
    p = screen.doubtful(unit)
    if p is None:
        return None
    rule = "intent" if findings else "doubtful"
    return Doubt(p, Finding("injection", rule, f"p={p:.2f}: may be orders for agents or harmful advice; waits for an independent witness"))


def doubted(unit: Unit) -> bool:
    """Whether a unit is waiting on the doubt path (quarantined, not for review)."""
    return unit.status is Status.QUARANTINED and DOUBT in unit.meta and "lifted" not in unit.meta[DOUBT]


def review_queue(units: Iterable[Unit]) -> list[Unit]:
    """The quarantined units an operator should review: those not merely doubted."""
    return [u for u in units if u.status is Status.QUARANTINED and not doubted(u)]


def corroborating(memory: MemoryPort, *, owner: str, vector: Any, channel: str, at_least: float, k: int = 5) -> Unit | None:
    """A doubted unit of ``owner`` within cosine ``at_least`` of ``vector`` that reached it
    through another channel than ``channel`` (an origin we can authenticate, or the forwarder
    we only have its word from), or None. The same key sending again is no witness."""
    f = Filter.make(status=["quarantined"], owner=owner)
    for unit, _ in memory.nearest(vector, k=k, viewer=Viewer.admin(), filter=f, at_least=at_least):
        if doubted(unit) and str(unit.meta.get("via") or unit.meta.get("origin") or "") != channel:
            return unit
    return None


def lift(memory: MemoryPort, unit: Unit, *, witness: str, at: float, actor: str) -> Unit:
    """Release a doubted unit to active: an independent origin sent the same memory."""
    record = {**unit.meta[DOUBT], "lifted": {"by": witness, "at": at}}
    unit = memory.update(unit.replace(meta={**unit.meta, DOUBT: record}), actor=actor, reembed=False)
    memory.set_status(unit.id, Status.ACTIVE, reason=f"doubt lifted: {witness} sent the same memory independently", actor=actor)
    return unit
