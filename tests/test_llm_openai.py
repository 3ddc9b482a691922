"""The OpenAI-compatible client against httpx.MockTransport and a real local HTTP server."""

from __future__ import annotations

import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from forge.errors import ConfigError, LLMError, UserError
from forge.llm import Message, Request, choose, complete_json, forbid_real_llms, open_llm
from forge.llm.openai import OpenAICompatLLM

# The client is a real backend, talking to a stand-in server on loopback.
pytestmark = pytest.mark.real_llm

URL = "http://llm.test/v1"
KEY = "sk-secret-do-not-leak"


def _ok(text: str = "hello", usage: dict | None = None, status: int = 200) -> httpx.Response:
    body = {
        "id": "c1",
        "model": "m-served",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
    }
    if usage is not None:
        body["usage"] = usage
    return httpx.Response(status, json=body)


class Server:
    """A scripted MockTransport that records what it was sent."""

    def __init__(self, *responses):
        self.responses = list(responses)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        item = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(item, Exception):
            raise item
        return item

    def body(self, i: int = -1) -> dict:
        return json.loads(self.requests[i].content)


def _llm(server: Server, **kw) -> OpenAICompatLLM:
    kw.setdefault("backoff", 0)
    return OpenAICompatLLM(model="m", base_url=URL, transport=httpx.MockTransport(server), **kw)


@pytest.fixture
def with_key(monkeypatch):
    monkeypatch.setenv("FORGE_TEST_KEY", KEY)
    return "FORGE_TEST_KEY"


def test_sends_a_chat_request_and_reads_usage(with_key):
    server = Server(_ok("hi there", {"prompt_tokens": 11, "completion_tokens": 2}))

    def slow(request: httpx.Request) -> httpx.Response:
        time.sleep(0.05)  # the round trip the client must time
        return server(request)

    llm = OpenAICompatLLM(model="m", base_url=URL, transport=httpx.MockTransport(slow), backoff=0, api_key_env=with_key)
    out = llm.complete(
        Request(
            messages=[Message("system", "be brief"), Message("user", "hi")],
            max_tokens=5,
            stop=["\n"],
            seed=7,
        )
    )
    assert (out.text, out.prompt_tokens, out.completion_tokens) == ("hi there", 11, 2)
    assert out.model == "m-served" and out.meta["usage_estimated"] is False
    assert out.meta["finish_reason"] == "stop" and out.seconds >= 0.05  # it timed the request, not nothing
    sent = server.requests[0]
    assert str(sent.url) == f"{URL}/chat/completions"
    assert sent.headers["authorization"] == f"Bearer {KEY}"
    assert server.body() == {
        "model": "m",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": 5,
        "temperature": 0.0,
        "stop": ["\n"],
        "seed": 7,
    }
    assert KEY not in repr(llm)


def test_no_key_no_authorization_header(monkeypatch):
    monkeypatch.delenv("FORGE_TEST_KEY", raising=False)
    server = Server(_ok())
    _llm(server, api_key_env="FORGE_TEST_KEY").complete(Request(messages=[Message("user", "x")]))
    assert "authorization" not in server.requests[0].headers


def test_usage_missing_falls_back_to_an_estimate():
    server = Server(_ok("a" * 40))
    out = _llm(server).complete(Request(messages=[Message("user", "b" * 80)]))
    assert out.completion_tokens == 10 and out.prompt_tokens == 20 + 4
    assert out.meta["usage_estimated"] is True


