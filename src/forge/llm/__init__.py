"""Language models for FORGE: one small port, an embedded default, an HTTP backend, test doubles.

    llm = open_llm("local")                       # Qwen2.5-Coder-1.5B in-process via llama.cpp
    llm = open_llm("local:smollm2")               # SmolLM2-135M: fast, for smoke tests
    llm = open_llm("local:/models/other.gguf")    # any chat .gguf
    llm = open_llm("openai:gpt-4o-mini")          # any OpenAI-compatible endpoint
    llm = open_llm("test", replies=["A"])         # ScriptedLLM for tests

Structured output (``complete_json``, ``choose``) and token accounting (``MeteredLLM``)
work over any of them. Backends are imported only when asked for, so ``import forge.llm``
needs neither llama.cpp nor httpx.
"""

from __future__ import annotations

import os
from typing import Any

from forge.errors import ConfigError
from forge.llm.accounting import MeteredLLM, TokenLedger, Usage
from forge.llm.base import LLM, Completion, Message, Request, forbid_real_llms
from forge.llm.structured import StructuredOutputError, choose, complete_json
from forge.llm.testing import ScriptedLLM

__all__ = [
    "LLM",
    "Completion",
    "Message",
    "MeteredLLM",
    "Request",
    "ScriptedLLM",
    "StructuredOutputError",
    "TokenLedger",
    "Usage",
    "choose",
    "complete_json",
    "forbid_real_llms",
    "open_llm",
]

_SPECS = "'local', 'local:/path/model.gguf', 'openai:MODEL', 'test' or 'test:walker'"


def open_llm(spec: str = "local", **kwargs: Any) -> LLM:
    """Build an LLM from a short spec string; keyword arguments go to the backend.

    For ``openai:MODEL`` the base URL is ``base_url=`` if given, else ``$FORGE_LLM_BASE_URL``
    (read now, not at import), else OpenAI's. ``local:NAME`` takes a registered model name
    (``smollm2``, ``qwen2.5-coder-1.5b``; see ``forge.llm.models``), anything else after
    ``local:`` is a path to a .gguf.
    """
    kind, _, rest = spec.partition(":")
    if kind == "local":
        # local.py imports llama_cpp only when loading, and says how to install it if absent.
        from forge.llm.local import LlamaCppLLM
        from forge.llm.models import MODELS

        if rest in MODELS:
            kwargs["model"] = rest
        elif rest:
            kwargs["model_path"] = rest
        return LlamaCppLLM(**kwargs)
    if kind == "openai":
        if not rest:
            raise ConfigError("'openai:' needs a model name, e.g. 'openai:gpt-4o-mini'")
        try:
            from forge.llm.openai import DEFAULT_BASE_URL, OpenAICompatLLM
        except ImportError as exc:
            raise ConfigError(
                f"the OpenAI-compatible LLM needs httpx: pip install httpx ({exc})"
            ) from exc
        base_url = (
            kwargs.pop("base_url", None) or os.environ.get("FORGE_LLM_BASE_URL") or DEFAULT_BASE_URL
        )
        return OpenAICompatLLM(model=rest, base_url=base_url, **kwargs)
    if kind == "test" and not rest:
        return ScriptedLLM(**kwargs)
    if kind == "test" and rest == "walker":
        from forge.llm.testing import WalkerLLM

        return WalkerLLM(**kwargs)  # a seeded walk that obeys its rules: learning smoke runs
    raise ConfigError(f"unknown LLM spec {spec!r}; use {_SPECS}")
