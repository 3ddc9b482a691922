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
