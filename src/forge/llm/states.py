"""Saved llama.cpp states of evaluated prompt prefixes, so a static prefix is evaluated once.

llama.cpp keeps only the KV cache of the *last* prompt: a prompt from another role, a
reflection, another episode's memory block or a fresh :class:`~forge.llm.local.LlamaCppLLM`
in the same process all throw the static part of an agent's prompt (role, task, option list)
away, and on two cores re-reading it costs ~12 ms a token. :class:`PrefixStates` keeps the
sequence state (the KV cells) of prefixes that were evaluated, keyed by their tokens, so the
next prompt that starts with one is restored in milliseconds instead. A prompt that shares
only part of a saved prefix (the same system prompt, a new memory block) restores that part
and evaluates the rest.

Pure bookkeeping, no llama.cpp import: the backend hands in bytes and gets them back. Memory
is bounded in bytes and entries, least recently used first out. Measured: a state costs
~29 KB a token for Qwen2.5-Coder-1.5B (13 MB at 450 tokens, 57 MB at 2,000) and ~23 KB for
SmolLM2-135M, hence the 256 MiB default.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["SHARED_STATES", "PrefixStates", "PrefixStats", "common_prefix"]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences.

    A binary search over slice comparisons (done in C), so two 2,000-token prompts compare
    in microseconds rather than a Python loop's milliseconds.
    """
    n = min(len(a), len(b))
    if n == 0:
        return 0
    ta, tb = tuple(a[:n]), tuple(b[:n])
    if ta == tb:
        return n
    lo, hi = 0, n  # ta[:lo] == tb[:lo] and ta[:hi] != tb[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if ta[:mid] == tb[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(slots=True)
class PrefixStats:
    """What happened to the static prefix of each request one LLM served.

    ``kv``: still in llama.cpp's KV cache; ``restored``: restored whole from a saved state;
    ``partial``: a saved state covered part of it, the rest was evaluated; ``evaluated``:
    nothing reusable. ``hits`` are requests that evaluated none of their static prefix.
    ``saved_bytes``, ``save_ms`` and ``restore_ms`` total what keeping states cost.
    """

    requests: int = 0
    kv: int = 0
    restored: int = 0
    partial: int = 0
    evaluated: int = 0
    saved: int = 0
    reused_tokens: int = 0
    evaluated_tokens: int = 0
    saved_bytes: int = 0
    save_ms: float = 0.0
    restore_ms: float = 0.0

    @property
    def hits(self) -> int:
        return self.kv + self.restored

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.requests if self.requests else None

    def count(self, kind: str, *, reused: int, evaluated: int) -> None:
        self.requests += 1
        setattr(self, kind, getattr(self, kind) + 1)
        self.reused_tokens += reused
        self.evaluated_tokens += evaluated

    def to_dict(self) -> dict[str, float | int | None]:
        return {**asdict(self), "hits": self.hits, "hit_rate": self.hit_rate}


class PrefixStates:
    """A least-recently-used store of prefix states, bounded by bytes and entry count.

    Keys are ``(model, tokens)``: a state only fits the model file it came from. Thread-safe;
    one instance may serve every backend of a process (:data:`SHARED_STATES`). A state larger
    than ``max_bytes`` is refused; ``max_bytes=0`` keeps nothing.
    """

    def __init__(self, *, max_bytes: int = 256 << 20, max_entries: int = 16) -> None:
        self.max_bytes = max(0, int(max_bytes))
        self.max_entries = max(0, int(max_entries))
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple[str, tuple[int, ...]], bytes] = OrderedDict()
        self._bytes = 0
        self.evictions = 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    @property
    def nbytes(self) -> int:
        with self._lock:
            return self._bytes

    def best(self, model: str, tokens: Sequence[int]) -> tuple[int, tuple[int, ...], bytes] | None:
        """The saved state sharing the longest prefix with ``tokens``, as ``(shared, saved
        tokens, state)``, marked as recently used; ``None`` when none shares a token."""
        with self._lock:
            found: tuple[int, tuple[int, ...], bytes] | None = None
            key_found: tuple[str, tuple[int, ...]] | None = None
            for key, data in self._entries.items():
                if key[0] != model:
                    continue
                shared = common_prefix(key[1], tokens)
                if shared and (found is None or shared > found[0]):
                    found, key_found = (shared, key[1], data), key
            if key_found is not None:
                self._entries.move_to_end(key_found)
            return found

    def put(self, model: str, tokens: Sequence[int], data: bytes) -> bool:
        """Keep ``data`` as the state after ``tokens``; evicts the least recently used until
        within bounds. Returns False (keeping nothing) for a state above ``max_bytes``."""
        size = len(data)
        if size > self.max_bytes or self.max_entries == 0:
            return False
        key = (model, tuple(tokens))
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            while self._entries and (
                self._bytes + size > self.max_bytes or len(self._entries) >= self.max_entries
            ):
                _, dropped = self._entries.popitem(last=False)
                self._bytes -= len(dropped)
                self.evictions += 1
            self._entries[key] = data
            self._bytes += size
        return True

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def __repr__(self) -> str:
        return f"PrefixStates(entries={len(self)}, bytes={self.nbytes}, max_bytes={self.max_bytes})"


#: The process-wide store every :class:`~forge.llm.local.LlamaCppLLM` uses unless given one:
#: a new instance of the same model starts from the prefixes an earlier one evaluated.
SHARED_STATES = PrefixStates()
