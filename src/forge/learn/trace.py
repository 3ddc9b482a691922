"""What a user's own agent reports after a task: its trace and its outcome.

No environment, no seed, no list of valid actions: a trace is the task's text plus the steps
the agent took (messages, tool calls with their arguments and errors, observations, the
final answer), and the recall ids of the memory that fed it. An outcome is success and/or a
score, and optional feedback from a user or a checker. Both are validated when built, so
bad input fails at the door with one line, before any work or write.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from forge.errors import ValidationError
from forge.model import MAX_FIELD_CHARS, MAX_META_BYTES, MAX_STEP_CHARS

__all__ = ["MAX_TRACE_STEPS", "STEP_TYPES", "Outcome", "Trace", "TraceStep"]

STEP_TYPES = ("message", "tool", "observation", "answer")
#: Most steps one trace may hold (a longer run is reported in parts, or summarised).
MAX_TRACE_STEPS = 500
_MAX_RECALLS = 64


def _text(value: Any, name: str, limit: int, *, required: bool = False) -> str:
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be a string, got {type(value).__name__}")
    if required and not value.strip():
        raise ValidationError(f"{name} is empty")
    if len(value) > limit:
        raise ValidationError(f"{name} is {len(value)} characters; the limit is {limit}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"{name} is not valid UTF-8 text") from None
    return value


def _only(data: Mapping[str, Any], allowed: set[str], what: str) -> None:
    if not isinstance(data, Mapping):
        raise ValidationError(f"{what} must be a JSON object")
    unknown = sorted(set(data) - allowed)
    if unknown:
        raise ValidationError(f"unknown {what} field(s): {', '.join(map(str, unknown))}")


@dataclass(frozen=True, slots=True)
class TraceStep:
    """One step: ``type`` is message, tool (``tool`` called with ``args``, failing with
    ``error`` if it did), observation, or answer; ``content`` is its text."""

    type: str
    content: str = ""
    role: str = ""
    tool: str = ""
    args: Mapping[str, Any] = field(default_factory=dict)
    error: str = ""

    def __post_init__(self) -> None:
        if self.type not in STEP_TYPES:
            raise ValidationError(f"trace step type must be one of {', '.join(STEP_TYPES)}, not {str(self.type)[:40]!r}")
        for name, limit in (("content", MAX_STEP_CHARS), ("role", MAX_FIELD_CHARS), ("tool", MAX_FIELD_CHARS), ("error", MAX_STEP_CHARS)):
            _text(getattr(self, name), f"trace step {name}", limit)
        if self.type == "tool" and not self.tool.strip():
            raise ValidationError("a tool step must name its tool")
        if not isinstance(self.args, Mapping):
            raise ValidationError("trace step args must be a JSON object")
        try:
            size = len(json.dumps(dict(self.args), ensure_ascii=False, allow_nan=False).encode())
        except (TypeError, ValueError):
            raise ValidationError("trace step args must be JSON (string keys, JSON values)") from None
        if size > MAX_META_BYTES:
            raise ValidationError(f"trace step args are {size} bytes; the limit is {MAX_META_BYTES}")

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "content": self.content, "role": self.role, "tool": self.tool, "args": dict(self.args), "error": self.error}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TraceStep:
        _only(data, {"type", "content", "role", "tool", "args", "error"}, "trace step")
        return cls(
            type=data.get("type", ""), content=data.get("content") or "", role=data.get("role") or "",
            tool=data.get("tool") or "", args=data.get("args") or {}, error=data.get("error") or "",
        )


@dataclass(frozen=True, slots=True)
class Trace:
    """One task as the agent did it. ``kind`` names the task's kind ("refund", "disk-full"),
    which rules learned from it are filed under; ``recall_ids`` are the recalls that fed it."""

    task: str
    steps: tuple[TraceStep, ...] = ()
    answer: str = ""
    kind: str = ""
    recall_ids: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _text(self.task, "trace task", MAX_STEP_CHARS, required=True)
        _text(self.answer, "trace answer", MAX_STEP_CHARS)
        _text(self.kind, "trace kind", MAX_FIELD_CHARS)
        steps = tuple(s if isinstance(s, TraceStep) else TraceStep.from_dict(s) for s in self.steps)
        if len(steps) > MAX_TRACE_STEPS:
            raise ValidationError(f"a trace holds at most {MAX_TRACE_STEPS} steps, got {len(steps)}")
        object.__setattr__(self, "steps", steps)
        if isinstance(self.recall_ids, str) or not isinstance(self.recall_ids, Sequence):
            raise ValidationError("trace recall_ids must be a list of recall ids")
        ids = tuple(dict.fromkeys(_text(r, "trace recall id", 16_384, required=True) for r in self.recall_ids))
        if len(ids) > _MAX_RECALLS:
            raise ValidationError(f"a trace names at most {_MAX_RECALLS} recalls, got {len(ids)}")
        object.__setattr__(self, "recall_ids", ids)

    @property
    def tools(self) -> list[str]:
        """The tools called, once each, in order."""
        return list(dict.fromkeys(s.tool for s in self.steps if s.type == "tool"))

    @property
    def errors(self) -> list[tuple[str, str]]:
        """``(tool, error)`` for each tool call that failed."""
        return [(s.tool, s.error) for s in self.steps if s.type == "tool" and s.error.strip()]

    def to_dict(self) -> dict[str, Any]:
        return {"task": self.task, "kind": self.kind, "steps": [s.to_dict() for s in self.steps], "answer": self.answer,
                "recall_ids": list(self.recall_ids)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Trace:
        _only(data, {"task", "kind", "steps", "answer", "recall_ids"}, "trace")
        steps = data.get("steps") or []
        if not isinstance(steps, list):
            raise ValidationError("trace steps must be a list")
        return cls(
            task=data.get("task", ""), steps=tuple(TraceStep.from_dict(s) for s in steps), answer=data.get("answer") or "",
            kind=data.get("kind") or "", recall_ids=_ids(data.get("recall_ids")),
        )


def _ids(value: Any) -> tuple[Any, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple):
        raise ValidationError("trace recall_ids must be a list of recall ids")
    return tuple(value)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How a task went: ``success`` and/or a ``score`` in [0, 1], and ``feedback`` text.
    With only a score, success is a score of at least 0.5."""

    success: bool | None = None
    score: float | None = None
    feedback: str = ""

    def __post_init__(self) -> None:
        if self.success is not None and not isinstance(self.success, bool):
            raise ValidationError("outcome success must be true, false or null")
        if self.score is not None:
            if isinstance(self.score, bool) or not isinstance(self.score, int | float) or not 0.0 <= float(self.score) <= 1.0:
                raise ValidationError("outcome score must be a number from 0 to 1")
            object.__setattr__(self, "score", float(self.score))
        _text(self.feedback, "outcome feedback", MAX_STEP_CHARS)

    @property
    def succeeded(self) -> bool | None:
        """Success as given, else read from the score; None when neither says."""
        if self.success is not None:
            return self.success
        return None if self.score is None else self.score >= 0.5

    def to_dict(self) -> dict[str, Any]:
        return {"success": self.success, "score": self.score, "feedback": self.feedback}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> Outcome:
        data = data or {}
        _only(data, {"success", "score", "feedback"}, "outcome")
        return cls(success=data.get("success"), score=data.get("score"), feedback=data.get("feedback") or "")
