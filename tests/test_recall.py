import pytest

from forge.engine.recall import Recalled, Weights, approx_tokens, pack
from forge.errors import ValidationError
from forge.model import Kind, Unit, Viewer
from forge.store import SPEAKER, Filter

ADMIN = Viewer.admin()


def test_hybrid_results_explain_themselves(memory):
    rule, fact, other = (
        Unit("When the taxi has no passenger, then never drop off", kind="rule"),
        Unit("Dropping off without a passenger costs ten points", kind="fact"),
        Unit("The lake has four holes", kind="fact"),
    )
    memory.add([rule, fact, other])
    res = memory.recall("taxi passenger drop off", viewer=ADMIN, k=3)
    assert res[0].unit.id in {rule.id, fact.id}
    top = res[0]
    assert "vector" in top.why and "keyword" in top.why
    assert any(r.startswith("keyword #") for r in top.reasons)
    assert res == sorted(res, key=lambda r: r.score, reverse=True)


def test_graph_expansion_reaches_units_no_signal_found(memory):
    seed = Unit("Kettle descaling needs vinegar", kind="fact")
    linked = Unit("Wear gloves", kind="rule")  # shares no word with the query
    memory.add([seed, linked])
    memory.relate(linked.id, seed.id, "prerequisite_of")
    no_graph = memory.recall("kettle descaling vinegar", viewer=ADMIN, k=5, weights=Weights(vector=0, graph=0))
    assert linked.id not in {r.unit.id for r in no_graph}
    with_graph = memory.recall("kettle descaling vinegar", viewer=ADMIN, k=5, weights=Weights(vector=0))
    got = {r.unit.id: r for r in with_graph}
    assert linked.id in got
    assert got[linked.id].why["graph"][0] == {"from": seed.id, "relation": "prerequisite_of", "hops": 1}


def test_contradictions_are_not_expanded_by_default(memory):
    a = Unit("Always restart the service first", kind="rule")
    b = Unit("Never reboot blindly", kind="rule")
    memory.add([a, b])
    memory.relate(a.id, b.id, "contradicts")
    res = memory.recall("restart the service", viewer=ADMIN, k=5, weights=Weights(vector=0))
    assert b.id not in {r.unit.id for r in res}


def test_boosts_favour_validated_and_important(memory):
    weak = Unit("deploy on friday afternoons", validation=0.1, importance=0.1)
    strong = Unit("deploy on friday mornings", validation=0.9, importance=0.9)
    memory.add([weak, strong])
    res = memory.recall("deploy friday", viewer=ADMIN, k=2, weights=Weights(vector=0, validation=1.0, importance=1.0))
    assert res[0].unit.id == strong.id and "boost" in res[0].why


def test_a_unit_said_by_whom_the_query_names_ranks_higher(memory):
    # Joanna's turn names Nate and the turtles too, and is shorter: BM25 alone ranks it first.
    hers = Unit("Joanna: how long has Nate had the turtles?", kind="episode", meta={SPEAKER: "Joanna"})
    his = Unit("Nate: I have had the turtles for three years, they are such a joy to look after", kind="episode", meta={SPEAKER: "Nate"})
    others = [Unit(f"Joanna: day {i} in the garden, the weather was {w}", kind="episode", meta={SPEAKER: "Joanna"}) for i, w in enumerate(["fine", "wet", "cold", "grey"] * 5)]
    others.append(Unit("Joanna: it was a long walk around the garden and the lake and back home again before dinner", kind="episode", meta={SPEAKER: "Joanna"}))
    memory.add([hers, his, *others])
    plain = memory.recall("how long has nate had the turtles", viewer=ADMIN, k=2, weights=Weights(vector=0, attribution=0))
    assert [r.unit.id for r in plain] == [hers.id, his.id]
    res = memory.recall("how long has nate had the turtles", viewer=ADMIN, k=2, weights=Weights(vector=0, attribution=4.0))
    assert [r.unit.id for r in res] == [his.id, hers.id]
    assert res[0].why["named"] == "nate" and res[0].why["boost"] == 5.0
    assert "by nate, whom the query names" in res[0].reasons
    assert "named" not in res[1].why


