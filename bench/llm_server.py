"""FORGE's embedded model as an OpenAI-compatible endpoint: one command, no network.

    python bench/llm_server.py                       # Qwen2.5-Coder-1.5B (FORGE's default) on 127.0.0.1:8766
    python bench/llm_server.py --llm local:smollm2   # the 135M smoke-test model
    python bench/llm_server.py --llm test            # a scripted stand-in (bench smoke tests; no model)

Then any OpenAI client talks to ``http://127.0.0.1:8766/v1`` (``POST /v1/chat/completions``,
``GET /v1/models``), and ``forge serve --llm openai:forge-local`` reflects with it when
``FORGE_LLM_BASE_URL=http://127.0.0.1:8766/v1``. ``GET /stats`` says how many prompt and
completion tokens it served per caller (the ``user`` field), the seconds callers waited
(``seconds``) and the seconds the model worked for them (``busy_seconds``).

Why our own and not ``python -m llama_cpp.server``: that one needs more packages
(``pydantic-settings``, ``starlette-context``) and a path to a .gguf, where FORGE assembles
its model from wheels; this one wraps :func:`forge.llm.open_llm`, so every backend FORGE has
(the embedded llama.cpp, a scripted model) is served the same way, and a
``response_format`` whose schema is one string enum (``{"action": {"enum": [...]}}``) is
answered by the backend's native choice (llama.cpp scores each option from one forward pass)
instead of grammar-constrained sampling. Requests are served one at a time: one model, one
KV cache (prefix-stable prompts reuse it).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from forge.errors import ForgeError
from forge.llm import LLM, Message, Request, open_llm

MODEL_NAME = "forge-local"


def _one_enum(schema: Any) -> tuple[str, list[str]] | None:
    """``(key, options)`` when ``schema`` is an object with one required string-enum property."""
    if not isinstance(schema, Mapping) or schema.get("type") != "object":
        return None
    props = schema.get("properties")
    if not isinstance(props, Mapping) or len(props) != 1:
        return None
    (key, prop), = props.items()
    options = prop.get("enum") if isinstance(prop, Mapping) else None
    if not isinstance(options, list) or not options or not all(isinstance(o, str) and o for o in options):
        return None
    return str(key), list(dict.fromkeys(options))


def _bad(message: str, code: int = 400) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "invalid_request_error"}}, status_code=code)


def create_app(llm: LLM, *, name: str = MODEL_NAME) -> FastAPI:
    app = FastAPI(title="FORGE embedded model (OpenAI-compatible)")
    lock = threading.Lock()  # one model: one request at a time
    counting = threading.Lock()
    served: dict[str, dict[str, float]] = {}

    def count(user: str, prompt: int, completion: int, seconds: float, busy: float) -> None:
        row = served.setdefault(user or "-", {"requests": 0, "prompt_tokens": 0, "completion_tokens": 0, "seconds": 0.0, "busy_seconds": 0.0})
        row["requests"] += 1
        row["prompt_tokens"] += prompt
        row["completion_tokens"] += completion
        row["seconds"] += seconds
        row["busy_seconds"] += busy

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "forge", "backend": llm.name}]}

    @app.get("/stats")
    def stats() -> dict[str, Any]:
        with counting:
            rows = {u: dict(r) for u, r in served.items()}
        total = {k: sum(r[k] for r in rows.values()) for k in ("requests", "prompt_tokens", "completion_tokens", "seconds", "busy_seconds")}
        return {"model": llm.name, "by_user": rows, "total": total}

    @app.post("/v1/chat/completions")
    def chat(body: dict[str, Any]) -> Any:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            return _bad("messages must be a non-empty list")
        try:
            messages = [Message(m["role"], m["content"] if isinstance(m["content"], str) else "".join(
                part.get("text", "") for part in m["content"] if isinstance(part, Mapping))) for m in msgs]
        except (KeyError, TypeError) as exc:
            return _bad(f"each message needs a role and a content ({exc})")
        if any(m.role not in ("system", "user", "assistant") for m in messages):
            return _bad("message roles are system, user or assistant")
        fmt = body.get("response_format") or {}
        schema = None
        if isinstance(fmt, Mapping) and fmt.get("type") == "json_schema":
            schema = (fmt.get("json_schema") or {}).get("schema")
        elif isinstance(fmt, Mapping) and fmt.get("type") == "json_object":
            schema = {"type": "object"}
        enum = _one_enum(schema)
        max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or 256)
        stop = body.get("stop") or ()
        req = Request(messages=messages, max_tokens=max(1, min(max_tokens, 4096)), temperature=float(body.get("temperature") or 0.0),
                      stop=[stop] if isinstance(stop, str) else list(stop), seed=body.get("seed"),
                      json_schema=None if enum and "choices" in llm.capabilities else schema,
                      choices=enum[1] if enum and "choices" in llm.capabilities else None)
        started = time.perf_counter()
        try:
            with lock:
                began = time.perf_counter()
                out = llm.complete(req)
                busy = time.perf_counter() - began
        except ForgeError as exc:
            return _bad(f"{type(exc).__name__}: {exc}", 500)
        seconds = time.perf_counter() - started
        text = json.dumps({enum[0]: out.text}) if req.choices else out.text
        with counting:
            count(str(body.get("user") or ""), out.prompt_tokens, out.completion_tokens, seconds, busy)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()), "model": name,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": out.prompt_tokens, "completion_tokens": out.completion_tokens, "total_tokens": out.total_tokens},
        }

    return app


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--llm", default="local", help="what to serve: local (the 1.5B), local:smollm2, local:/path.gguf, test")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8766)
    ap.add_argument("--seed", type=int, default=0, help="the scripted model's seed (--llm test)")
    args = ap.parse_args(argv)
    import uvicorn

    llm = open_llm("test:walker", seed=args.seed) if args.llm == "test" else open_llm(args.llm)
    uvicorn.run(create_app(llm), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
