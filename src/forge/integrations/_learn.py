"""The learning door every adapter shares: a run recorded as a trace, reported with its outcome.

    rec = TraceRecorder(task="Refund order 1234", kind="refund")
    rec.message("user", "I want my money back")
    rec.tool("refund", {"order": 1234}, error="order not found")
    rec.finish("Sorry, I could not find the order.")
    report(Client(url, key), rec.trace(), success=False, feedback="the order id had a typo")

Each adapter fills a :class:`TraceRecorder` from its framework's events (LangChain callbacks,
a LangGraph state's messages, the Agents SDK's run hooks, LlamaIndex callbacks, crewai's step
callbacks) and hands it to :func:`report` / :func:`areport`, which send it through the one
learning entry of the memory given: ``POST /v1/learn`` for a :class:`forge.client.Client` or
:class:`~forge.client.AsyncClient` (a job; ``wait=True`` waits for what it learned), or
:meth:`forge.Memory.learn` in this process (as ``agent``). What a framework hands over is made
to fit a trace here, once: each text clipped to 4,000 characters (a tool that returns a web
page still leaves a trace the server takes: reflection reads far less), arguments made JSON
(and kept as their text when they are not, or too long), and a run longer than a trace holds
kept as its start and its end.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from forge.errors import ConfigError, ValidationError
from forge.integrations._port import ForgeMemory
from forge.learn.trace import MAX_TRACE_STEPS, Outcome, Trace
from forge.model import MAX_FIELD_CHARS

__all__ = ["Reporting", "TraceRecorder", "areport", "report"]

_HEAD = 100  # steps kept from the start of a run longer than a trace holds (the rest from its end)
_CLIP = 4000  # characters of a recorded text (and bytes of a step's arguments): 500 steps stay far below a request's 8 MiB


def _clip(text: Any, limit: int = _CLIP) -> str:
    text = text if isinstance(text, str) else ("" if text is None else str(text))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _json(args: Any) -> dict[str, Any]:
    """Tool arguments as a JSON object (a string that holds one is read; anything else is kept as ``input``)."""
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return {"input": _clip(args)} if args.strip() else {}
    if not isinstance(args, Mapping):
        return {} if args is None else {"input": _clip(args)}
    try:
        text = json.dumps({str(k): v for k, v in args.items()}, default=str, allow_nan=False)
    except ValueError:  # NaN or infinity: not JSON
        return {"input": _clip(repr(dict(args)))}
    return json.loads(text) if len(text) <= _CLIP else {"input": _clip(text)}


@dataclass
class TraceRecorder:
    """A run's steps as they happen, and the recall ids that fed it; :meth:`trace` is the
    trace to report (see :class:`forge.learn.trace.Trace`)."""

    task: str = ""
    kind: str = ""
    steps: list[dict[str, Any]] = field(default_factory=list)
    answer: str = ""
    recall_ids: list[str] = field(default_factory=list)

    def message(self, role: str, content: Any) -> None:
        if _clip(content).strip():
            self.steps.append({"type": "message", "role": _clip(role, MAX_FIELD_CHARS), "content": _clip(content)})
            if role in ("user", "human") and not self.task:
                self.task = _clip(content)

    def tool(self, name: str, args: Any = None, *, error: Any = "") -> None:
        self.steps.append({"type": "tool", "tool": _clip(name, MAX_FIELD_CHARS) or "tool", "args": _json(args), "error": _clip(error)})

    def observation(self, content: Any, *, tool: str = "", error: Any = "") -> None:
        """What a tool (or the world) answered; ``error`` marks the call before it failed, if it is that tool's."""
        if error and self.steps and self.steps[-1]["type"] == "tool" and self.steps[-1]["tool"] == tool and not self.steps[-1]["error"]:
            self.steps[-1]["error"] = _clip(error)
        self.steps.append({"type": "observation", "tool": _clip(tool, MAX_FIELD_CHARS), "content": _clip(content), "error": _clip(error)})

    def finish(self, answer: Any) -> None:
        """The run's final answer (a later one replaces it)."""
        self.answer = _clip(answer)

    def recalled(self, recall_id: str) -> None:
        """A recall that fed this run: its outcome credits what that recall showed."""
        if recall_id and recall_id not in self.recall_ids:
            self.recall_ids.append(recall_id)

    def reset(self, task: str = "") -> None:
        self.task, self.steps, self.answer, self.recall_ids = task, [], "", []

    def trace(self) -> dict[str, Any]:
        """The trace as ``POST /v1/learn`` takes it (validated by :class:`Trace` when sent)."""
        steps = list(self.steps)
        if self.answer:
            steps.append({"type": "answer", "content": self.answer})
        if len(steps) > MAX_TRACE_STEPS:
            left = len(steps) - MAX_TRACE_STEPS + 1
            steps = [*steps[:_HEAD], {"type": "observation", "content": f"({left} steps left out)"}, *steps[-(MAX_TRACE_STEPS - _HEAD - 1):]]
        task = self.task or next((s["content"] for s in steps if s.get("content")), "") or "(no task text)"
        return {"task": task, "kind": _clip(self.kind, MAX_FIELD_CHARS), "steps": steps, "answer": self.answer,
                "recall_ids": list(self.recall_ids)}


