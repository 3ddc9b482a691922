"""The screen's verdict, for every door from one agent to another: held for review, or let through."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from forge.model import Unit
from forge.share.screen import BLOCKING, Finding, Screen

__all__ = ["Held", "hold", "redact_tree"]


@dataclass(frozen=True, slots=True)
class Held:
    """Why the screen holds a unit for review, and the content it is kept with (secrets and
    personal data redacted when ``redacted``)."""

    findings: tuple[Finding, ...]
    content: str
    redacted: bool = False

    @property
    def reason(self) -> str:
        return self.findings[0].category

    def record(self, at: float) -> dict[str, Any]:
        """What ``meta["quarantine"]`` keeps of it."""
        categories = list(dict.fromkeys(f.category for f in self.findings))
        return {"reason": categories[0], "findings": [f.to_dict() for f in self.findings], "redacted": self.redacted, "at": at}

    def __str__(self) -> str:
        return "; ".join(str(f) for f in self.findings)


def hold(screen: Screen, unit: Unit, *, block: Iterable[str] = BLOCKING, redact: bool = True) -> Held | None:
    """The screen's verdict on a unit about to reach other agents: None to let it through,
    else why it is held for review. The exchange judges capsules with it, and the service
    judges an agent's group and global writes with it (REST, MCP, conversations), so one
    agent's memory reaches another's prompt through the same screen by every door.

    Safety and usefulness are separate verdicts: a unit the screen's semantic layer doubts
    is held too, never accepted because an assessor finds it useful.
    """
    block = frozenset(block)
    findings = [f for f in screen.check_unit(unit) if f.category in block]
    if findings:
        redacted = redact and any(f.category in ("secret", "pii") for f in findings)
        return Held(tuple(findings), screen.redact(unit.content) if redacted else unit.content, redacted)
    doubt = screen.doubtful(unit) if "injection" in block else None
    if doubt is not None:
        return Held((Finding("injection", "doubtful", f"p={doubt:.2f}: may be orders for agents or harmful advice"),), unit.content)
    return None


def redact_tree(value: Any, screen: Screen) -> Any:
    """Redact every string leaf of a JSON-like value (numbers are left alone on purpose)."""
    if isinstance(value, str):
        return screen.redact(value)
    if isinstance(value, Mapping):
        return {k: redact_tree(v, screen) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_tree(v, screen) for v in value]
    return value
