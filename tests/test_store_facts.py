"""The in-memory filter columns admit exactly the units SQL's scope and filter clauses do."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

import forge.store.facts as facts_mod
from forge.errors import StoreError
from forge.model import Context, Kind, Status, Unit, Viewer
from forge.store import SQLiteStore
from forge.store.base import Filter
from forge.store.sqlite import _where

ADMIN = Viewer.admin()
VIEWERS = [ADMIN, Viewer.of("ann"), Viewer.of("bob", ["red"]), Viewer.of("cat", ["red", "blue"]), Viewer.of("nobody")]
FILTERS = [
    Filter(),
    Filter.make(kinds=["rule"]),
    Filter.make(kinds=["rule", "lesson"], status=["active", "archived"]),
    Filter.make(tags_all=["t1"]),
    Filter.make(tags_all=["t1", "t2"]),
    Filter.make(tags_any=["t3", "t4"], kinds=["fact"]),
    Filter.make(tags_all=["never"]),
    Filter(domain="kitchen"),
    Filter(domain="kitchen", task="bake", role="cook"),
    Filter(owner="ann"),
    Filter(scopes=frozenset({"group:red"})),
    Filter(since=1_000_050.0, until=1_000_150.0),
    Filter(status=frozenset(Status)),
]


def _units(n=300, seed=0):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        scope, owner = rng.choice([("global", ""), ("private", "ann"), ("private", "bob"), ("group:red", ""),
                                   ("group:blue", ""), ("global", "cat")])
        tags = tuple(rng.sample(["t1", "t2", "t3", "t4", "t5"], rng.randint(0, 3)))
        out.append(Unit(f"note {i}", kind=rng.choice([Kind.FACT, Kind.RULE, Kind.LESSON]), scope=scope, owner=owner,
                        created_at=1_000_000.0 + i,
                        context=Context(domain=rng.choice(["", "kitchen", "garden"]), task=rng.choice(["", "bake"]),
                                        role=rng.choice(["", "cook"]), tags=tags)))
    return out


def _sql_admitted(store, viewer, f):
    where, params = _where(viewer, f)
    return {r[0] for r in store._q(f"SELECT rowid FROM units WHERE {where}", params)}


def _check(store):
    facts = store._ensure_facts()
    assert facts is not None
    everything = np.arange(0, 400)
    for viewer in VIEWERS:
        for f in FILTERS:
            want = _sql_admitted(store, viewer, f)
            assert set(everything[facts.admits(everything, viewer, f)].tolist()) == want, (viewer, f)
            assert set(facts.admitted(viewer, f).tolist()) == want, (viewer, f)


@pytest.mark.parametrize("merge_min", [20_000, 10])
def test_facts_admit_what_sql_admits_through_changes(tmp_path, monkeypatch, merge_min):
    monkeypatch.setattr(facts_mod, "MERGE_MIN_ROWS", merge_min)  # 10: tags are re-sealed as they change
    store = SQLiteStore(tmp_path / "m.db")
    try:
        units = _units()
        store.add(units[:200])
        _check(store)  # built from the table
        store.add(units[200:])
        rng = random.Random(5)
        for u in rng.sample(units, 60):  # changed columns reach the facts through unit_log
            changed = replace(u, kind=Kind.RULE, scope="group:red", owner="",
                              context=replace(u.context, tags=("t1", "t9"), domain="kitchen"))
            store.update(changed)
        for u in rng.sample(units, 30):
            store.set_status(u.id, Status.ARCHIVED, reason="test")
        _check(store)
    finally:
        store.close()


def test_filtered_searches_agree_with_sql_admission(tmp_path):
    """vector and keyword search with the facts give what they give with SQL admission."""
    rng = np.random.default_rng(0)
    units = _units(400, seed=2)
    vecs = rng.normal(size=(len(units), 16)).astype(np.float32)
    fast = SQLiteStore(tmp_path / "a.db")
    slow = SQLiteStore(tmp_path / "b.db", keyword_index=False)  # no mirror: SQL admits
    try:
        for s in (fast, slow):
            s.add(units, vecs)
        fast._ensure_keywords(build=True)
        for viewer in VIEWERS:
            for f in FILTERS:
                q = rng.normal(size=16).astype(np.float32)
                got = fast.vector_search(q, k=7, viewer=viewer, filter=f)
                want = slow.vector_search(q, k=7, viewer=viewer, filter=f)
                assert [h.id for h in got] == [h.id for h in want], (viewer, f)
                got = fast.keyword_search("note 12 note 7", k=7, viewer=viewer, filter=f)
                want = slow.keyword_search("note 12 note 7", k=7, viewer=viewer, filter=f)
                assert [h.id for h in got] == [h.id for h in want], (viewer, f)
    finally:
        fast.close()
        slow.close()


def test_out_of_range_and_removed_rows_are_not_admitted():
    facts = facts_mod.Facts()
    row = ("fact", "active", "global", "", "", "", "", "[]", 1.0, "u")
    facts.apply([(3, row), (5, row)], seq=1)
    assert facts.admits([-1, 3, 4, 5, 10**6], ADMIN, Filter()).tolist() == [False, True, False, True, False]
    facts.apply([(3, None)], seq=2)
    assert facts.admitted(ADMIN, Filter()).tolist() == [5] and len(facts) == 1 and facts.seq == 2


def test_closing_stops_a_mirror_being_built(tmp_path):
    """A short-lived process (one CLI command) does not wait for the whole mirror at close."""
    db = tmp_path / "m.db"
    store = SQLiteStore(db)
    store.add(_units(50))
    store.close()
    store = SQLiteStore(db)
    if store._warming is not None:
        store._warming.join()
    store._mirror = None
    store._closing.set()
    with pytest.raises(StoreError, match="closed"):
        store._build_mirror()
    store.close()
    again = SQLiteStore(db)  # nothing half-built was kept
    try:
        assert len(again.keyword_search("note", k=100, viewer=ADMIN)) == 50
    finally:
        again.close()


def test_the_last_admitted_answer_is_reused_until_anything_changes():
    facts = facts_mod.Facts()
    row = ("rule", "active", "global", "", "", "", "", '["a"]', 1.0, "u")
    facts.apply([(1, row), (2, row)], seq=1)
    f = Filter.make(kinds=["rule"], tags_all=["a"])
    first = facts.admitted(ADMIN, f)
    assert facts.admitted(ADMIN, f) is first and first.tolist() == [1, 2]
    assert facts.admitted(Viewer.of("ann"), f).tolist() == [1, 2]  # another viewer: computed anew
    facts.apply([(2, ("fact", "active", "global", "", "", "", "", '["a"]', 1.0, "u"))], seq=2)
    assert facts.admitted(ADMIN, f).tolist() == [1]


def test_the_mirror_names_its_rows_by_unit_id_short_long_and_unicode():
    facts = facts_mod.Facts()
    row = ("fact", "active", "global", "", "", "", "", "[]", 1.0)
    long_id, accented = "x" * (facts_mod.ID_BYTES + 1), "unité-7"
    facts.load_rows([(1, *row[:7], 1.0, "01a2317e267d1d70d4f8"), (2, *row[:7], 1.0, long_id)])
    facts.load_tags([], seq=1)
    facts.apply([(4, (*row, accented)), (6, (*row, "a" * facts_mod.ID_BYTES))], seq=2)
    assert facts.ids([1, 2, 3, 4, 6, -1, 10**6]) == ["01a2317e267d1d70d4f8", long_id, None, accented, "a" * facts_mod.ID_BYTES, None, None]
    facts.apply([(2, None), (4, (*row, "short"))], seq=3)  # a removed row and a re-set one
    assert facts.ids([2, 4]) == [None, "short"]


def test_searches_name_hits_from_the_mirror_as_sql_does(tmp_path):
    """Hits carry unit ids read from the in-memory columns; the same ids SQL maps them to,
    ids of any length included, through deletes and re-inserts."""
    store = SQLiteStore(tmp_path / "m.db")
    try:
        units = _units(30)
        units += [Unit(f"note long {i}", id=f"{'long-' * 10}{i}", kind="fact") for i in range(3)]
        vecs = np.random.default_rng(0).normal(size=(len(units), 8)).astype(np.float32)
        store.add(units, vecs)
        store._ensure_mirror(build=True)
        store.set_status(units[0].id, Status.ARCHIVED, reason="test")  # a change the mirror catches up with
        store.add([Unit("note late", kind="fact")], np.ones((1, 8), dtype=np.float32))
        hits = store.keyword_search("note", k=100, viewer=ADMIN)
        sql = dict(store._q("SELECT rowid, id FROM units"))
        assert len(hits) == len(units) and {h.id for h in hits} <= set(sql.values())  # one archived, one added
        facts = store._mirror[1]
        rowids = sorted(sql)
        assert facts.ids(rowids) == [sql[r] for r in rowids]
        near = store.vector_search(vecs[-1], k=5, viewer=ADMIN)
        assert near[0].id == units[-1].id and {h.id for h in near} <= set(sql.values())
    finally:
        store.close()
