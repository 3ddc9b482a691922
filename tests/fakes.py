"""Test doubles shared by several test modules."""

from __future__ import annotations

import inspect


class Clock:
    """A clock the test sets by hand (``clock.t = ...``), so nothing depends on real time."""

    def __init__(self, t: float = 1_000_000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def mismatches(obj: object, protocol: type) -> list[str]:
    """How ``obj`` differs from ``protocol``'s methods: one missing, or one whose parameters
    (names, kinds, defaults) are not the protocol's. ``isinstance`` against a runtime-checkable
    protocol checks only that the names exist, so it cannot catch a wrong signature."""
    out = []
    for name, member in vars(protocol).items():
        if name.startswith("_") or not callable(member):
            continue
        got = getattr(obj, name, None)
        if not callable(got):
            out.append(f"{name}: missing")
            continue
        want = [(p.name, p.kind, p.default) for p in list(inspect.signature(member).parameters.values())[1:]]
        have = [(p.name, p.kind, p.default) for p in inspect.signature(got).parameters.values()]
        if want != have:
            out.append(f"{name}{inspect.signature(got)} is not {name}{inspect.signature(member)}")
    return out
