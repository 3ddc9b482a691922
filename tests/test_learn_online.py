"""A user's own agent learns from its outcomes through the library, with no environment.

The story: an agent recalls context (which carries a recall_id and the shown rules in
structured form), acts, and reports how it went. Credit moves the recalled units once per
recall, across processes; a rule that keeps failing is retired; a failed trace becomes a
typed rule that names nothing of the one case; a success becomes a procedure.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.errors import AccessError, ConflictError, NotFoundError, ValidationError
from forge.learn.loop import RETIRE_AFTER, Caps, learn_from
from forge.learn.online import instance_terms
from forge.learn.reflect import Reflection, RuleEdit
from forge.learn.trace import Outcome, Trace, TraceStep
from forge.llm.testing import ScriptedLLM
from forge.model import Counts, Kind, Rule, Status, Unit, Viewer
from forge.store import Filter
from forge.team.memories import TeamMemory

ADMIN = Viewer.admin()
BOT = Viewer.of("bot-1")


def rule_unit(when: str, avoid: str, prefer: str = "", *, owner: str = "bot-1", validation: float = 0.5) -> Unit:
    rule = Rule(when, avoid=(avoid,), prefer=(prefer,) if prefer else ())
    return Unit(rule.text(), kind=Kind.RULE, owner=owner, scope="global", validation=validation, meta={"rule": rule.to_dict()})


@pytest.fixture
def mem(tmp_path):
    with Memory.open(tmp_path / "m.db", embedder=HashingEmbedder(dim=64)) as m:
        yield m


# -- the typed rule --------------------------------------------------------------------------


def test_a_rule_is_data_rendered_once_and_read_back_typed():
    r = Rule("refund request: payment_api fails with rate_limited", avoid=("retry payment_api unchanged",), prefer=("use queue_refund",))
    u = Unit(r.text(), kind="rule", owner="a", meta={"rule": r.to_dict()})
    assert u.rule == r
    assert u.content == "when refund request: payment_api fails with rate_limited, do not retry payment_api unchanged; use queue_refund was safe there"
    assert Unit.from_dict(u.to_dict()).rule == r  # an export imports typed


def test_a_malformed_rule_record_is_refused_at_the_edge():
    with pytest.raises(ValidationError, match="avoid or what to prefer"):
        Unit("x", kind="rule", owner="a", meta={"rule": {"when": "a situation"}})
    with pytest.raises(ValidationError, match="unknown rule field"):
        Unit("x", kind="rule", owner="a", meta={"rule": {"when": "a b", "avoid": ["x"], "how": 1}})


def test_a_rule_edit_refuses_text_that_is_no_rule():
    with pytest.raises(ValidationError, match="not a 'when"):
        RuleEdit("", (), ("always be kind",))


def test_learn_from_writes_the_typed_record():
    with Memory.open(":memory:", embedder=HashingEmbedder(dim=32)) as m:
        applied = learn_from(m, Reflection(edits=(RuleEdit("", (), (Rule("disk: full", avoid=("restart",)),)),)), owner="a", actor="a", shown={})
        [u] = applied.added
        assert m.get(u.id, viewer=ADMIN).rule == Rule("disk: full", avoid=("restart",))


def test_team_memory_retires_a_contradicted_rule(mem):
    """Before, the team passed no active units to the learning function: a newer rule that
    forbade what an older one advised left both active in the team's memory."""
    from forge.team.memories import Outcome as TeamOutcome

    tm = TeamMemory(mem, team="t", agents=["a"])
    first = Rule("activity: none", avoid=("monitor",), prefer=("sleep",))
    second = Rule("activity: none", avoid=("sleep",), prefer=("monitor",))
    tm.record_task(task="watch the host", outcome=TeamOutcome(success=False), rules=[first.to_dict()])
    [old] = [u for u in mem.list(viewer=ADMIN, filter=Filter.make(kinds=["rule"]))]
    assert old.rule == first
    tm.record_task(task="watch the host again", outcome=TeamOutcome(success=False), rules=[second.to_dict()])
    active = mem.list(viewer=ADMIN, filter=Filter.make(kinds=["rule"]))
    assert [u.rule for u in active] == [second]
    assert mem.get(old.id, viewer=ADMIN).status is Status.ARCHIVED


