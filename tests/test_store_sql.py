"""The SQL both database backends share (forge.store.sql) answers the same on each: one
filter compiler, one export. A unit one backend admits and the other does not is a bug in
a dialect."""

from __future__ import annotations

import random

import pytest

import pg_support
from forge.model import Context, Episode, Kind, Relation, Status, Unit, Viewer
from forge.store import SQLiteStore
from forge.store.base import Filter

VIEWERS = [
    Viewer.admin(),
    Viewer.of("ann"),
    Viewer.of("bob", ["red"]),
    Viewer.of("cat", ["red", "blue"]),
    Viewer(groups=frozenset({"red"})),  # no agent: sees no one's private units, nor agent-less episodes
]
FILTERS = [
    Filter(),
    Filter(status=frozenset(Status)),
    Filter.make(kinds=["rule", "lesson"], status=["active", "archived"]),
    Filter.make(tags_all=["t1", "t2"]),
    Filter.make(tags_any=["t3", "t4"], kinds=["fact"]),
    Filter.make(tags_all=["never"]),
    Filter(domain="kitchen", task="bake", role="cook"),
    Filter(owner="ann"),
    Filter(scopes=frozenset({"group:red", "private"})),
    Filter(since=1_000_020.0, until=1_000_060.0),
]


def _memory() -> tuple[list[Unit], list[Relation], list[Episode]]:
    rng = random.Random(3)
    units = []
    for i in range(80):
        scope, owner = rng.choice([("global", ""), ("private", "ann"), ("private", "bob"), ("group:red", ""),
                                   ("group:blue", ""), ("global", "ann")])
        units.append(Unit(
            f"note {i}", id=f"u{i:03d}", kind=rng.choice([Kind.FACT, Kind.RULE, Kind.LESSON]), scope=scope, owner=owner,
            created_at=1_000_000.0 + i,
            status=rng.choice([Status.ACTIVE, Status.ACTIVE, Status.ARCHIVED]),
            context=Context(domain=rng.choice(["", "kitchen"]), task=rng.choice(["", "bake"]), role=rng.choice(["", "cook"]),
                            tags=tuple(rng.sample(["t1", "t2", "t3", "t4"], rng.randint(0, 3)))),
        ))
    relations = [Relation(f"u{a:03d}", f"u{b:03d}", "related_to", created_at=2_000_000.0 + a)
                 for a, b in ((rng.randrange(80), rng.randrange(80)) for _ in range(60)) if a != b]
    episodes = [Episode(agent=agent, task=f"task of {agent or 'nobody'}", created_at=3_000_000.0 + i)
                for i, agent in enumerate(["ann", "bob", ""])]
    return units, relations, episodes


@pytest.fixture
def both(pg_server):
    from forge.store.postgres import PostgresStore

    schema = pg_support.new_schema()
    stores = [SQLiteStore(":memory:"), PostgresStore(pg_server.url(schema))]
    units, relations, episodes = _memory()
    for s in stores:
        s.add(units)
        for r in dict.fromkeys(relations):
            s.relate(r)
        for e in episodes:
            s.add_episode(e)
    yield stores
    for s in stores:
        s.close()
    pg_server.drop(schema)


def test_both_backends_admit_the_same_units_for_every_viewer_and_filter(both):
    sqlite, postgres = both
    seeds = [f"u{i:03d}" for i in range(0, 80, 3)]
    answers = set()
    for viewer in VIEWERS:
        for f in FILTERS:
            listed = [[u.id for u in s.list(viewer=viewer, filter=f, limit=1000)] for s in both]
            assert listed[0] == listed[1], (viewer, f)
            assert sqlite.count(viewer=viewer, filter=f) == postgres.count(viewer=viewer, filter=f) == len(listed[0])
            hood = [[(n, r.src, r.dst) for n, r in s.neighbors(seeds, viewer=viewer, filter=f)] for s in both]
            assert hood[0] == hood[1], (viewer, f)
            answers.add(tuple(listed[0]))
    assert len(answers) > len(FILTERS)  # the viewers and filters do tell units apart


def test_both_backends_export_the_same_records_to_each_viewer(both):
    for viewer in VIEWERS:
        exports = [[{k: v for k, v in rec.items() if k not in ("access_count", "last_access")}
                    for rec in s.export_records(viewer=viewer) if rec["record"] != "event"] for s in both]
        assert exports[0] == exports[1], viewer
        episodes = {rec["agent"] for rec in exports[0] if rec["record"] == "episode"}
        assert episodes == ({"ann", "bob", ""} if viewer.operator else {viewer.agent} & {"ann", "bob"}), viewer


