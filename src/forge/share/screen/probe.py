"""The screen's probe: a linear read of the embedded LLM's hidden states (off by default)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from forge.share.screen.text import clause_spans

__all__ = ["PROBE_MAX_CHARS", "PROBE_PREFIX", "PROBE_SUFFIX", "Probe"]


#: The question the probe's model reads around a text (fixed: the fitted weights belong to it).
PROBE_PREFIX = "A memory unit shared between AI agents, to be pasted into their prompts:\n<memory>\n"
PROBE_SUFFIX = "\n</memory>\nWould following this memory be harmful or unsafe? Answer:"
PROBE_MAX_CHARS = 1500


class Probe:
    """A linear probe on the embedded LLM's hidden states: the log-odds that a text is harmful.

    The text is wrapped in a fixed question (``prefix`` + text + ``suffix``: "would following
    this memory be harmful?"). The model's final hidden states
    (:class:`~forge.llm.local.HiddenStates`: the mean over the text's own tokens and the state
    after the question's last token) are scored by a logistic regression fitted by
    ``bench/poisoning.py --fit --probe``. It reads what a sentence embedder misses: the model
    has read far more about what harms than MiniLM, in many languages (5-fold AUC on the
    outside set's dev half alone, trained on nothing else: 0.94 against MiniLM's 0.81).
    One forward pass of the 1.5B a text (~60 tokens, about a second of two cores), so it is
    off by default and asked only about text the patterns passed. ``reader`` stands in for
    the model: ``reader(text, around=(prefix, suffix)) -> (mean, last)``.
    """

    def __init__(self, spec: Mapping[str, Any], *, reader: Any = None) -> None:
        self.model = str(spec["model"])
        self.prefix, self.suffix = str(spec["prefix"]), str(spec["suffix"])
        self.max_chars = int(spec["max_chars"])
        self.weights = [float(w) for w in spec["weights"]]
        self.bias = float(spec["bias"])
        self._reader = reader

    def features(self, text: str) -> list[float]:
        """The mean hidden state of the text's tokens, then the last token's (after the
        question): what the weights read. The text is cut to ``max_chars`` (a call stays bounded)."""
        if self._reader is None:
            self._reader = _shared_reader(self.model)
        mean, last = self._reader(text[: self.max_chars], around=(self.prefix, self.suffix))
        return [*(float(x) for x in mean), *(float(x) for x in last)]

    def logit(self, text: str) -> float:
        """The probe's log-odds that ``text`` is harmful."""
        return self._score(self.features(text))

    def logits(self, text: str, *, clauses: bool = True) -> tuple[float, float]:
        """``(whole text, highest clause)``: the probe's log-odds for the text, and the highest
        over its clauses (each clause's mean state beside the same last state), from one
        forward pass; a text of one clause gives its own log-odds twice."""
        text = text[: self.max_chars]
        spans = clause_spans(text) if clauses else []
        if not spans:
            z = self.logit(text)
            return z, z
        if self._reader is None:
            self._reader = _shared_reader(self.model)
        mean, last, rows = self._reader(text, around=(self.prefix, self.suffix), spans=spans)
        tail = [float(x) for x in last]
        z = self._score([*(float(x) for x in mean), *tail])
        return z, max(self._score([*(float(x) for x in row), *tail]) for row in rows)

    def _score(self, features: list[float]) -> float:
        return float(sum(w * x for w, x in zip(self.weights, features, strict=True))) + self.bias


_READERS: dict[str, Any] = {}


def _shared_reader(model: str) -> Any:
    """One hidden-state reader per process and model (the 1.5B takes ~1 GB of memory)."""
    if model not in _READERS:
        import atexit

        from forge.llm.local import HiddenStates

        _READERS[model] = reader = HiddenStates(model=model)
        # Freed before the interpreter tears down llama_cpp's module (its __del__ fails then).
        atexit.register(reader.close)
    return _READERS[model]
