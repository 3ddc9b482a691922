"""Progress of a run: a rich live panel on a terminal, a callback for programs, or nothing.

The protocol reports ``(event, data)`` pairs (stage_started, attempt_done, instance_done,
stage_done, eval_started, eval_done); a sink turns them into whatever the caller wants. The
rich display only appears when stdout is a terminal, so logs and CI output stay clean.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from typing import Any

from forge.protocols.config import ForgeConfig

__all__ = ["CallbackSink", "NullSink", "ProgressSink", "RichSink", "make_sink"]


class NullSink:
    """Ignores everything."""

    def __call__(self, event: str, data: Mapping[str, Any]) -> None:
        return None

    def __enter__(self) -> NullSink:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


ProgressSink = NullSink  # the protocol every sink follows: callable + context manager


class CallbackSink(NullSink):
    """Passes every event to a function, e.g. a test recorder or a GUI."""

    def __init__(self, fn: Callable[[str, Mapping[str, Any]], None]) -> None:
        self.fn = fn

    def __call__(self, event: str, data: Mapping[str, Any]) -> None:
        self.fn(event, data)


class RichSink(NullSink):
    """A live panel: stage, instances done, last attempt, returns so far, tokens."""

    def __init__(self, config: ForgeConfig) -> None:
        from rich.console import Console

        self.config = config
        self.console = Console(stderr=False)
        self.state: dict[str, Any] = {"stage": 0, "done": 0, "active": config.instances, "returns": {}, "tokens": 0, "attempt": "", "phase": "train", "graduated": 0}
        self._live: Any = None

    def _render(self) -> Any:
        from rich.table import Table

        s = self.state
        table = Table(title=f"FORGE {self.config.condition} on {self.config.env} ({self.config.representation})", show_header=False)
        table.add_row("stage", f"{s['stage'] + 1}/{self.config.stages}" if s["phase"] == "train" else "final evaluation")
        table.add_row("instances done", f"{s['done']}/{s['active']}")
        table.add_row("last attempt", s["attempt"] or "-")
        rets = s["returns"]
        table.add_row("checkpoint returns", " ".join(f"{i}:{r:g}" for i, r in sorted(rets.items())) or "-")
        table.add_row("graduated", str(s["graduated"]))
        table.add_row("tokens", f"{s['tokens']:,}")
        return table

    def __enter__(self) -> RichSink:
        from rich.live import Live

        self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._live is not None:
            self._live.__exit__(None, None, None)
            self._live = None

    def __call__(self, event: str, data: Mapping[str, Any]) -> None:
        s = self.state
        if event == "stage_started":
            s.update(stage=data["stage"], done=0, active=data["active"], returns={}, phase="train")
        elif event == "attempt_done":
            s["attempt"] = f"inst {data['instance']} attempt {data['attempt'] + 1}: return {data['return']:g}" + (" (aborted)" if data.get("aborted") else "")
        elif event == "instance_done":
            s["done"] += 1
            s["returns"][data["instance"]] = data["checkpoint_return"]
            s["tokens"] = data.get("tokens", s["tokens"])
        elif event == "stage_done":
            s["graduated"] = data.get("graduated_total", 0)
            s["tokens"] = data.get("tokens", s["tokens"])
        elif event == "eval_started":
            s.update(phase="eval", done=0, active=data["pending"], returns={})
        elif event == "eval_done":
            s["done"] += 1
            rets = data["returns"]
            s["returns"][data["instance"]] = sum(rets) / len(rets) if rets else 0.0
        if self._live is not None:
            self._live.update(self._render())


def make_sink(progress: Any, config: ForgeConfig) -> NullSink:
    """None/False: nothing; True: rich display when stdout is a terminal; a callable: called."""
    if progress is None or progress is False:
        return NullSink()
    if progress is True:
        return RichSink(config) if sys.stdout.isatty() else NullSink()
    if isinstance(progress, NullSink):
        return progress
    if callable(progress):
        return CallbackSink(progress)
    return NullSink()