def test_team_memory_reads_a_rule_written_before_rules_were_typed(mem):
    from forge.team.memories import Outcome as TeamOutcome

    tm = TeamMemory(mem, team="t", agents=["a"])
    tm.record_task(task="watch", outcome=TeamOutcome(success=False), rules=["when activity: none, do not sleep; monitor was safe there"])
    [u] = mem.list(viewer=ADMIN, filter=Filter.make(kinds=["rule"]))
    assert u.rule == Rule("activity: none", avoid=("sleep",), prefer=("monitor",))


# -- recall ids and credit -------------------------------------------------------------------


def test_context_carries_a_recall_id_and_structured_rules(mem):
    mem.add(rule_unit("refund request: payment_api fails with rate_limited", "retry payment_api unchanged", "use queue_refund"))
    ctx = mem.context("refund request payment_api rate_limited", viewer=BOT)
    assert ctx.recall_id.startswith("r1.")
    [(unit, rule)] = ctx.rules
    assert rule.avoid == ("retry payment_api unchanged",) and rule.prefer == ("use queue_refund",)
    assert mem.context("refund", viewer=ADMIN).recall_id == ""  # the operator is no agent


def test_an_outcome_credits_the_shown_units_once(mem):
    mem.add(rule_unit("refund request: payment_api fails", "retry payment_api"))
    found = mem.recall("refund request payment_api", viewer=BOT)
    done = mem.outcome(found.recall_id, agent="bot-1", success=True)
    assert done.credited == tuple(r.unit.id for r in found)
    assert mem.get(found[0].unit.id, viewer=ADMIN).counts.successes == 1
    with pytest.raises(ConflictError):
        mem.outcome(found.recall_id, agent="bot-1", success=True)
    assert mem.get(found[0].unit.id, viewer=ADMIN).counts.successes == 1  # counted once


def test_foreign_forged_and_other_agents_recall_ids_move_nothing(mem, tmp_path):
    u = rule_unit("refund request: payment_api fails", "retry payment_api")
    mem.add(u)
    rid = mem.recall("refund request payment_api", viewer=BOT).recall_id
    with pytest.raises(AccessError):
        mem.outcome(rid, agent="bot-2", success=False)
    with pytest.raises(NotFoundError):
        mem.outcome(rid[:-3] + "AAA", agent="bot-1", success=False)
    with Memory.open(tmp_path / "other.db", embedder=HashingEmbedder(dim=64)) as other, pytest.raises(NotFoundError):
        other.outcome(rid, agent="bot-1", success=False)
    with pytest.raises(ValidationError):
        mem.outcome("", agent="bot-1", success=False)
    assert mem.get(u.id, viewer=ADMIN).counts == Counts(prior=0.5)


