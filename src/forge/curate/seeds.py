"""Cold start: seed packs, and warm-up rules for reading shared memory.

A seed pack is a curated JSONL file, one rule or fact per line::

    {"content": "When the tile ahead is a hole, step around it.", "kind": "rule", "domain": "gridworld", "tags": ["safety"]}

Imported into one scope with ``provenance.source = "seed"`` and a low validation (0.3 by
default) that use must raise: a seed helps an agent start, it does not outrank what the
agent learns. The whole pack is read and checked before anything is written, and written
through admission in one transaction, so a bad line leaves the store as it was and importing
the same pack twice adds nothing the second time.

Warm-up (:class:`WarmUp`) decides what an agent reads from shared memory while it is new:
nothing until it has ``after_episodes`` episodes of its own, only shared units validated at
``min_validation`` or better, and a growing share of memory sections (``ramp_episodes``).
"Shared" is anything that is not the agent's :func:`own` memory: received copies are stored
as the receiver's private units, so ownership alone cannot tell them apart.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge.engine.port import MemoryPort
from forge.errors import ValidationError
from forge.files import read_text
from forge.model import Context, Provenance, Scope, Unit, derived_id

__all__ = ["SEED_FIELDS", "SEED_SOURCE", "WarmUp", "import_seed_pack", "load_seed_pack", "own", "read_seed_pack"]

SEED_SOURCE = "seed"
#: What a seed line may hold; anything else is a mistake worth naming.
SEED_FIELDS = frozenset({"id", "content", "kind", "domain", "task", "role", "tags", "importance", "confidence", "meta"})


def read_seed_pack(
    lines: Iterable[str], *, name: str, scope: str = "global", owner: str = "", validation: float = 0.3
) -> list[Unit]:
    """Parse and check a whole seed pack; a bad line raises ``ValidationError`` naming it."""
    scope_ = Scope.parse(scope)
    if scope_.kind == "private" and not owner:
        raise ValidationError("a seed pack imported into a private scope needs an owner agent")
    units: list[Unit] = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{name}:{n}"
        try:
            rec = json.loads(line)
        except ValueError as exc:
            raise ValidationError(f"{where}: malformed JSON ({exc})") from None
        except RecursionError:
            raise ValidationError(f"{where}: JSON nested too deeply") from None
        if not isinstance(rec, dict):
            raise ValidationError(f"{where}: a seed line must be a JSON object")
        unknown = set(rec) - SEED_FIELDS
        if unknown:
            raise ValidationError(f"{where}: unknown seed field(s): {', '.join(sorted(unknown))}")
        if "content" not in rec:
            raise ValidationError(f"{where}: a seed needs 'content'")
        meta = rec.get("meta", {})
        if not isinstance(meta, dict):
            raise ValidationError(f"{where}: 'meta' must be a JSON object")
        try:
            content = rec["content"]
            uid = rec.get("id") or derived_id("seed", name, scope_, content)
            units.append(
                Unit(
                    id=uid,
                    content=content,
                    kind=rec.get("kind", "rule"),
                    context=Context(rec.get("domain", ""), rec.get("task", ""), rec.get("role", ""), tuple(rec.get("tags") or ())),
                    scope=scope_,
                    owner=owner,
                    confidence=rec.get("confidence", 0.5),
                    validation=validation,
                    importance=rec.get("importance", 0.5),
                    provenance=Provenance(source=SEED_SOURCE),
                    meta={**meta, "seed_pack": name},
                )
            )
        except ValidationError as exc:
            raise ValidationError(f"{where}: {exc}") from None
        except TypeError as exc:
            raise ValidationError(f"{where}: {exc}") from None
    if not units:
        raise ValidationError(f"{name}: the seed pack holds no seeds")
    return units


def load_seed_pack(path: str | Path, *, scope: str = "global", owner: str = "", validation: float = 0.3) -> list[Unit]:
    """Read and check the seed pack at ``path`` (nothing is written)."""
    p = Path(path)
    text = read_text(p, what="a JSONL seed pack")
    return read_seed_pack(text.splitlines(), name=p.name, scope=scope, owner=owner, validation=validation)


def import_seed_pack(
    memory: MemoryPort,
    path: str | Path,
    *,
    scope: str = "global",
    owner: str = "",
    validation: float = 0.3,
    actor: str = "",
    now: float | None = None,
) -> list[Any]:
    """Read, check and admit a seed pack in one transaction; returns the admission decisions."""
    from forge.curate.admission import admit

    units = load_seed_pack(path, scope=scope, owner=owner, validation=validation)
    return admit(memory, units, actor=actor or f"seed:{Path(path).name}", now=now)


def own(unit: Unit, agent: str) -> bool:
    """Whether ``unit`` is ``agent``'s own memory: owned by it and made from its own work.

    Not its own: what it received (the exchange and the champion broadcast store private
    copies owned by the receiver, with ``provenance.source = "broadcast:<sender>"`` and, from
    the exchange, ``meta.origin``), consensus copies, and seeds.
    """
    if not agent or unit.owner != agent:
        return False
    source = unit.provenance.source
    if source == SEED_SOURCE or source.startswith(("broadcast:", "consensus:")) or "consensus_of" in unit.meta:
        return False
    origin = unit.meta.get("origin")
    return not origin or origin == agent


@dataclass(frozen=True, slots=True)
class WarmUp:
    """What a new agent reads from shared memory; the defaults change nothing.

    - ``after_episodes``: shared units are hidden until the agent has this many episodes;
    - ``min_validation``: after that, only shared units validated at least this well;
    - ``ramp_episodes``: the share of memory sections shown grows linearly to all of them
      over this many episodes (gradual enablement), at least one section from the start.

    An agent's :func:`own` units are never hidden: warm-up is about trusting others.
    A hidden unit earns nothing from use (it is never shown), so with ``min_validation``
    shared units get in by corroboration or by being validated where they were made.
    """

    after_episodes: int = 0
    min_validation: float = 0.0
    ramp_episodes: int = 0

    def __post_init__(self) -> None:
        if self.after_episodes < 0 or self.ramp_episodes < 0 or not 0 <= self.min_validation <= 1:
            raise ValidationError("warm-up needs after_episodes >= 0, ramp_episodes >= 0 and 0 <= min_validation <= 1")

    def shows(self, unit: Unit, *, agent: str, episodes: int) -> bool:
        """Whether ``agent``, with ``episodes`` episodes behind it, reads ``unit`` now."""
        if own(unit, agent):
            return True
        return episodes >= self.after_episodes and unit.validation >= self.min_validation

    def share(self, episodes: int) -> float:
        """The share of memory sections shown after ``episodes`` episodes."""
        if self.ramp_episodes <= 0:
            return 1.0
        return min(1.0, max(0.0, episodes / self.ramp_episodes))

    def sections(self, sections: Sequence[str], *, episodes: int) -> list[str]:
        """The first sections (in the given order of priority) the agent sees now."""
        if not sections:
            return []
        n = max(1, math.ceil(self.share(episodes) * len(sections)))
        return list(sections[:n])
