"""Token accounting: who spent how many tokens, tagged however the caller likes.

Experiments compare conditions by cost as well as by score, so every call is recorded with
free-form tags (role, instance, stage, condition...). ``MeteredLLM`` adds the recording by
wrapping any backend, so nothing else has to know that accounting exists. Ledgers from
worker processes travel as ``to_dict()`` and are combined with ``merge``.

Backends that reuse evaluated prompt prefixes say so in each completion's meta (the embedded
llama.cpp backend: ``prefix`` and ``cached_tokens``), and the ledger keeps those beside the
tokens: ``cached_tokens`` (prompt tokens not evaluated again) and ``prefix_hits`` /
``prefix_misses`` (calls whose static prefix came from the KV cache or a saved state, against
those that evaluated some of it), so a run reports its cache hit rate with its cost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from forge.errors import ValidationError
from forge.llm.base import LLM, Completion, Request

__all__ = ["MeteredLLM", "TokenLedger", "Usage"]

TagKey = tuple[tuple[str, Hashable], ...]


@dataclass(slots=True)
class Usage:
    """Totals for one group of calls."""

    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    seconds: float = 0.0
    errors: int = 0
    cached_tokens: int = 0
    prefix_hits: int = 0
    prefix_misses: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @property
    def prefix_hit_rate(self) -> float | None:
        """Share of the calls that reported on their prefix whose static prefix was reused."""
        seen = self.prefix_hits + self.prefix_misses
        return self.prefix_hits / seen if seen else None

    def add(self, other: Usage) -> None:
        self.calls += other.calls
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.seconds += other.seconds
        self.errors += other.errors
        self.cached_tokens += other.cached_tokens
        self.prefix_hits += other.prefix_hits
        self.prefix_misses += other.prefix_misses

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_tokens": self.total_tokens, "prefix_hit_rate": self.prefix_hit_rate}


class TokenLedger:
    """Thread-safe totals of LLM usage per distinct tag set.

    Only aggregates are kept (one :class:`Usage` per tag combination), so a long run costs
    memory in proportion to its distinct tags, not its calls. Tag values should be JSON-friendly
    (str, int, float, bool, None) so the ledger survives ``to_dict``/``from_dict``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._groups: dict[TagKey, Usage] = {}

    def record(
        self,
        *,
        prompt_tokens: int,
        completion_tokens: int,
        seconds: float = 0.0,
        error: bool = False,
        tags: Mapping[str, Hashable] | None = None,
        cached_tokens: int = 0,
        prefix_hit: bool | None = None,
    ) -> None:
        """Add one call under ``tags``; ``prefix_hit`` is None when the backend did not say."""
        usage = Usage(
            1, prompt_tokens, completion_tokens, seconds, int(error), cached_tokens,
            int(prefix_hit is True), int(prefix_hit is False),
        )
        self._add(_key(tags or {}), usage)

    def _add(self, key: TagKey, usage: Usage) -> None:
        with self._lock:
            self._groups.setdefault(key, Usage()).add(usage)

    def total(self, **where: Hashable) -> Usage:
        """Totals over every call whose tags include all of ``where``."""
        out = Usage()
        for key, usage in self._snapshot():
            tags = dict(key)
            if all(k in tags and tags[k] == v for k, v in where.items()):
                out.add(usage)
        return out

    def by(self, *tags: str, **where: Hashable) -> dict[Any, Usage]:
        """Totals grouped by the values of ``tags`` (calls lacking a tag group under None).

        One tag gives ``{value: Usage}``; several give ``{(v1, v2): Usage}``. ``where``
        filters first, e.g. ``by("role", condition="forge")``.
        """
        if not tags:
            raise ValidationError("by() needs at least one tag name, e.g. by('role')")
        out: dict[Any, Usage] = {}
        for key, usage in self._snapshot():
            have = dict(key)
            if not all(k in have and have[k] == v for k, v in where.items()):
                continue
            values = tuple(have.get(t) for t in tags)
            group = values[0] if len(tags) == 1 else values
            out.setdefault(group, Usage()).add(usage)
        return out

    def _snapshot(self) -> list[tuple[TagKey, Usage]]:
        with self._lock:
            return [(k, Usage(**asdict(v))) for k, v in self._groups.items()]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready picture: every tag group, and the grand total."""
        return {
            "groups": [{"tags": dict(k), **u.to_dict()} for k, u in self._snapshot()],
            "total": self.total().to_dict(),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TokenLedger:
        ledger = cls()
        ledger.merge(data)
        return ledger

    def merge(self, other: TokenLedger | Mapping[str, Any]) -> TokenLedger:
        """Add another ledger's totals (or its ``to_dict()``) into this one; returns self."""
        if isinstance(other, TokenLedger):
            groups: Iterable[tuple[TagKey, Usage]] = other._snapshot()
        else:
            try:
                groups = [
                    (
                        _key(g.get("tags", {})),
                        Usage(
                            int(g.get("calls", 0)),
                            int(g.get("prompt_tokens", 0)),
                            int(g.get("completion_tokens", 0)),
                            float(g.get("seconds", 0.0)),
                            int(g.get("errors", 0)),
                            int(g.get("cached_tokens", 0)),
                            int(g.get("prefix_hits", 0)),
                            int(g.get("prefix_misses", 0)),
                        ),
                    )
                    for g in other["groups"]
                ]
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise ValidationError(
                    f"cannot merge ledger data ({exc!r}); pass TokenLedger.to_dict() output"
                ) from exc
        for key, usage in groups:
            self._add(key, usage)
        return self

    def __repr__(self) -> str:
        t = self.total()
        return f"TokenLedger(calls={t.calls}, tokens={t.total_tokens})"