def test_attribution_matches_whole_names_and_owners():
    from forge.engine.recall import _mentions

    names = _mentions("What did Agent-3 and Mary Ann learn about the lake?")
    assert names("agent-3") and names("mary ann")
    assert not names("agent-30")
    assert names("agent") and names("ann")  # whole words inside "Agent-3" and "Mary Ann"
    assert not names("ann-marie") and not names("lake house")
    also = _mentions("also, alice said so")
    assert not also("al") and also("alice")


def test_attribution_boosts_the_owner_too(memory):
    other = Unit("the lake freezes in winter, skate near the shore", kind="fact", owner="agent-7", scope="global")
    mine = Unit("the lake freezes in winter, skate near the shore only at dawn", kind="fact", owner="agent-3", scope="global")
    memory.add([other, mine])
    res = memory.recall("what did agent-3 note about the lake freezing", viewer=ADMIN, k=2, weights=Weights(vector=0, attribution=1.0))
    assert res[0].unit.id == mine.id and res[0].why["named"] == "agent-3"


def test_scope_wins_over_filters(memory):
    secret = Unit("the vault code is 1234", scope="private", owner="alice")
    memory.add([secret])
    for flt in (Filter(), Filter.make(owner="alice"), Filter.make(scopes=["private"])):
        assert memory.recall("vault code", viewer=Viewer.of("bob"), filter=flt) == []
    assert memory.recall("vault code", viewer=Viewer.of("alice"))[0].unit.id == secret.id


def test_recall_updates_access_statistics(memory):
    u = Unit("sourdough needs a warm place")
    memory.add([u])
    memory.recall("sourdough", viewer=ADMIN)
    memory.recall("sourdough", viewer=ADMIN, touch=False)
    assert memory.get(u.id, viewer=ADMIN).access_count == 1


def test_bad_arguments():
    from forge.engine.recall import recall
    from forge.store import SQLiteStore

    with pytest.raises(ValidationError):
        recall(SQLiteStore(), query="x", query_vector=None, viewer=ADMIN, k=0)
    with pytest.raises(ValidationError):
        pack([], budget=0)


def _r(content, kind, score, uid=None):
    u = Unit(content, kind=kind) if uid is None else Unit(content, kind=kind, id=uid)
    return Recalled(u, score)


def test_pack_respects_budget_sections_and_uniqueness():
    items = [
        _r("rule one about ice", Kind.RULE, 0.9),
        _r("rule one about ice", Kind.RULE, 0.8),  # same text: packed once
        _r("a demonstration " * 30, Kind.EXAMPLE, 0.7),  # too big for the budget
        _r("fact about goals", Kind.FACT, 0.6),
        _r("lesson learned", Kind.LESSON, 0.5),
    ]
    packed = pack(items, budget=30)
    assert packed.tokens <= 30
    text = packed.render()
    assert text.count("rule one about ice") == 1
    assert text.index("## Rules") < text.index("## Facts")
    assert "demonstration" not in text
    assert [r.unit.content for r in packed.sections["rules"]] == ["rule one about ice", "lesson learned"]
    assert approx_tokens(text) <= packed.tokens + 5


def test_context_packs_recall(memory):
    memory.add([Unit("When ice cracks, then step back", kind="rule"), Unit("Ice is thin in spring", kind="fact")])
    packed = memory.context("ice", viewer=ADMIN, budget=60)
    assert "## Rules" in packed.render() and "## Facts" in packed.render()


def test_attribution_ignores_speakers_that_are_not_names(memory):
    odd = [Unit(f"the lake note {i}", meta={SPEAKER: v}) for i, v in enumerate([42, None, ["nate"], {"n": 1}, "", "   "])]
    memory.add(odd)
    res = memory.recall("what did nate say about the lake, 42?", viewer=ADMIN, k=10, weights=Weights(vector=0, attribution=1.0))
    assert len(res) == len(odd) and not any("named" in r.why for r in res)
