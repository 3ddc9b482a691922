"""Consensus: detectors, every resolution policy, reputation, corroboration and the ledger."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from forge.engine.memory import Memory
from forge.errors import LLMError, ValidationError
from forge.llm.testing import ScriptedLLM
from forge.model import Context, Status, Unit, Viewer
from forge.share.conflicts import (
    ArbiterLLM,
    ConfidencePolicy,
    Conflict,
    ContextSplit,
    Debate,
    HeuristicDetector,
    LLMDetector,
    RecencyPolicy,
)
from forge.share.consensus import Consensus, Reputation
from forge.share.ledger import Ledger, Ruling
from forge.store import SQLiteStore

ADMIN = Viewer.admin()
CONFLICT = Conflict("negation", "test", 0.9)


@pytest.fixture
def cons(memory: Memory) -> Consensus:
    return Consensus(memory, agent_id="me")


def put(memory: Memory, text: str, **kw) -> Unit:
    kw.setdefault("scope", "private")
    kw.setdefault("owner", "me")
    unit = Unit(text, kind=kw.pop("kind", "rule"), **kw)
    memory.add(unit)
    return unit


# -- detection -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "b", "kind"),
    [
        ("When the door is locked, look for a key first.", "When the door is locked, never look for a key first.", "negation"),
        ("If the host is compromised, restore it.", "If the host is compromised, don't restore it.", "negation"),
        ("When alarms ring, open the gate.", "When alarms ring, close the gate.", "antonym"),
        ("Always enable the firewall on User1.", "Always disable the firewall on User1.", "antonym"),
        ("When a host is scanned, analyse it.", "When a host is scanned, decoy Enterprise0 quickly.", "different_action"),
    ],
)
def test_heuristic_detector_finds_contradictions(a: str, b: str, kind: str) -> None:
    conflict = HeuristicDetector().detect(Unit(a), Unit(b), similarity=0.8)
    assert conflict is not None and conflict.kind == kind and conflict.reason


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("When the door is locked, look for a key first.", "When the door is locked, look for the key first."),
        ("When the door is locked, look for a key.", "When the river floods, use the bridge."),
        ("Never open the gate at night.", "Never open the gate after dark."),
    ],
)
def test_heuristic_detector_lets_agreeing_or_unrelated_pairs_be(a: str, b: str) -> None:
    assert HeuristicDetector().detect(Unit(a), Unit(b), similarity=0.8) is None


def test_detectors_respect_min_similarity() -> None:
    a, b = Unit("Open the gate."), Unit("Do not open the gate.")
    assert HeuristicDetector(min_similarity=0.9).detect(a, b, similarity=0.5) is None
    assert LLMDetector(ScriptedLLM([]), min_similarity=0.9).detect(a, b, similarity=0.5) is None


def test_llm_detector_and_fallback() -> None:
    a, b = Unit("Open the gate at dawn."), Unit("Keep the gate shut at dawn.")
    yes = LLMDetector(ScriptedLLM(['{"contradicts": true, "reason": "open vs shut"}']))
    conflict = yes.detect(a, b, similarity=0.8)
    assert conflict is not None and conflict.kind == "llm" and "open vs shut" in conflict.reason
    no = LLMDetector(ScriptedLLM(['{"contradicts": false, "reason": "compatible"}']))
    assert no.detect(a, b, similarity=0.8) is None
    broken = LLMDetector(ScriptedLLM([LLMError("down")]))
    negated = Unit("Do not open the gate at dawn.")
    assert broken.detect(Unit("Open the gate at dawn."), negated, similarity=0.8).kind == "negation"


# -- resolution policies -------------------------------------------------------------------


def pair(memory: Memory, *, a_kw=None, b_kw=None) -> tuple[Unit, Unit]:
    a = put(memory, "When the door is locked, look for a key first.", created_at=100.0, **(a_kw or {}))
    b = put(memory, "When the door is locked, never look for a key first.", created_at=200.0, **(b_kw or {}))
    return a, b


def test_recency_policy(memory: Memory, cons: Consensus) -> None:
    a, b = pair(memory)
    assert RecencyPolicy().resolve(a, b, conflict=CONFLICT, consensus=cons).winner == b.id
    # Authorship time (meta) beats local receipt time.
    old_b = b.replace(meta={"authored_at": 50.0})
    assert RecencyPolicy().resolve(a, old_b, conflict=CONFLICT, consensus=cons).winner == a.id


def test_confidence_policy(memory: Memory, cons: Consensus) -> None:
    a, b = pair(memory, a_kw={"confidence": 0.5, "validation": 0.5}, b_kw={"confidence": 0.9, "validation": 0.9})
    r = ConfidencePolicy().resolve(a, b, conflict=CONFLICT, consensus=cons)
    assert r.winner == b.id and r.action == "supersede"
    # A near tie goes to the incumbent.
    close = b.replace(confidence=0.52, validation=0.52)
    r = ConfidencePolicy().resolve(a, close, conflict=CONFLICT, consensus=cons)
    assert r.winner == a.id and "incumbent" in r.reason
    # Reputation of the author counts.
    cons.reputation.set("liar", successes=0, failures=20)
    liar = b.replace(confidence=0.6, validation=0.6, meta={"origin": "liar"})
    assert ConfidencePolicy().resolve(a, liar, conflict=CONFLICT, consensus=cons).winner == a.id


def test_context_split_from_contexts(memory: Memory, cons: Consensus) -> None:
    a, b = pair(memory, a_kw={"context": Context(domain="castle")}, b_kw={"context": Context(domain="dungeon", tags=("trap",))})
    r = ContextSplit().resolve(a, b, conflict=CONFLICT, consensus=cons)
    assert r.action == "split" and r.winner is None
    assert r.conditions[a.id] == "domain=castle" and r.conditions[b.id] == "domain=dungeon, tag=trap"
    assert r.tags[b.id] == ("when:domain-dungeon-tag-trap",)


def test_context_split_falls_back_to_origins(memory: Memory, cons: Consensus) -> None:
    a, b = pair(memory, b_kw={"meta": {"origin": "bob"}})
    r = ContextSplit().resolve(a, b, conflict=CONFLICT, consensus=cons)
    assert r.conditions == {a.id: "reported by me", b.id: "reported by bob"}


def test_context_split_with_llm_and_apply(memory: Memory, cons: Consensus) -> None:
    a, b = pair(memory)
    llm = ScriptedLLM(['{"a_holds_when": "the key is nearby", "b_holds_when": "guards patrol the hall"}'])
    decision, r = cons.reconcile(a.id, b.id, conflict=CONFLICT, policy=ContextSplit(llm=llm))
    assert decision.reason == "context_split:split" and "(llm)" in r.reason
    ua, ub = memory.get(a.id, viewer=ADMIN), memory.get(b.id, viewer=ADMIN)
    assert ua.status is Status.ACTIVE and ub.status is Status.ACTIVE
    assert "when:the-key-is-nearby" in ua.context.tags and ub.meta["holds_when"] == "guards patrol the hall"
    assert any(rel.type.value == "contradicts" for rel in memory.store.relations(a.id, viewer=Viewer.admin()))
    # Untrusted content is framed as data in the prompt.
    assert "not instructions" in llm.last_request.messages[-1].content


@pytest.mark.parametrize(("answer", "action", "winner"), [("A", "supersede", "a"), ("B", "supersede", "b"), ("both", "keep_both", None)])
def test_arbiter(memory: Memory, cons: Consensus, answer: str, action: str, winner: str | None) -> None:
    a, b = pair(memory)
    llm = ScriptedLLM([f'{{"winner": "{answer}", "reason": "because"}}'])
    r = ArbiterLLM(llm).resolve(a, b, conflict=CONFLICT, consensus=cons)
    assert r.action == action and r.winner == {"a": a.id, "b": b.id, None: None}[winner]
    assert "arbiter: because" in r.reason


def test_arbiter_failure_falls_back(memory: Memory, cons: Consensus) -> None:
    a, b = pair(memory)
    r = ArbiterLLM(ScriptedLLM(["nonsense"] * 3)).resolve(a, b, conflict=CONFLICT, consensus=cons)
    assert r.action == "supersede" and "arbiter failed" in r.reason and "confidence" in r.reason


def test_debate_two_turns_then_verdict(memory: Memory, cons: Consensus) -> None:
    a, b = pair(memory)
    llm = ScriptedLLM(["A has worked 40 times.", "B avoids the trapped key.", '{"winner": "B", "reason": "traps"}'])
    decision, r = cons.reconcile(a.id, b.id, conflict=CONFLICT, policy=Debate(llm))
    assert llm.calls == 3
    assert r.winner == b.id and r.transcript == ("A: A has worked 40 times.", "B: B avoids the trapped key.")
    assert "A has worked 40 times." in llm.requests[1].messages[-1].content  # B answers A
    assert "B avoids the trapped key." in llm.requests[2].messages[-1].content  # judge reads both
    assert decision.data["transcript"] == list(r.transcript)
    assert memory.get(a.id, viewer=ADMIN).status is Status.SUPERSEDED


def test_debate_with_separate_judge_and_failure(memory: Memory, cons: Consensus) -> None:
    a, b = pair(memory)
    judge = ScriptedLLM(['{"winner": "A", "reason": "older and proven"}'])
    r = Debate(ScriptedLLM(["for A", "for B"]), judge=judge).resolve(a, b, conflict=CONFLICT, consensus=cons)
    assert r.winner == a.id and judge.calls == 1
    r = Debate(ScriptedLLM([LLMError("down")])).resolve(a, b, conflict=CONFLICT, consensus=cons)
    assert "debate failed" in r.reason


def test_reconcile_supersede_records_everything(memory: Memory, cons: Consensus) -> None:
    a, b = pair(memory)
    decision, r = cons.reconcile(a.id, b.id, conflict=CONFLICT, policy=RecencyPolicy())
    assert memory.get(a.id, viewer=ADMIN).status is Status.SUPERSEDED
    rels = {(x.src, x.dst, x.type.value) for x in memory.store.relations(a.id, viewer=Viewer.admin())}
    assert {(b.id, a.id, "contradicts"), (b.id, a.id, "supersedes")} <= rels
    status_events = [e for e in memory.store.events(unit_id=a.id, viewer=Viewer.admin()) if e.op == "status"]
    assert status_events and "lost conflict" in status_events[-1].data["reason"]
    assert cons.decisions(outcome="resolved") == [decision]


def test_find_conflicts(memory: Memory, cons: Consensus) -> None:
    a = put(memory, "When the door is locked, look for a key first.")
    put(memory, "When the river floods, use the bridge.")
    new = put(memory, "When the door is locked, never look for a key first.")
    found = cons.find_conflicts(new, detector=HeuristicDetector())
    assert [(u.id, c.kind) for u, c, _ in found] == [(a.id, "negation")]


# -- corroboration, reputation, outcomes ---------------------------------------------------------


def test_corroboration_counts_distinct_origins_with_diminishing_returns(memory: Memory, cons: Consensus) -> None:
    u = put(memory, "When the door is locked, look for a key first.", meta={"origin": "alice"})
    steps = []
    last = u.validation
    for origin in ("bob", "carol", "dave"):
        d = cons.corroborate(u.id, origin=origin)
        assert d.outcome == "corroborated"
        v = memory.get(u.id, viewer=ADMIN).validation
        steps.append(v - last)
        last = v
    assert steps[0] > steps[1] > steps[2] > 0
    assert cons.corroborate(u.id, origin="alice").reason == "already_counted"  # the author
    assert cons.corroborate(u.id, origin="bob").reason == "already_counted"
    assert memory.get(u.id, viewer=ADMIN).validation == last
    assert cons.corroborations(memory.get(u.id, viewer=ADMIN)) == 3


def test_low_reputation_corroborates_less(memory: Memory, cons: Consensus) -> None:
    u1 = put(memory, "When the door is locked, look for a key first.")
    u2 = put(memory, "When the river floods, use the bridge.")
    cons.reputation.set("shill", successes=0, failures=9)
    cons.corroborate(u1.id, origin="shill")
    cons.corroborate(u2.id, origin="honest")
    assert memory.get(u1.id, viewer=ADMIN).validation < memory.get(u2.id, viewer=ADMIN).validation


def test_reputation_is_a_beta_estimate_and_persists(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "r.db")
    rep = Reputation(store, book="me")
    assert rep.get("x") == 0.5
    rep.record("x", success=True)
    rep.record("x", success=True)
    rep.record("x", success=False)
    assert rep.get("x") == pytest.approx(3 / 5)
    store.close()
    again = Reputation(SQLiteStore(tmp_path / "r.db"), book="me")
    assert again.get("x") == pytest.approx(3 / 5) and again.counts("x") == (2.0, 1.0)
    assert Reputation(SQLiteStore(tmp_path / "r.db"), book="other").get("x") == 0.5
    with pytest.raises(ValidationError):
        rep.record("x", success=True, weight=-1)


def test_record_outcome_moves_reputation_and_leaves_validation_to_the_one_credit_model(memory: Memory, cons: Consensus) -> None:
    u1 = put(memory, "When the door is locked, look for a key first.", meta={"origin": "alice", "corroboration": {"origins": ["bob"]}})
    u2 = put(memory, "When the river floods, use the bridge.", meta={"origin": "alice"})
    mine = put(memory, "When hungry, eat.")
    reps = cons.record_outcome([u1.id, u2.id, mine.id, "missing"], success=True)
    # alice once (not twice for two units), bob half as a corroborator, never ourselves.
    assert cons.reputation.counts("alice") == (1.0, 0.0)
    assert cons.reputation.counts("bob") == (0.5, 0.0)
    assert set(reps) == {"alice", "bob"} and "me" not in cons.reputation.all()
    # validation is written by one formula (Memory.record_use), not by consensus in turn
    assert memory.get(u1.id, viewer=ADMIN).validation == u1.validation
    cons.record_outcome([u2.id], success=False)
    cons.record_outcome([u2.id], success=False)
    assert cons.reputation.get("alice") < 0.5
    assert memory.get(u2.id, viewer=ADMIN).validation == u2.validation
    (last,) = cons.decisions(outcome="outcome", limit=1)
    assert last.reason == "failure" and last.related == (u2.id,)


def test_promote_ready_after_the_fact(memory: Memory) -> None:
    cons = Consensus(memory, agent_id="me", group="team", min_corroborations=1, promote_at=0.9)
    u = put(memory, "When the door is locked, look for a key first.", meta={"origin": "alice"})
    cons.corroborate(u.id, origin="bob")
    assert cons.decisions(outcome="promoted") == []
    cons.promote_at = 0.6
    (d,) = cons.promote_ready()
    assert d.unit_id == u.id and cons.promote_ready() == []
    assert memory.get(u.id, viewer=ADMIN).meta["promoted_to"] == d.related[0]


# -- ledger ------------------------------------------------------------------------------------


def test_ledger_persists_filters_and_counts(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "l.db")
    ledger = Ledger(store, name="me")
    ledger.record(Ruling("rejected", "unsigned", sender="eve", capsule_id="c1"))
    ledger.record(Ruling("accepted", "useful", sender="alice", unit_id="u1", at=10.0))
    ledger.record(Ruling("rejected", "unsigned", sender="eve"))
    store.close()
    again = Ledger(SQLiteStore(tmp_path / "l.db"), name="me")
    assert len(again) == 3 and again.durable
    assert again.counts() == {"unsigned": 2, "useful": 1}
    assert again.counts(by="outcome") == {"rejected": 2, "accepted": 1}
    assert [d.capsule_id for d in again.list(sender="eve")][0] == "c1"
    assert again.list(unit_id="u1")[0].reason == "useful"
    assert len(again.list(limit=1)) == 1
    assert len(Ledger(None, name="x").list()) == 0 and not Ledger(None, name="x").durable
    with pytest.raises(ValidationError):
        again.counts(by="colour")
    with pytest.raises(ValidationError):
        Ruling("maybe", "x")
    with pytest.raises(ValidationError):
        Ledger(None, name="a/b")


def test_ledgers_are_decision_events_and_old_settings_ledgers_still_read(tmp_path: Path) -> None:
    store = SQLiteStore(tmp_path / "l.db")
    Ledger(store, name="me").record(Ruling("accepted", "useful", capsule_id="c2", at=20.0))
    # A ledger written before decisions were events: a settings key per decision.
    old = Ruling("rejected", "replay", capsule_id="c1", at=10.0)
    store.set_setting("ledger/old/00000000000000000001ab", json.dumps(old.to_dict()))
    assert [e.actor for e in store.events(viewer=ADMIN, ops=["decision"])] == ["me"]
    assert not [k for k in store.settings() if k.startswith("ledger/me/")]  # no key per decision any more
    assert Ledger.names(store) == ["me", "old"]
    assert [d.capsule_id for d in Ledger(store, name="old").list()] == ["c1"]
    store.close()


def test_two_prohibitions_never_contradict():
    from forge.model import Unit
    from forge.share.conflicts import HeuristicDetector

    det = HeuristicDetector()
    a = Unit("when you are at row 1, col 2 on a frozen tile, then do not left", kind="rule")
    b = Unit("when you are at row 1, col 2 on a frozen tile, then do not right", kind="rule")
    assert det.detect(a, b, similarity=0.95) is None
    c = Unit("when you are at row 1, col 2 on a frozen tile, then go right", kind="rule")
    assert det.detect(b, c, similarity=0.95) is not None
    # situations key their clauses with colons; the condition still ends at the comma. Read up
    # to the first colon, "hole; down: frozen, ..." was taken for the action, and a champion's
    # own rules for two different tiles were judged contradictory and dropped on the bus
    d = Unit("when left: hole; down: frozen; right: hole, do not down; left, right were safe there", kind="rule")
    e = Unit("when left: edge; right: frozen; up: frozen, do not right; left, up were safe there", kind="rule")
    assert det.detect(d, e, similarity=0.9) is None
    f = Unit("When the disk is full: delete old logs", kind="rule")  # a rule with a colon only
    g = Unit("When the disk is full: keep old logs", kind="rule")
    assert det.detect(f, g, similarity=0.9) is not None


def test_outcomes_and_corroboration_move_validation_by_one_model(memory: Memory, cons: Consensus) -> None:
    """A received rule's validation used to be written by two formulas in turn
    (0.5 -> 0.667 -> 0.7 -> 0.5 -> 0.4 -> 0.32): every step now reads the same counts."""
    u = put(memory, "When the disk is full, rotate the logs first.", meta={"origin": "alice"})
    seen = [u.validation]
    for success in (True, True, False, False, False):
        memory.record_use([u.id], success=success)
        cons.record_outcome([u.id], success=success)
        seen.append(memory.get(u.id, viewer=ADMIN).validation)
    counts = memory.get(u.id, viewer=ADMIN).counts
    assert (counts.uses, counts.successes, counts.failures) == (5, 2, 3)
    assert seen[-1] == counts.rate == (1 + 2) / (2 + 5)
    assert seen[1] < seen[2] and seen[2] > seen[3] > seen[4] > seen[5]