#: A completion's ``meta["prefix"]`` (see forge.llm.local) as a hit, a miss, or no answer.
_PREFIX_HIT: dict[Any, bool] = {"kv": True, "restored": True, "partial": False, "evaluated": False}


def _key(tags: Mapping[str, Hashable]) -> TagKey:
    try:
        return tuple(sorted(tags.items()))
    except TypeError as exc:
        raise ValidationError(f"tag names must be strings: {exc}") from exc


class MeteredLLM:
    """An LLM that records every call's tokens and seconds in a :class:`TokenLedger`.

    Failed calls are recorded as errors with zero tokens and re-raised. ``with_tags`` makes
    a sibling with more tags on the same backend and ledger, e.g.
    ``metered.with_tags(role="reflector")``. ``close()`` closes the wrapped backend, which
    siblings share.
    """

    def __init__(self, llm: LLM, ledger: TokenLedger, **tags: Hashable) -> None:
        self.inner = llm
        self.ledger = ledger
        self.tags: dict[str, Hashable] = dict(tags)
        self.name = llm.name
        self.capabilities = llm.capabilities

    def with_tags(self, **more: Hashable) -> MeteredLLM:
        return MeteredLLM(self.inner, self.ledger, **{**self.tags, **more})

    def complete(self, request: Request) -> Completion:
        start = time.perf_counter()
        try:
            completion = self.inner.complete(request)
        except Exception:
            self.ledger.record(
                prompt_tokens=0,
                completion_tokens=0,
                seconds=time.perf_counter() - start,
                error=True,
                tags=self.tags,
            )
            raise
        meta = completion.meta if isinstance(completion.meta, Mapping) else {}
        self.ledger.record(
            prompt_tokens=completion.prompt_tokens,
            completion_tokens=completion.completion_tokens,
            seconds=time.perf_counter() - start,
            tags=self.tags,
            cached_tokens=int(meta.get("cached_tokens") or 0),
            prefix_hit=_PREFIX_HIT.get(meta.get("prefix")),
        )
        return completion

    def count_tokens(self, text: str) -> int:
        return self.inner.count_tokens(text)

    def close(self) -> None:
        self.inner.close()

    def __repr__(self) -> str:
        return f"MeteredLLM({self.inner!r}, tags={self.tags!r})"
