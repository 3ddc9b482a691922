"""Any OpenAI-compatible ``/v1/chat/completions`` endpoint: OpenAI, vLLM, Ollama, llama.cpp server.

Plain httpx, no SDK: the protocol is one POST, and owning it lets us bound retries, map
every failure to :class:`~forge.errors.LLMError` with the URL and status, and keep the API
key out of reprs and messages.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Mapping
from typing import Any

import httpx

from forge.errors import ConfigError, LLMError
from forge.llm.base import Completion, Request, check_real_llm_allowed

__all__ = ["DEFAULT_BASE_URL", "OpenAICompatLLM"]

DEFAULT_BASE_URL = "https://api.openai.com/v1"
_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_MAX_RETRY_AFTER = 30.0


class OpenAICompatLLM:
    """Chat completions over HTTP.

    The key is read once, here, from the environment variable ``api_key_env`` and may be
    absent (local servers need none). 429, 5xx, timeouts and connection errors are retried
    ``max_retries`` times with exponential backoff (``Retry-After`` honoured, capped at 30 s).
    ``json_schema=False`` stops sending ``response_format`` for servers that reject it;
    the structured layer then parses and retries instead. ``transport`` is for tests
    (``httpx.MockTransport``) and proxies.
    """

    def __init__(
        self,
        *,
        model: str,
        base_url: str = DEFAULT_BASE_URL,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 60.0,
        max_retries: int = 3,
        backoff: float = 0.5,
        json_schema: bool = True,
        extra_body: Mapping[str, Any] | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        check_real_llm_allowed(f"OpenAICompatLLM({model!r})")
        if not model:
            raise ConfigError(
                "OpenAICompatLLM needs a model name, e.g. open_llm('openai:gpt-4o-mini')"
            )
        if max_retries < 0 or backoff < 0 or timeout <= 0:
            raise ConfigError("max_retries and backoff must be >= 0 and timeout > 0")
        self.model = model
        self.name = f"openai:{model}"
        self.capabilities = frozenset({"json_schema"}) if json_schema else frozenset()
        self.base_url = base_url.rstrip("/")
        self.url = f"{self.base_url}/chat/completions"
        self.max_retries = max_retries
        self.backoff = backoff
        self.extra_body = dict(extra_body or {})
        headers = {"Content-Type": "application/json"}
        key = os.environ.get(api_key_env) if api_key_env else None
        if key:
            headers["Authorization"] = f"Bearer {key}"
        self._client = httpx.Client(headers=headers, timeout=timeout, transport=transport)

    def count_tokens(self, text: str) -> int:
        """An estimate (about four characters a token): the server's tokenizer is remote."""
        return math.ceil(len(text) / 4) if text else 0

    def complete(self, request: Request) -> Completion:
        body = self._body(request)
        start = time.perf_counter()
        data = self._post(body)
        seconds = time.perf_counter() - start
        try:
            choice = data["choices"][0]
            text = choice["message"]["content"]
        except (KeyError, IndexError, TypeError) as exc:
            raise LLMError(
                f"POST {self.url} returned an unexpected body (no choices[0].message)"
            ) from exc
        if text is None:
            reason = choice.get("finish_reason") or choice["message"].get("refusal") or "no content"
            raise LLMError(f"POST {self.url} returned no text ({reason})")
        usage = data.get("usage") or {}
        prompt = usage.get("prompt_tokens")
        completion = usage.get("completion_tokens")
        estimated = not isinstance(prompt, int) or not isinstance(completion, int)
        if not isinstance(prompt, int) or not isinstance(completion, int):
            prompt = sum(self.count_tokens(m.content) + 4 for m in request.messages)
            completion = self.count_tokens(text)
        return Completion(
            text=text,
            prompt_tokens=prompt,
            completion_tokens=completion,
            model=str(data.get("model") or self.model),
            seconds=seconds,
            meta={"finish_reason": choice.get("finish_reason"), "usage_estimated": estimated},
        )

    def _body(self, request: Request) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "max_tokens": request.max_tokens,
            "temperature": request.temperature,
        }
        if request.stop:
            body["stop"] = list(request.stop)
        if request.seed is not None:
            body["seed"] = request.seed
        if request.json_schema is not None and "json_schema" in self.capabilities:
            body["response_format"] = {
                "type": "json_schema",
                # strict=False: strict mode rejects schemas without additionalProperties=false.
                "json_schema": {
                    "name": "forge_output",
                    "schema": dict(request.json_schema),
                    "strict": False,
                },
            }
        body.update(self.extra_body)
        return body

    def _post(self, body: dict[str, Any]) -> Any:
        attempts = self.max_retries + 1
        problem = ""
        last: httpx.Response | None = None
        for attempt in range(attempts):
            if attempt:
                time.sleep(self._delay(attempt, last))
            last = None
            try:
                last = self._client.post(self.url, json=body)
            except httpx.TransportError as exc:
                problem = f"{type(exc).__name__}: {exc}"
                continue
            except httpx.HTTPError as exc:  # invalid URL and the like: retrying won't help
                raise LLMError(f"POST {self.url} failed: {type(exc).__name__}: {exc}") from exc
            if last.status_code in _RETRY_STATUS:
                problem = f"status {last.status_code}{_detail(last)}"
                continue
            if last.status_code >= 400:
                raise LLMError(f"POST {self.url} returned status {last.status_code}{_detail(last)}")
            try:
                return last.json()
            except ValueError as exc:
                raise LLMError(
                    f"POST {self.url} returned status {last.status_code} with non-JSON body"
                ) from exc
        raise LLMError(f"POST {self.url} failed after {attempts} attempts; last: {problem}")

    def _delay(self, attempt: int, last: httpx.Response | None) -> float:
        if last is not None:
            retry_after = last.headers.get("retry-after", "")
            try:
                return min(max(float(retry_after), 0.0), _MAX_RETRY_AFTER)
            except ValueError:
                pass
        return min(self.backoff * 2 ** (attempt - 1), _MAX_RETRY_AFTER)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> OpenAICompatLLM:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"OpenAICompatLLM(model={self.model!r}, base_url={self.base_url!r})"


def _detail(response: httpx.Response) -> str:
    """The server's error message, squeezed to one short line."""
    try:
        data = response.json()
    except ValueError:
        data = response.text
    message: Any = data
    if isinstance(data, dict):
        error = data.get("error")
        message = error.get("message") if isinstance(error, dict) else error
        message = message or data.get("message") or data.get("detail")
    if not message:
        return ""
    line = " ".join(str(message).split())
    return f": {line[:200]}"