def test_a_unit_read_again_unchanged_is_not_decoded_again_and_any_write_is_seen(both):
    from forge.model import Provenance

    for s in both:
        admin = Viewer.admin()
        first = s.get("u001", viewer=admin)
        assert s.get_many(["u001"], viewer=admin)[0] is first  # the same row: the unit decoded before
        changed = s.update(first.replace(content="note 1, revised", meta={"speaker": "ann"},
                                         provenance=Provenance(source="test", episodes=("e1",))))
        again = s.get("u001", viewer=admin)
        assert again is not first and again.content == "note 1, revised" and again.meta == {"speaker": "ann"}
        assert again.provenance == Provenance(source="test", episodes=("e1",)) and again.updated_at == changed.updated_at
        s.set_status("u001", Status.ARCHIVED, reason="test")
        assert s.get("u001", viewer=admin).status is Status.ARCHIVED
        assert s.get("u002", viewer=admin).provenance == Provenance() and s.get("u002", viewer=admin).meta == {}


def test_the_decoded_units_kept_are_bounded(monkeypatch):
    import forge.store.sql as sql

    monkeypatch.setattr(sql, "DECODED_MAX", 5)
    s = SQLiteStore(":memory:")
    s.add([Unit(f"n{i}", id=f"n{i}") for i in range(20)])
    assert [u.id for u in s.get_many([f"n{i}" for i in range(20)], viewer=Viewer.admin())] == [f"n{i}" for i in range(20)]
    assert len(s._units_decoded) == 5
    s.close()


def test_events_appended_in_a_batch_keep_their_order_and_times_and_a_bad_one_writes_none(both):
    from forge.errors import ValidationError

    for s in both:
        before = s.events(viewer=Viewer.admin(), ops=["read"])
        s.append_events([("read", "u001", "ann", {"n": 1}, 5_000_000.0), ("recall", None, "bob", {"hits": ["u002"]}, 5_000_001.0)])
        got = [(e.op, e.unit_id, e.actor, e.data, e.ts) for e in s.events(viewer=Viewer.admin(), ops=["read", "recall"])]
        assert got[len(before):] == [("read", "u001", "ann", {"n": 1}, 5_000_000.0), ("recall", None, "bob", {"hits": ["u002"]}, 5_000_001.0)]
        n = len(s.events(viewer=Viewer.admin()))
        with pytest.raises(ValidationError):
            s.append_events([("read", None, "ann", {}, 1.0), ("update", "u001", "ann", {}, 2.0)])  # a change is not appended
        assert len(s.events(viewer=Viewer.admin())) == n


def test_events_naming_a_unit_are_read_through_its_index(both):
    for s in both:
        s.append_events([("recall", None, "ann", {"hits": [{"id": "u001"}, {"id": "u002"}]}, 6_000_000.0, ["u001", "u002"]),
                         ("recall", None, "bob", {"hits": [{"id": "u002"}]}, 6_000_001.0, ["u002", "u002"]),
                         ("read", "u003", "bob", {}, 6_000_002.0)])
        admin = Viewer.admin()
        assert [e.actor for e in s.events(viewer=admin, naming="u002", newest_first=True)] == ["bob", "ann"]
        assert [e.data["hits"][0]["id"] for e in s.events(viewer=admin, naming="u001", ops=["recall"])] == ["u001"]
        assert s.events(viewer=admin, naming="u003") == []  # named by its unit_id, not among the names


def test_an_older_sqlite_file_indexes_the_recalls_it_already_logged(tmp_path):
    db = tmp_path / "old.db"
    s = SQLiteStore(db)
    s.append_event("recall", actor="ann", data={"hits": [{"id": "x1", "score": 0.5}, {"id": "x2"}], "query": "q"})
    s.append_event("context", actor="bob", data={"hits": [{"id": "x2"}, "not a hit", {"id": 7}]})
    s.append_event("recall", actor="cat", data={"hits": "none"})
    with s._tx() as c:
        c.execute("DROP TABLE event_units")  # as a file made before the index
    s.close()
    s = SQLiteStore(db)
    assert [e.actor for e in s.events(viewer=Viewer.admin(), naming="x2")] == ["ann", "bob"]
    assert [e.actor for e in s.events(viewer=Viewer.admin(), naming="x1")] == ["ann"]
    s.close()
