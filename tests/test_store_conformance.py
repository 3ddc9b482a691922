"""One conformance suite for every Store backend (parametrised in conftest.BACKENDS)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from forge.errors import DimensionError, NotFoundError, ValidationError
from forge.model import Context, Episode, Relation, Status, Step, Unit, Viewer
from forge.store import ANY_STATUS, Filter

ADMIN = Viewer.admin()


def vecs(n: int, dim: int = 8, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)


def test_add_get_list_count(store):
    units = [Unit(f"fact number {i}", kind="fact") for i in range(5)]
    ids = store.add(units, vecs(5))
    assert ids == [u.id for u in units]
    assert store.get(ids[2], viewer=ADMIN) == units[2]
    assert [u.id for u in store.list(viewer=ADMIN)] == ids
    assert store.count(viewer=ADMIN) == 5
    assert store.dim == 8
    with pytest.raises(NotFoundError):
        store.get("nope", viewer=ADMIN)


def test_duplicate_id_rejected_and_nothing_written(store):
    u = Unit("one")
    store.add([u], vecs(1))
    with pytest.raises(ValidationError, match="already exists"):
        store.add([Unit("two"), Unit("three", id=u.id)], vecs(2))
    assert store.count(viewer=ADMIN) == 1


def test_dimension_enforced(store):
    store.add([Unit("a")], vecs(1, 8))
    with pytest.raises(DimensionError):
        store.add([Unit("b")], vecs(1, 9))
    with pytest.raises(DimensionError):
        store.vector_search(np.ones(9, dtype=np.float32), k=1, viewer=ADMIN)
    with pytest.raises(ValidationError):
        store.add([Unit("c")], np.full((1, 8), np.nan, dtype=np.float32))


def test_scope_enforced_in_every_read(store):
    secret = Unit("alpha secret launch codes", scope="private", owner="alice")
    team = Unit("alpha team plan", scope="group:red")
    public = Unit("alpha public note")
    v = vecs(3)
    store.add([secret, team, public], v)
    store.relate(Relation(public.id, secret.id, "related_to"))
    store.relate(Relation(public.id, team.id, "related_to"))
    bob = Viewer.of("bob")
    q = v[0]
    for flt in (Filter(), Filter.make(owner="alice"), Filter.make(scopes=["private"])):
        assert secret.id not in {h.id for h in store.vector_search(q, k=10, viewer=bob, filter=flt)}
        assert secret.id not in {h.id for h in store.keyword_search("alpha secret", k=10, viewer=bob, filter=flt)}
        assert secret.id not in {u.id for u in store.list(viewer=bob, filter=flt)}
    assert {n for n, _ in store.neighbors([public.id], viewer=bob)} == set()
    assert {n for n, _ in store.neighbors([public.id], viewer=Viewer.of("bob", ["red"]))} == {team.id}
    assert store.count(viewer=bob) == 1
    with pytest.raises(NotFoundError):
        store.get(secret.id, viewer=bob)
    alice = Viewer.of("alice")
    assert secret.id in {h.id for h in store.vector_search(q, k=10, viewer=alice)}
    assert store.get(secret.id, viewer=alice) == secret


def test_filters_pushed_into_search(store):
    units = [
        Unit("rule about doors", kind="rule", context=Context(domain="house", tags=("door", "safety"))),
        Unit("fact about doors", kind="fact", context=Context(domain="house", tags=("door",))),
        Unit("rule about cars", kind="rule", context=Context(domain="road", tags=("safety",)), created_at=100.0),
    ]
    store.add(units, vecs(3))
    q = vecs(1, seed=5)[0]

    def ids(flt):
        return {h.id for h in store.vector_search(q, k=10, viewer=ADMIN, filter=flt)}

    assert ids(Filter.make(kinds=["rule"])) == {units[0].id, units[2].id}
    assert ids(Filter.make(tags_all=["door", "safety"])) == {units[0].id}
    assert ids(Filter.make(tags_any=["safety"])) == {units[0].id, units[2].id}
    assert ids(Filter.make(domain="road")) == {units[2].id}
    assert ids(Filter.make(until=1000.0)) == {units[2].id}
    kw = {h.id for h in store.keyword_search("doors", k=10, viewer=ADMIN, filter=Filter.make(kinds=["fact"]))}
    assert kw == {units[1].id}


def test_status_hides_from_default_search_and_is_logged(store):
    u = Unit("obsolete advice about ladders")
    store.add([u], vecs(1))
    store.set_status(u.id, Status.SUPERSEDED, reason="replaced by newer advice", actor="curator")
    assert store.keyword_search("ladders", k=5, viewer=ADMIN) == []
    assert [h.id for h in store.keyword_search("ladders", k=5, viewer=ADMIN,
                                               filter=Filter.make(status=["superseded"]))] == [u.id]
    ev = store.events(unit_id=u.id, viewer=Viewer.admin())
    assert [e.op for e in ev] == ["add", "status"]
    assert ev[1].data == {"from": "active", "to": "superseded", "reason": "replaced by newer advice"}
    assert ev[1].actor == "curator"


def test_update_records_diff_and_reindexes(store):
    u = Unit("the red button opens the gate")
    store.add([u], vecs(1))
    new = store.update(u.replace(content="the blue button opens the gate", importance=0.9), vecs(1, seed=3)[0])
    assert store.get(u.id, viewer=ADMIN).content == "the blue button opens the gate"
    assert new.updated_at >= u.updated_at
    assert store.keyword_search("red", k=5, viewer=ADMIN) == []
    assert [h.id for h in store.keyword_search("blue", k=5, viewer=ADMIN)] == [u.id]
    hit = store.vector_search(vecs(1, seed=3)[0], k=1, viewer=ADMIN)[0]
    assert hit.id == u.id and hit.score == pytest.approx(1.0, abs=1e-4)
    diff = store.events(unit_id=u.id, viewer=Viewer.admin())[-1].data
    assert diff["content"]["to"] == "the blue button opens the gate" and "importance" in diff


def test_relations_and_missing_targets(store):
    a, b = Unit("a"), Unit("b")
    store.add([a, b], vecs(2))
    store.relate(Relation(a.id, b.id, "supports", weight=0.7))
    assert store.relations(a.id, viewer=Viewer.admin())[0].weight == 0.7
    with pytest.raises(NotFoundError, match="missing|no unit"):
        store.relate(Relation(a.id, "missing", "supports"))
    assert len(store.relations(a.id, viewer=Viewer.admin())) == 1


def test_touch_updates_access_stats(store):
    u = Unit("remember me")
    store.add([u], vecs(1))
    store.touch([u.id], at=123.0)
    store.touch([u.id], at=456.0)
    got = store.get(u.id, viewer=ADMIN)
    assert got.access_count == 2 and got.last_access == 456.0


def test_episodes(store):
    ep = Episode(agent="a", env="taxi", steps=[Step("o", "t", "north", -1.0)], outcome={"success": False})
    store.add_episode(ep)
    assert store.get_episode(ep.id) == ep
    with pytest.raises(ValidationError):
        store.add_episode(ep)
    with pytest.raises(NotFoundError):
        store.get_episode("nope")


def test_export_import_round_trip_is_lossless(store, tmp_path):
    from forge.store import SQLiteStore

    units = [Unit(f"unit {i}", kind="rule", context=Context(tags=(f"t{i}",)), meta={"n": i}) for i in range(4)]
    store.add(units, vecs(4))
    store.touch([units[0].id], at=5.0)
    store.relate(Relation(units[0].id, units[1].id, "supersedes", note="newer"))
    store.add_episode(Episode(agent="x", steps=[Step("o", "t", "a", 1.0)]))
    first = [json.dumps(r, sort_keys=True) for r in store.export_records(viewer=Viewer.admin())]
    other = SQLiteStore(tmp_path / "copy.db")
    other.import_records(json.loads(line) for line in first)
    second = [json.dumps(r, sort_keys=True) for r in other.export_records(viewer=Viewer.admin())]
    assert first == second
    other.close()


def test_import_is_one_transaction(store):
    good = Unit("fine").to_dict()
    records = [{"record": "unit", **good}, {"record": "relation", "src": good["id"], "dst": "ghost", "type": "supports"}]
    with pytest.raises(NotFoundError, match="ghost"):
        store.import_records(records)
    assert store.count(viewer=ADMIN) == 0
    with pytest.raises(ValidationError, match="record 2"):
        store.import_records([{"record": "unit", **good}, {"record": "unit", "content": ""}])
    with pytest.raises(ValidationError, match="unknown record"):
        store.import_records([{"record": "thing"}])
    assert store.count(viewer=ADMIN) == 0


def test_selective_filter_falls_back_to_exact_search(store):
    many = [Unit(f"common {i}") for i in range(300)]
    rare = Unit("rare", kind="lesson")
    v = vecs(301, dim=16, seed=1)
    store.add([*many, rare], v)
    hits = store.vector_search(v[0], k=5, viewer=ADMIN, filter=Filter.make(kinds=["lesson"]))
    assert [h.id for h in hits] == [rare.id]


# -- transactions (issue 9) ---------------------------------------------------------------


def test_transaction_commits_several_writes_together(store):
    a, b = Unit("first of a pair"), Unit("second of a pair")
    with store.transaction():
        store.add([a], vecs(1))
        store.add([b], vecs(1, seed=1))
        store.relate(Relation(a.id, b.id, "supports"))
        store.set_setting("k", "v")
    assert store.count(viewer=ADMIN) == 2 and store.settings()["k"] == "v"
    assert store.vector_search(vecs(1, seed=1)[0], k=1, viewer=ADMIN)[0].id == b.id  # indexed on commit


def test_transaction_rolls_back_everything_and_the_index_never_sees_it(store):
    keep = Unit("kept unit")
    store.add([keep], vecs(1, dim=8))
    q = vecs(1, dim=8, seed=9)[0]
    with pytest.raises(RuntimeError), store.transaction():
        gone = Unit("rolled back unit")
        store.add([gone], q.reshape(1, -1))
        assert store.get(gone.id, viewer=ADMIN).content == "rolled back unit"  # visible inside
        # SQLite's side index holds committed rows only; PostgreSQL's HNSW index is part of
        # the transaction and shows it its own rows. After the rollback both agree.
        assert store.vector_search(q, k=1, viewer=ADMIN)[0].id in {keep.id, gone.id}
        store.set_setting("k", "v")
        raise RuntimeError("the caller changed its mind")
    assert store.count(viewer=ADMIN) == 1 and "k" not in store.settings()
    assert [h.id for h in store.vector_search(q, k=5, viewer=ADMIN)] == [keep.id]
    later = Unit("written after the rollback")  # may reuse the rolled-back row id
    store.add([later], q.reshape(1, -1))
    assert store.vector_search(q, k=1, viewer=ADMIN)[0].id == later.id


def test_nested_transactions_are_savepoints(store):
    outer, inner = Unit("outer write"), Unit("inner write")
    with store.transaction():
        store.add([outer], vecs(1))
        with pytest.raises(ValidationError), store.transaction():
            store.add([inner], vecs(1, seed=2))
            store.add([Unit("clash", id=outer.id)], vecs(1, seed=3))
        assert store.count(viewer=ADMIN) == 1  # the inner block was undone alone
    assert [u.id for u in store.list(viewer=ADMIN)] == [outer.id]


def test_a_rolled_back_first_write_does_not_fix_the_dimension(store):
    with pytest.raises(RuntimeError), store.transaction():
        store.add([Unit("x")], vecs(1, dim=8))
        raise RuntimeError
    assert store.dim is None
    store.add([Unit("y")], vecs(1, dim=16))
    assert store.dim == 16


# -- every read path takes a viewer and leaks nothing (issue 9) ------------------------------


def _leaky_store(store):
    """Alice's secret, related to a public unit that began as Alice's private draft."""
    secret = Unit("alpha secret launch codes 0000", scope="private", owner="alice")
    team = Unit("alpha team plan", scope="group:red")
    draft = Unit("alpha draft: alice thinks bob is a mole", scope="private", owner="alice")
    store.add([secret, team, draft], vecs(3))
    store.relate(Relation(draft.id, secret.id, "related_to", note="see the codes 0000"))
    store.relate(Relation(draft.id, team.id, "supports", note="team note"))
    public = store.update(draft.replace(content="alpha public note", scope="global"), vecs(1, seed=4)[0])
    store.add_episode(Episode(agent="alice", task="alice's private task"))
    return secret, team, public


def test_every_read_path_hides_what_the_viewer_may_not_see(store):
    secret, team, public = _leaky_store(store)
    bob = Viewer.of("bob")
    hidden = ("0000", "mole", secret.id, team.id, "alice's private task")

    def clean(value) -> None:
        text = json.dumps(value, default=lambda o: o.to_dict() if hasattr(o, "to_dict") else repr(o))
        for h in hidden:
            assert h not in text, (h, text[:300])

    clean(store.get(public.id, viewer=bob))
    clean(store.get_many([secret.id, team.id, public.id], viewer=bob))
    clean(store.list(viewer=bob, filter=ANY_STATUS))
    clean(store.relations(public.id, viewer=bob))
    clean(store.relations(secret.id, viewer=bob))
    clean([(e.op, e.unit_id, e.data) for e in store.events(viewer=bob)])
    clean([(e.op, e.data) for e in store.events(unit_id=public.id, viewer=bob)])
    clean(store.neighbors([public.id], viewer=bob))
    clean(store.neighbors([secret.id, team.id], viewer=bob))  # seeds it may not see: nothing
    clean(list(store.export_records(viewer=bob)))
    with pytest.raises(NotFoundError):
        store.vector(secret.id, viewer=bob)
    assert store.vector(public.id, viewer=bob) is not None
    # What bob may see is all there: the shared unit, its history (values hidden), its own view.
    events = store.events(unit_id=public.id, viewer=bob)
    assert [e.op for e in events] == ["add", "update"]
    assert events[1].data["content"] == {"from": "(hidden)", "to": "alpha public note"}
    # The operator and the owner see everything.
    alice = Viewer.of("alice", ["red"])
    assert {r.dst for r in store.relations(public.id, viewer=alice)} == {secret.id, team.id}
    assert "mole" in json.dumps([e.data for e in store.events(unit_id=public.id, viewer=alice)])
    assert "mole" in json.dumps([e.data for e in store.events(unit_id=public.id, viewer=ADMIN)])
    assert len([r for r in store.export_records(viewer=ADMIN) if r["record"] == "relation"]) == 2
    red = Viewer.of("bob", ["red"])
    assert {r.dst for r in store.relations(public.id, viewer=red)} == {team.id}


def test_touch_is_batched_but_always_visible(tmp_path):
    import sqlite3

    from forge.model import Unit, Viewer
    from forge.store import SQLiteStore

    path = tmp_path / "t.db"
    store = SQLiteStore(path)
    store.add([Unit("a", id="a"), Unit("b", id="b")])
    written = lambda: dict(sqlite3.connect(path).execute("SELECT id, access_count FROM units").fetchall())  # noqa: E731
    store.touch(["a"], at=100.0)
    store.touch(["a", "b"], at=200.0)
    got = store.get("a", viewer=Viewer.admin())
    assert got.access_count == 2 and got.last_access == 200.0  # pending counts show on reads
    assert written() == {"a": 0, "b": 0}  # ... before any write transaction
    store.flush_touches()
    assert written() == {"a": 2, "b": 1}
    store.touch(["b"])
    store.close()  # close writes what is pending
    assert written() == {"a": 2, "b": 2}


def test_vector_index_loads_at_open_not_at_first_search(tmp_path):
    import numpy as np

    from forge.model import Unit, Viewer
    from forge.store import SQLiteStore

    path = tmp_path / "v.db"
    with SQLiteStore(path) as s:
        s.add([Unit("a", id="a"), Unit("b", id="b")], np.eye(2, 4, dtype=np.float32))
        s.vector_search(np.eye(1, 4, dtype=np.float32)[0], k=1, viewer=Viewer.admin())
    s = SQLiteStore(path)
    assert s._warming is not None
    s._warming.join()
    assert s._index is not None and len(s._index) == 2  # loaded with no search asked
    assert [h.id for h in s.vector_search(np.eye(1, 4, dtype=np.float32)[0], k=1, viewer=Viewer.admin())] == ["a"]
    s.close()


# -- settings and appended events travel with an operator's export (issue 11) ----------------


def test_settings_and_appended_events_are_the_stores_own(store):
    store.set_setting("embedder", "hash:8")
    store.set_setting("reputation/me/alice", '{"success": 2, "failure": 1}')
    u = Unit("a unit the ledger speaks of")
    store.add([u], vecs(1))
    seq = store.append_event("decision", actor="me", data={"outcome": "accepted", "unit_id": u.id})
    store.append_event("read", unit_id=u.id, actor="bob")
    late = store.append_event("read", unit_id=u.id, actor="bob", at=1_000.25)  # a batched record keeps its read time
    assert [e.ts for e in store.events(viewer=ADMIN) if e.seq == late] == [1_000.25]
    assert store.settings() == {"embedder": "hash:8", "reputation/me/alice": '{"success": 2, "failure": 1}'}
    ledger = store.events(viewer=ADMIN, ops=["decision"], actor="me")
    assert [(e.seq, e.data["outcome"]) for e in ledger] == [(seq, "accepted")]
    # Events without a unit are the operator's: an agent never sees them.
    assert "decision" not in {e.op for e in store.events(viewer=Viewer.of("bob"))}
    assert "read" in {e.op for e in store.events(viewer=Viewer.of("bob"))}
    for op in ("add", "update", "import", ""):
        with pytest.raises(ValidationError):
            store.append_event(op, actor="me")
    with pytest.raises(ValidationError):
        store.set_setting("k", 5)


def test_a_moved_memory_keeps_its_ledger_reputations_and_embedder(store, tmp_path):
    from forge.store import SQLiteStore

    store.set_setting("embedder", "hash:8")
    store.set_setting("reputation/me/alice", '{"success": 3.0, "failure": 0.0}')
    u = Unit("moved unit")
    store.add([u], vecs(1))
    store.append_event("decision", actor="me", data={"outcome": "accepted", "unit_id": u.id})
    records = list(store.export_records(viewer=ADMIN))
    assert {r["record"] for r in records} == {"unit", "setting", "event"}
    assert not [r for r in store.export_records(viewer=Viewer.of("bob")) if r["record"] in ("setting", "event")]
    other = SQLiteStore(tmp_path / "moved.db")
    other.import_records(json.loads(json.dumps(r)) for r in records)
    assert other.settings()["embedder"] == "hash:8"
    assert other.settings()["reputation/me/alice"] == '{"success": 3.0, "failure": 0.0}'
    moved = other.events(viewer=ADMIN, ops=["decision"])
    assert [(e.actor, e.data) for e in moved] == [("me", {"outcome": "accepted", "unit_id": u.id})]
    # Vectors from another embedder are refused rather than mixed into this vector space.
    third = SQLiteStore(tmp_path / "third.db")
    third.set_setting("embedder", "hash:16")
    with pytest.raises(ValidationError, match="embedder"):
        third.import_records(records)
    assert third.count(viewer=ADMIN) == 0
    other.close()
    third.close()


def test_a_claim_is_recorded_once_and_undone_with_its_transaction(store):
    assert store.claim("capsule/me/c1") is True
    assert store.claim("capsule/me/c1") is False
    with pytest.raises(RuntimeError), store.transaction():
        assert store.claim("capsule/me/c2") is True
        raise RuntimeError("rolled back")
    assert store.claim("capsule/me/c2") is True  # the undone claim left nothing behind
    assert "capsule/me/c1" not in store.settings()  # claims are not settings


def test_reads_run_beside_an_open_write_transaction(tmp_path):
    """A file store reads on one connection per thread: a recall in one thread does not wait
    for another thread's write transaction, and sees only what is committed; the writer's own
    reads see its writes. (One shared connection used to queue every server read on it.)"""
    import threading

    import numpy as np

    from forge.model import Unit, Viewer
    from forge.store import SQLiteStore

    admin = Viewer.admin()
    store = SQLiteStore(tmp_path / "r.db")
    store.add([Unit("frozen lake map", id="old")], np.eye(1, 4, dtype=np.float32))
    inside, read = threading.Event(), threading.Event()
    seen: dict[str, object] = {}

    def writer() -> None:
        with store.transaction():
            store.add([Unit("frozen lake holes", id="new")], np.eye(1, 4, k=1, dtype=np.float32))
            seen["writer"] = sorted(h.id for h in store.keyword_search("frozen", k=5, viewer=admin))
            inside.set()
            seen["reader done while open"] = read.wait(60)

    t = threading.Thread(target=writer)
    t.start()
    assert inside.wait(60)
    seen["reader"] = sorted(h.id for h in store.keyword_search("frozen", k=5, viewer=admin))
    seen["vector"] = [h.id for h in store.vector_search(np.eye(1, 4, k=1, dtype=np.float32)[0], k=2, viewer=admin)]
    read.set()
    t.join(60)
    assert seen["reader done while open"] is True
    assert seen["writer"] == ["new", "old"] and seen["reader"] == ["old"] and seen["vector"] == ["old"]
    assert sorted(h.id for h in store.keyword_search("frozen", k=5, viewer=admin)) == ["new", "old"]  # committed
    store.close()
    with pytest.raises(Exception, match="closed"):
        store.keyword_search("frozen", k=5, viewer=admin)


def test_read_connections_of_finished_threads_are_closed(tmp_path):
    """A server's thread pool retires idle threads and starts new ones; each reading thread
    gets a connection, and those of threads that are gone are closed, not collected."""
    import threading

    from forge.model import Unit, Viewer
    from forge.store import SQLiteStore

    store = SQLiteStore(tmp_path / "c.db")
    store.add([Unit("a note", id="a")])
    store._warming and store._warming.join()
    for _ in range(20):
        t = threading.Thread(target=lambda: store.get("a", viewer=Viewer.admin()))
        t.start()
        t.join()
    assert len(store._reader_list) == 1  # only the last thread's: every earlier one had ended
    store.close()


def test_a_recall_counts_its_touch_while_a_writer_holds_the_store(tmp_path):
    """touch() is on every recall's path: it must not wait for another thread's write."""
    import threading

    from forge.model import Unit, Viewer
    from forge.store import SQLiteStore

    store = SQLiteStore(tmp_path / "t.db")
    store.add([Unit("a", id="a")])
    inside, done = threading.Event(), threading.Event()

    def writer() -> None:
        with store.transaction():
            store.add([Unit("b", id="b")])
            inside.set()
            done.wait(60)

    t = threading.Thread(target=writer)
    t.start()
    assert inside.wait(60)
    toucher = threading.Thread(target=store.touch, args=(["a"],), kwargs={"at": 5.0})
    toucher.start()
    toucher.join(30)  # milliseconds when it does not wait; before, it queued behind the writer
    finished_while_open = not toucher.is_alive()
    done.set()
    t.join(60)
    toucher.join(60)
    assert finished_while_open
    assert store.get("a", viewer=Viewer.admin()).access_count == 1
    store.close()


def test_keyword_queries_of_any_shape_are_words_not_syntax(store):
    store.add([Unit("O'Brien's lighthouse log: storm at 03:00", id="log"), Unit("the harbour master", id="hm")])
    hostile = [
        "'; DROP TABLE units; --", "storm' | 'x", "a & !b <-> c", "\\\\ %s %(x)s {}", "lighthouse\x00storm",
        "Ünïcödé stórm 🌊", "the and of a", "", "   ", "(" * 500, " ".join(f"word{i}" for i in range(300)),
        "O'Brien's",
    ]
    for q in hostile:
        hits = store.keyword_search(q, k=5, viewer=ADMIN)
        assert all(isinstance(h.id, str) for h in hits)
    assert [h.id for h in store.keyword_search("'; storm --", k=5, viewer=ADMIN)] == ["log"]
    assert store.count(viewer=ADMIN) == 2  # nothing was executed


SECRET = "Zebrafinch quartzlamp walrusgate: the vault code is 4471-XQ."


def _everything_readable(store) -> str:
    """All a store gives back: export, the event log, listings and keyword hits."""
    parts = [json.dumps(r, sort_keys=True) for r in store.export_records(viewer=ADMIN)]
    parts += [json.dumps(e.data) for e in store.events(viewer=ADMIN, limit=100_000)]
    parts += [u.content + json.dumps(u.meta) for u in store.list(viewer=ADMIN, filter=ANY_STATUS, limit=1000)]
    return "\n".join(parts)


def test_erase_removes_every_trace_of_the_text(store):
    v = vecs(3, seed=7)
    secret, other, third = Unit(SECRET, kind="fact", context=Context(tags=("vault",))), Unit("the lobby opens at nine"), Unit("a third note")
    store.add([secret, other, third], v)
    store.relate(Relation(other.id, secret.id, "related_to", note="see: the vault code is 4471-XQ"))
    store.relate(Relation(secret.id, third.id, "supports"))
    store.update(secret.replace(content=SECRET + " Rotate it monthly.", meta={"merged": [{"id": "dup", "content": "walrusgate vault code 4471-XQ"}]}))
    store.set_status(secret.id, Status.ACTIVE, reason="confirmed the vault code 4471-XQ", actor="ops")
    store.append_event("recall", actor="bob", data={"query": "vault code", "hits": [{"id": secret.id, "reasons": ["keyword #1"]}]})
    store.append_event("admit", unit_id=other.id, actor="ops", data={"action": "add", "existing": secret.id,
                                                                   "reason": f"beside {secret.id}: 'walrusgate' contradicts"})
    assert store.keyword_search("walrusgate", k=5, viewer=ADMIN)[0].id == secret.id
    assert store.vector_search(v[0], k=1, viewer=ADMIN)[0].id == secret.id

    done = store.erase(secret.id, actor="dpo", reason="right to erasure request #12")
    assert done["kind"] == "fact" and done["removed"]["relations"] == 2 and done["removed"]["history"] >= 3

    with pytest.raises(NotFoundError):
        store.get(secret.id, viewer=ADMIN)
    assert store.get_many([secret.id], viewer=ADMIN) == []
    assert store.keyword_search("walrusgate", k=5, viewer=ADMIN) == []
    assert store.keyword_search("zebrafinch quartzlamp", k=5, viewer=ADMIN) == []
    assert secret.id not in {h.id for h in store.vector_search(v[0], k=3, viewer=ADMIN)}
    with pytest.raises(NotFoundError):
        store.vector(secret.id, viewer=ADMIN)
    assert store.relations(other.id, viewer=ADMIN) == [] and store.relations(third.id, viewer=ADMIN) == []
    assert store.neighbors([other.id, third.id], viewer=ADMIN) == []
    seen = _everything_readable(store).lower()
    for word in ("zebrafinch", "quartzlamp", "walrusgate", "4471", "vault code", "rotate it monthly"):
        assert word not in seen, word
    [tomb] = store.events(unit_id=secret.id, viewer=ADMIN)  # only the tombstone is left of its history
    assert tomb.op == "erase" and tomb.actor == "dpo" and tomb.data["reason"] == "right to erasure request #12"
    assert tomb.data["kind"] == "fact" and tomb.ts > 0
    # The other events about it keep their ids, not its words.
    recall = next(e for e in store.events(viewer=ADMIN, ops=["recall"]))
    assert recall.data["hits"][0]["id"] == secret.id and recall.data["query"] == "[erased]"
    assert store.count(viewer=ADMIN) == 2 and store.get(other.id, viewer=ADMIN).content == "the lobby opens at nine"
    with pytest.raises(NotFoundError):
        store.erase(secret.id, actor="dpo", reason="again")


def test_erase_leaves_no_text_in_the_sqlite_files(tmp_path):
    from forge.store import SQLiteStore

    path = tmp_path / "e.db"
    store = SQLiteStore(path)
    v = vecs(40, seed=3)
    units = [Unit(SECRET)] + [Unit(f"filler note {i} about the lobby") for i in range(39)]
    store.add(units, v)
    assert store.vector_search(v[0], k=1, viewer=ADMIN)[0].id == units[0].id
    store.flush()  # the vector index is on disk now, with the vector in it
    assert (tmp_path / "e.db.usearch").exists()
    store.erase(units[0].id, actor="dpo", reason="erasure")
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    for word in (b"Zebrafinch", b"zebrafinch", b"walrusgate", b"quartzlamp", b"4471-XQ"):
        assert word not in raw, word  # not in the database, its WAL, the FTS5 segments or a saved index
    assert v[0].tobytes() not in raw
    assert units[0].id not in {h.id for h in store.vector_search(v[0], k=5, viewer=ADMIN)}  # the index rebuilt without it
    assert store.vector_search(v[1], k=1, viewer=ADMIN)[0].id == units[1].id
    store.close()
    raw = b"".join(p.read_bytes() for p in tmp_path.iterdir() if p.is_file())
    assert b"walrusgate" not in raw and v[0].tobytes() not in raw