def test_credit_works_from_another_process_and_after_a_restart(tmp_path):
    path = tmp_path / "shared.db"
    with Memory.open(path, embedder=HashingEmbedder(dim=64)) as m:
        u = rule_unit("refund request: payment_api fails", "retry payment_api")
        m.add(u)
        rid = m.recall("refund request payment_api", viewer=BOT).recall_id
    code = (
        "import json,sys\n"
        "from forge.engine.embed import HashingEmbedder\nfrom forge.engine.memory import Memory\n"
        f"m = Memory.open({str(path)!r}, embedder=HashingEmbedder(dim=64))\n"
        f"print(json.dumps(m.outcome({rid!r}, agent='bot-1', success=False).to_dict()))\nm.close()\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert json.loads(out.stdout)["credited"] == [u.id]
    with Memory.open(path, embedder=HashingEmbedder(dim=64)) as m:
        assert m.get(u.id, viewer=ADMIN).counts.failures == 1
        with pytest.raises(ConflictError):
            m.outcome(rid, agent="bot-1", success=False)


def test_a_rule_that_keeps_failing_is_retired_by_credit(mem):
    u = rule_unit("refund request: payment_api fails", "retry payment_api")
    mem.add(u)
    for _ in range(RETIRE_AFTER):
        rid = mem.recall("refund request payment_api", viewer=BOT).recall_id
        done = mem.outcome(rid, agent="bot-1", success=False)
    assert u.id in done.retired
    assert mem.get(u.id, viewer=ADMIN).status is Status.ARCHIVED


def test_default_recall_ranks_a_failing_rule_below_one_that_helps(mem):
    bad = rule_unit("customer asks for a refund", "ask for the receipt", validation=0.17)
    good = rule_unit("customer asks for a refund", "promise a date", validation=0.83)
    mem.add([bad, good])
    found = mem.recall("customer asks for a refund", viewer=BOT)
    assert [r.unit.id for r in found][:2] == [good.id, bad.id]


# -- learning from a trace -------------------------------------------------------------------

FAILED = Trace(
    task="Refund order 88231 for alice@example.com",
    kind="refund request",
    steps=(
        TraceStep("tool", tool="payment_api", args={"order": "88231"}, error="RateLimited: slow down (429)"),
        TraceStep("tool", tool="payment_api", args={"order": "88231"}, error="RateLimited: slow down (429)"),
        TraceStep("tool", tool="queue_refund", args={"order": "88231"}, content="queued"),
    ),
    answer="Your refund is queued.",
)


def test_a_failed_trace_becomes_a_typed_rule_in_recurring_terms(mem):
    llm = ScriptedLLM([json.dumps({"rules": [
        {"when": "refund request: payment_api fails with RateLimited", "avoid": "retry payment_api unchanged", "prefer": "use queue_refund"},
        {"when": "refund for order 88231", "avoid": "email alice@example.com", "prefer": ""},
    ]})])
    learned = mem.learn(FAILED, Outcome(success=False, feedback="It took three tries."), agent="bot-1", llm=llm)
    rules = [u for u in learned.learned if u.kind is Kind.RULE]
    assert [u.rule for u in rules] == [Rule("refund request: payment_api fails with RateLimited", avoid=("retry payment_api unchanged",), prefer=("use queue_refund",))]
    assert any("one case" in d for d in learned.dropped)
    assert learned.reflected_by == "llm"
    lesson = [u for u in learned.learned if u.kind is Kind.LESSON]
    assert lesson and "three tries" in lesson[0].content


def test_without_an_llm_the_trace_itself_gives_the_rule(mem):
    learned = mem.learn(FAILED, Outcome(success=False), agent="bot-1")
    [u] = [u for u in learned.learned if u.kind is Kind.RULE]
    assert u.rule.when == "refund request: payment_api fails with RateLimited"
    assert u.rule.prefer == ("queue_refund",) and learned.reflected_by == "trace"
    assert not instance_terms(u.content, FAILED)


def test_a_success_is_kept_as_a_procedure_and_credits_its_recall(mem):
    mem.add(rule_unit("refund request: payment_api fails", "retry payment_api"))
    rid = mem.recall("refund request payment_api", viewer=BOT).recall_id
    ok = Trace(task="Refund order 91 for bob", kind="refund request", recall_ids=(rid,),
               steps=(TraceStep("tool", tool="queue_refund", args={"order": "91"}, content="queued"),))
    learned = mem.learn(ok, {"success": True}, agent="bot-1")
    assert [u.kind for u in learned.learned] == [Kind.PROCEDURE]
    assert learned.credited and mem.get(learned.credited[0], viewer=ADMIN).counts.successes == 1


def test_a_bad_recall_id_in_a_trace_fails_before_anything_is_written(mem):
    before = mem.count(viewer=ADMIN)
    bad = Trace(task="t", kind="refund request", recall_ids=("r1.forged.sig",), steps=FAILED.steps)
    with pytest.raises(NotFoundError):
        mem.learn(bad, Outcome(success=False), agent="bot-1")
    assert mem.count(viewer=ADMIN) == before


@pytest.mark.parametrize("bad", [
    {"task": ""}, {"task": "t", "steps": [{"type": "dance"}]}, {"task": "t", "steps": [{"type": "tool"}]},
    {"task": "t", "extra": 1}, {"task": "t", "recall_ids": "r1.x"},
])
def test_malformed_traces_are_refused_with_one_line(bad):
    with pytest.raises(ValidationError) as err:
        Trace.from_dict(bad)
    assert "\n" not in str(err.value)


def test_caps_hold_for_learned_rules(mem):
    for i in range(3):
        step = TraceStep("tool", tool=f"tool_{'abc'[i]}", error="Timeout")
        mem.learn(Trace(task="t", kind="lookup", steps=(step,)), Outcome(success=False), agent="bot-1", caps=Caps(rules=2))
    active = mem.list(viewer=ADMIN, filter=Filter.make(kinds=["rule"]))
    assert len(active) == 2

