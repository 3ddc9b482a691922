"""Token accounting: ledger totals by tags, merging across processes, the metering wrapper."""

from __future__ import annotations

import json
import threading
import time

import pytest

from forge.errors import LLMError, ValidationError
from forge.llm import (
    Message,
    MeteredLLM,
    Request,
    TokenLedger,
    complete_json,
)
from forge.llm.testing import ScriptedLLM


def _req(text: str = "one two three") -> Request:
    return Request(messages=[Message("user", text)])


def test_ledger_totals_by_tags():
    ledger = TokenLedger()
    ledger.record(
        prompt_tokens=10, completion_tokens=2, tags={"role": "actor", "condition": "forge"}
    )
    ledger.record(prompt_tokens=5, completion_tokens=1, tags={"role": "actor", "condition": "zero"})
    ledger.record(
        prompt_tokens=7, completion_tokens=3, tags={"role": "reflector", "condition": "forge"}
    )
    ledger.record(prompt_tokens=1, completion_tokens=1)
    total = ledger.total()
    assert (total.calls, total.prompt_tokens, total.completion_tokens) == (4, 23, 7)
    assert total.total_tokens == 30
    by_role = ledger.by("role")
    assert {k: v.total_tokens for k, v in by_role.items()} == {
        "actor": 18,
        "reflector": 10,
        None: 2,
    }
    pairs = ledger.by("role", "condition")
    assert pairs[("actor", "forge")].prompt_tokens == 10
    assert ledger.total(condition="forge").total_tokens == 22
    assert ledger.total(condition="forge", role="actor").calls == 1
    assert ledger.total(condition="nope").calls == 0
    assert ledger.by("role", condition="forge").keys() == {"actor", "reflector"}
    with pytest.raises(ValidationError):
        ledger.by()


def test_ledger_round_trips_and_merges_like_worker_processes():
    a, b = TokenLedger(), TokenLedger()
    a.record(prompt_tokens=3, completion_tokens=1, seconds=0.5, tags={"instance": 1})
    b.record(prompt_tokens=4, completion_tokens=2, seconds=0.25, tags={"instance": 1})
    b.record(prompt_tokens=1, completion_tokens=1, error=True, tags={"instance": 2})
    wire = json.loads(json.dumps(b.to_dict()))  # what a worker would send back
    merged = TokenLedger().merge(a).merge(wire)
    assert merged.by("instance")[1].calls == 2
    assert merged.by("instance")[1].prompt_tokens == 7
    assert merged.by("instance")[1].seconds == pytest.approx(0.75)
    assert merged.total().errors == 1
    assert TokenLedger.from_dict(merged.to_dict()).to_dict() == merged.to_dict()
    assert merged.to_dict()["total"]["total_tokens"] == 12
    with pytest.raises(ValidationError, match="to_dict"):
        merged.merge({"nope": []})


def test_ledger_is_thread_safe():
    ledger = TokenLedger()

    def work():
        for _ in range(500):
            ledger.record(prompt_tokens=1, completion_tokens=2, tags={"role": "x"})

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert ledger.total().calls == 4000
    assert ledger.total().completion_tokens == 8000


def test_metered_llm_records_each_call_with_its_tags():
    ledger = TokenLedger()
    replies = iter([(0.05, "a b"), (0.0, "c d e")])

    def reply(request: Request) -> str:
        pause, text = next(replies)
        time.sleep(pause)  # the actor's call takes at least 50 ms: the ledger must see it
        return text

    base = ScriptedLLM(reply, name="s")
    llm = MeteredLLM(base, ledger, condition="forge")
    assert llm.name == "s" and llm.capabilities == base.capabilities
    actor = llm.with_tags(role="actor", instance=0)
    reflector = actor.with_tags(role="reflector")
    actor.complete(_req("one two three"))
    reflector.complete(_req("four"))
    roles = ledger.by("role")
    assert roles["actor"].prompt_tokens == 3 and roles["actor"].completion_tokens == 2
    assert roles["reflector"].prompt_tokens == 1 and roles["reflector"].completion_tokens == 3
    assert ledger.by("instance") == {0: ledger.total()}
    assert ledger.total(condition="forge").calls == 2
    assert roles["actor"].seconds >= 0.05 and roles["reflector"].seconds >= 0.0
    assert ledger.total().seconds == pytest.approx(roles["actor"].seconds + roles["reflector"].seconds)
    assert llm.tags == {"condition": "forge"}  # siblings do not change the parent
    assert actor.count_tokens("x y") == 2


def test_metered_llm_counts_failures_and_reraises():
    ledger = TokenLedger()
    llm = MeteredLLM(ScriptedLLM([LLMError("boom")]), ledger, role="actor")
    with pytest.raises(LLMError, match="boom"):
        llm.complete(_req())
    usage = ledger.total()
    assert (usage.calls, usage.errors, usage.total_tokens) == (1, 1, 0)


def test_metered_llm_sees_structured_retries():
    ledger = TokenLedger()
    schema = {"type": "object", "required": ["a"]}
    llm = MeteredLLM(ScriptedLLM(["no", '{"a": 1}']), ledger, stage="reflect")
    assert complete_json(llm, "go", schema=schema) == {"a": 1}
    assert ledger.by("stage")["reflect"].calls == 2


def test_metered_close_closes_inner():
    inner = ScriptedLLM()
    MeteredLLM(inner, TokenLedger()).with_tags(a=1).close()
    assert inner.closed
