"""Rerankers for :func:`forge.engine.recall.recall`'s ``rerank`` hook.

Fusion ranks by agreement between cheap signals; a reranker reads the query and each
candidate together. ``LLMReranker`` asks any LLM backend for a 0-10 relevance grade per
candidate (one call for the whole list) and blends it with the fused score, so a model that
answers badly can only reorder, never drop, what recall found.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from forge.engine.recall import Recalled
from forge.errors import LLMError
from forge.llm.base import LLM, Message
from forge.llm.structured import complete_json

__all__ = ["LLMReranker"]

_SYSTEM = (
    "You grade how useful each memory is for answering the query. "
    "Answer with JSON: {\"scores\": [one integer 0-10 per memory, in order]}."
)


class LLMReranker:
    """Grade the top ``top_n`` candidates with an LLM; blend ``weight`` of the grade in."""

    def __init__(self, llm: LLM, *, top_n: int = 10, weight: float = 0.5) -> None:
        self.llm = llm
        self.top_n = top_n
        self.weight = weight

    def __call__(self, query: str, results: Sequence[Recalled]) -> list[Recalled]:
        head, tail = list(results[: self.top_n]), list(results[self.top_n :])
        if len(head) < 2:
            return list(results)
        listing = "\n".join(f"{i}. {r.unit.content[:400]}" for i, r in enumerate(head, 1))
        schema = {
            "type": "object",
            "properties": {
                "scores": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 10},
                           "minItems": len(head), "maxItems": len(head)}
            },
            "required": ["scores"],
        }
        try:
            answer = complete_json(
                self.llm,
                [Message("system", _SYSTEM), Message("user", f"Query: {query}\n\nMemories:\n{listing}")],
                schema=schema,
                max_tokens=16 + 4 * len(head),
            )
            grades = [min(max(float(s), 0.0), 10.0) / 10.0 for s in answer["scores"]][: len(head)]
        except (LLMError, KeyError, TypeError, ValueError):
            return list(results)  # an unusable grading leaves the fused order alone
        if len(grades) != len(head):
            return list(results)
        top = max(r.score for r in head) or 1.0
        rescored = [
            replace(r, score=(1 - self.weight) * r.score / top + self.weight * g, why={**r.why, "rerank": g})
            for r, g in zip(head, grades, strict=True)
        ]
        rescored.sort(key=lambda r: r.score, reverse=True)
        floor = min(r.score for r in rescored)
        return rescored + [replace(r, score=min(r.score, floor)) for r in tail]
