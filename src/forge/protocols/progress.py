"""Progress of a run: a rich live panel on a terminal, lines in a log, a callback for programs.

The protocol reports ``(event, data)`` pairs (stage_started, attempt_done, instance_done,
stage_done, eval_started, eval_done); a sink turns them into whatever the caller wants. The
rich panel appears when stdout is a terminal; otherwise (a pipe, a file, CI) :class:`LineSink`
writes a line on standard error per instance, stage and evaluation, with the time elapsed and
an estimate of the time left. :class:`Lines` does the same for any counted work (an import, a
curation pass, a team's task stream). Both stay silent through work shorter than their
``after`` seconds, so quick commands and tests print nothing.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any, TextIO

from forge.protocols.config import ForgeConfig

__all__ = ["CallbackSink", "LineSink", "Lines", "NullSink", "ProgressSink", "RichSink", "duration", "make_sink"]

#: Seconds of silence before the first progress line, and the least between two lines.
QUIET_S = 10.0


def duration(seconds: float) -> str:
    """``seconds`` for a reader: 42s, 3m05s, 1h02m."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


class Lines:
    """One line at a time on a stream, for work whose total is known (or not): what was done,
    the time elapsed and, once something is done, the time left at the pace so far.

    Nothing is written before ``after`` seconds, and then at most one line per ``every``
    seconds unless ``force``d (a stage boundary), so a log gets a steady trickle, not a flood.
    """

    def __init__(self, stream: TextIO | None = None, *, after: float | None = None, every: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.after = QUIET_S if after is None else after
        self.every = QUIET_S if every is None else every
        self.clock = clock
        self.started = self.base = clock()
        self.last: float | None = None
        self._lock = threading.Lock()

    def mark(self) -> None:
        """Estimate the time left from here on (a new phase of the work, at its own pace)."""
        self.base = self.clock()

    def timing(self, done: float, total: float | None) -> str:
        """"1m40s elapsed, about 3m20s left": elapsed since the start, the estimate at the pace
        since :meth:`mark` (none before anything is done)."""
        now = self.clock()
        text = f"{duration(now - self.started)} elapsed"
        if total is not None and done > 0:
            text += f", about {duration((now - self.base) * max(total - done, 0) / done)} left"
        return text

    def due(self) -> bool:
        """Whether a line written now would be shown (past the quiet start and the interval)."""
        now = self.clock()
        return now - self.started >= self.after and (self.last is None or now - self.last >= self.every)

    def write(self, text: str, *, force: bool = False) -> bool:
        """Write ``text`` as one line if it is time to; whether it was written."""
        with self._lock:
            now = self.clock()
            if now - self.started < self.after:
                return False
            if not force and self.last is not None and now - self.last < self.every:
                return False
            stream = self.stream if self.stream is not None else sys.stderr
            print(text, file=stream, flush=True)
            self.last = now
            return True

    def count(self, what: str, done: int, total: int | None, *, force: bool = False) -> bool:
        """A line for counted work: "embedding units: 640/1,500 (43%) | 12s elapsed, about 16s left"."""
        shown = f"{done:,}/{total:,} ({done / total:.0%})" if total else f"{done:,}" if done else "working"
        return self.write(f"{what}: {shown} | {self.timing(done, total)}", force=force)


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


class LineSink(NullSink):
    """A run's progress as lines on standard error, where no live panel can be drawn (a pipe,
    a file, CI): one per instance trained in a stage, per stage, and per instance evaluated
    (and, at most one per ``every`` seconds, per episode between them), each with the time
    elapsed and an estimate of the time left.

    The estimate counts episodes: a training stage plays up to ``attempts`` (when the
    condition learns) + 1 (the greedy checkpoint) per active instance, the evaluation
    ``eval_episodes`` per instance; the time per episode played so far, times the episodes
    still planned. Graduation and early wins only shorten it (an upper bound).
    """

    def __init__(self, config: ForgeConfig, stream: TextIO | None = None, *, after: float | None = None,
                 every: float | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.lines = Lines(stream, after=after, every=every, clock=clock)
        self.name = f"{config.condition} on {config.env}"
        self.per_stage = (config.attempts if config.flags.learning else 0) + 1
        self.done = 0.0
        self.left_train = float(config.stages * config.instances * self.per_stage)
        self.left_eval = float(config.instances * config.eval_episodes)
        self.stage, self.finished = 0, 0
        self.active = self.pending = config.instances
        self.seen: dict[int, int] = {}  # episodes already counted for an instance's stage or evaluation

    def _say(self, what: str, *, force: bool = False) -> None:
        self.lines.write(f"[{self.name}] {what} | {self.lines.timing(self.done, self.done + self.left_train + self.left_eval)}", force=force)

    def _played(self, instance: int, episodes: int, planned: int, phase: str) -> None:
        """Count an instance's episodes: ``episodes`` played in all, of ``planned``."""
        before = self.seen.pop(instance, 0)
        self.done += max(episodes - before, 0)
        left = max(planned - before, 0)
        if phase == "train":
            self.left_train = max(self.left_train - left, 0.0)
        else:
            self.left_eval = max(self.left_eval - left, 0.0)

    def _episode(self, instance: int, phase: str) -> None:
        self.seen[instance] = self.seen.get(instance, 0) + 1
        self.done += 1
        if phase == "train":
            self.left_train = max(self.left_train - 1, 0.0)
        else:
            self.left_eval = max(self.left_eval - 1, 0.0)

    def __call__(self, event: str, data: Mapping[str, Any]) -> None:
        cfg = self.config
        if event == "stage_started":
            self.stage, self.finished, self.seen = int(data["stage"]), 0, {}
            self.active = int(data["active"])
            self.left_train = float((cfg.stages - self.stage) * self.active * self.per_stage)
        elif event == "attempt_done":
            self._episode(int(data["instance"]), "train")
            self._say(f"stage {self.stage + 1}/{cfg.stages}: instance {data['instance']} attempt {int(data['attempt']) + 1} returned {data['return']:g}")
        elif event == "instance_done":
            self.finished += 1
            self._played(int(data["instance"]), int(data.get("attempts", 0)) + 1, self.per_stage, "train")
            self._say(f"stage {self.stage + 1}/{cfg.stages}: instance {data['instance']} done "
                      f"({self.finished}/{self.active}), checkpoint return {data['checkpoint_return']:g}")
        elif event == "stage_done":
            self._say(f"stage {self.stage + 1}/{cfg.stages} done, {data.get('graduated_total', 0)} graduated", force=True)
        elif event == "eval_started":
            self.left_train, self.finished, self.pending, self.seen = 0.0, 0, int(data["pending"]), {}
            self.left_eval = float(self.pending * cfg.eval_episodes)
            self._say(f"final evaluation of {self.pending} instance(s), {cfg.eval_episodes} episodes each", force=True)
        elif event == "eval_episode_done":
            self._episode(int(data["instance"]), "eval")
            self._say(f"evaluating instance {data['instance']}: episode {int(data['episode']) + 1}/{cfg.eval_episodes} returned {data['return']:g}")
        elif event == "eval_done":
            self.finished += 1
            self._played(int(data["instance"]), cfg.eval_episodes, cfg.eval_episodes, "eval")
            rets = data.get("returns") or []
            mean = sum(rets) / len(rets) if rets else 0.0
            self._say(f"evaluated instance {data['instance']} ({self.finished}/{self.pending}), mean return {mean:+.2f}",
                      force=self.finished == self.pending)


def make_sink(progress: Any, config: ForgeConfig) -> NullSink:
    """None/False: nothing; True: the rich panel when stdout is a terminal, else lines on
    standard error (:class:`LineSink`); a sink or a callable: that."""
    if progress is None or progress is False:
        return NullSink()
    if progress is True:
        return RichSink(config) if sys.stdout.isatty() else LineSink(config)
    if isinstance(progress, NullSink):
        return progress
    if callable(progress):
        return CallbackSink(progress)
    return NullSink()