def _is_async(memory: ForgeMemory) -> bool:
    from forge.client import AsyncClient

    return isinstance(memory, AsyncClient)


def _is_remote(memory: ForgeMemory) -> bool:
    from forge.client import AsyncClient, Client

    return isinstance(memory, Client | AsyncClient)


def report(memory: ForgeMemory, trace: Mapping[str, Any], *, success: bool | None = None, score: float | None = None, feedback: str = "",
           agent: str = "", wait: bool = False, timeout: float = 120.0) -> dict[str, Any]:
    """Send ``trace`` and its outcome to ``memory``'s learning entry; what came back, as a dict.

    Over a :class:`~forge.client.Client`: the queued job (``job_id``, ``status``, ``url``), or
    with ``wait`` the finished job (its ``result`` says what was learned, credited and shared).
    Over a :class:`forge.Memory`: what :meth:`~forge.Memory.learn` learned, as ``agent``.
    """
    outcome = Outcome(success=success, score=score, feedback=feedback)
    if _is_async(memory):
        raise ConfigError("this memory is an AsyncClient: use areport (or the adapter's async method)")
    if _is_remote(memory):
        return memory.learn(Trace.from_dict(trace), outcome, wait=wait, timeout=timeout)
    if not agent:
        raise ValidationError("learning into a Memory needs the agent that did the task: agent=...")
    return memory.learn(Trace.from_dict(trace), outcome, agent=agent).to_dict()


async def areport(memory: ForgeMemory, trace: Mapping[str, Any], *, success: bool | None = None, score: float | None = None,
                  feedback: str = "", agent: str = "", wait: bool = False, timeout: float = 120.0) -> dict[str, Any]:
    """:func:`report` for async code: awaited over an AsyncClient, in a worker thread otherwise."""
    if _is_async(memory):
        outcome = Outcome(success=success, score=score, feedback=feedback)
        return await memory.learn(Trace.from_dict(trace), outcome, wait=wait, timeout=timeout)
    return await asyncio.to_thread(report, memory, trace, success=success, score=score, feedback=feedback, agent=agent, wait=wait,
                                   timeout=timeout)


class Reporting:
    """What every adapter's run recorder offers on top of its framework's callbacks: name the
    recalls that fed the run, read the recorded trace, and report it with its outcome."""

    recorder: TraceRecorder

    def recalled(self, recall_id: str) -> None:
        """A recall that fed this run (a context answer's ``recall_id``): the outcome credits what it showed."""
        self.recorder.recalled(recall_id)

    def trace(self) -> dict[str, Any]:
        return self.recorder.trace()

    def report(self, memory: ForgeMemory, *, success: bool | None = None, score: float | None = None, feedback: str = "",
               agent: str = "", wait: bool = False) -> dict[str, Any]:
        """Send the recorded run and its outcome to ``memory``'s learning entry (a Client's job,
        or what a Memory learned, as ``agent``)."""
        return report(memory, self.trace(), success=success, score=score, feedback=feedback, agent=agent, wait=wait)

    async def areport(self, memory: ForgeMemory, *, success: bool | None = None, score: float | None = None,
                      feedback: str = "", agent: str = "", wait: bool = False) -> dict[str, Any]:
        return await areport(memory, self.trace(), success=success, score=score, feedback=feedback, agent=agent, wait=wait)