def test_json_schema_goes_out_as_response_format_unless_turned_off():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    server = Server(_ok('{"a": 3}'))
    llm = _llm(server)
    assert llm.capabilities == {"json_schema"}
    assert complete_json(llm, "give a", schema=schema) == {"a": 3}
    fmt = server.body()["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["schema"] == schema

    server_off = Server(_ok('```json\n{"a": 4}\n```'))
    llm_off = _llm(server_off, json_schema=False)
    assert llm_off.capabilities == frozenset()
    assert complete_json(llm_off, "give a", schema=schema) == {"a": 4}
    assert "response_format" not in server_off.body()


def test_choices_are_not_sent_but_enforced_by_the_structured_layer():
    server = Server(_ok("I pick Left."))
    assert choose(_llm(server), "which way?", ["left", "right"]) == "left"
    assert "choices" not in server.body()


@pytest.mark.parametrize("status", [429, 500, 502, 503])
def test_retries_transient_statuses_then_succeeds(status):
    server = Server(httpx.Response(status, json={"error": {"message": "busy"}}), _ok("fine"))
    llm = _llm(server, max_retries=2)
    assert llm.complete(Request(messages=[Message("user", "x")])).text == "fine"
    assert len(server.requests) == 2


def test_retries_connection_errors_then_gives_up_with_the_url():
    server = Server(httpx.ConnectError("connection refused"))
    llm = _llm(server, max_retries=2)
    with pytest.raises(LLMError) as info:
        llm.complete(Request(messages=[Message("user", "x")]))
    assert len(server.requests) == 3
    message = str(info.value)
    assert message == (
        f"POST {URL}/chat/completions failed after 3 attempts; last: ConnectError: connection refused"
    )


def test_gives_up_on_persistent_5xx_naming_status_and_detail():
    server = Server(httpx.Response(503, json={"error": {"message": "model\n overloaded"}}))
    with pytest.raises(LLMError, match=r"after 2 attempts; last: status 503: model overloaded$"):
        _llm(server, max_retries=1).complete(Request(messages=[Message("user", "x")]))


def test_client_errors_are_not_retried(with_key):
    server = Server(httpx.Response(401, json={"error": {"message": "bad key"}}))
    with pytest.raises(LLMError) as info:
        _llm(server, api_key_env=with_key, max_retries=3).complete(
            Request(messages=[Message("user", "x")])
        )
    assert len(server.requests) == 1
    assert str(info.value) == f"POST {URL}/chat/completions returned status 401: bad key"
    assert KEY not in str(info.value) and "\n" not in str(info.value)


def test_retry_after_is_honoured(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr("forge.llm.openai.time.sleep", slept.append)
    server = Server(httpx.Response(429, headers={"Retry-After": "2"}), httpx.Response(500), _ok())
    _llm(server, backoff=0.5, max_retries=3).complete(Request(messages=[Message("user", "x")]))
    assert slept == [2.0, 1.0]  # Retry-After first, then backoff * 2**1


@pytest.mark.parametrize(
    ("response", "fragment"),
    [
        (httpx.Response(200, text="<html>"), "non-JSON body"),
        (httpx.Response(200, json={"choices": []}), "unexpected body"),
        (_ok(None), "no text (stop)"),
        (httpx.Response(400, text="plain failure"), "status 400: plain failure"),
        (httpx.Response(404, json={"error": "no such model"}), "status 404: no such model"),
    ],
)
def test_bad_responses_map_to_llm_error(response, fragment):
    with pytest.raises(LLMError, match=re.escape(fragment)):
        _llm(Server(response)).complete(Request(messages=[Message("user", "x")]))


def test_bad_construction():
    with pytest.raises(ConfigError):
        OpenAICompatLLM(model="")
    with pytest.raises(ConfigError):
        OpenAICompatLLM(model="m", max_retries=-1)


def test_forbidden_in_unit_tests():
    with forbid_real_llms(), pytest.raises(UserError, match="forbidden"):
        OpenAICompatLLM(model="m")


def test_open_llm_reads_base_url_at_call_time(monkeypatch):
    monkeypatch.setenv("FORGE_LLM_BASE_URL", "http://from-env:9/v1/")
    llm = open_llm("openai:qwen", max_retries=0)
    assert llm.url == "http://from-env:9/v1/chat/completions" and llm.name == "openai:qwen"
    llm.close()
    llm = open_llm("openai:qwen", base_url="http://given/v1")
    assert llm.url == "http://given/v1/chat/completions"
    llm.close()
    monkeypatch.delenv("FORGE_LLM_BASE_URL")
    with open_llm("openai:gpt-4o-mini") as llm:
        assert llm.url == "https://api.openai.com/v1/chat/completions"


# --- a real socket: a tiny http.server on 127.0.0.1 --------------------------------------------


@pytest.fixture
def local_server():
    """A one-thread HTTP server that fails the first POST with 503, then answers."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's naming
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(
                {"path": self.path, "body": body, "auth": self.headers.get("Authorization")}
            )
            if len(seen) == 1:
                self.send_response(503)
                self.end_headers()
                return
            reply = {
                "choices": [{"message": {"content": "pong"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 3, "completion_tokens": 1},
            }
            data = json.dumps(reply).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1", seen
    finally:
        server.shutdown()
        server.server_close()


def test_against_a_real_local_server(local_server, monkeypatch):
    base_url, seen = local_server
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with OpenAICompatLLM(model="tiny", base_url=base_url, backoff=0, timeout=5) as llm:
        out = llm.complete(Request(messages=[Message("user", "ping")], max_tokens=4))
    assert out.text == "pong" and out.total_tokens == 4
    assert len(seen) == 2 and seen[1]["path"] == "/v1/chat/completions"
    assert seen[1]["body"]["messages"] == [{"role": "user", "content": "ping"}]
    assert seen[1]["auth"] is None


def test_unreachable_server_fails_fast_with_the_url():
    url = "http://127.0.0.1:9/v1"
    expected = (
        rf"^POST {re.escape(url)}/chat/completions failed after 2 attempts; last: ConnectError"
    )
    with (
        OpenAICompatLLM(model="m", base_url=url, max_retries=1, backoff=0, timeout=2) as llm,
        pytest.raises(LLMError, match=expected),
    ):
        llm.complete(Request(messages=[Message("user", "x")]))
