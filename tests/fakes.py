"""Test doubles shared by several test modules."""

from __future__ import annotations


class Clock:
    """A clock the test sets by hand (``clock.t = ...``), so nothing depends on real time."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t
