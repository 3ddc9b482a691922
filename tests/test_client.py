"""forge.client against a real server on a loopback port: the same verbs and types as Memory."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from forge.client import AsyncClient, Client  # noqa: E402
from forge.engine.recall import Packed, Recalled  # noqa: E402
from forge.errors import AccessError, ConflictError, NotFoundError, ValidationError  # noqa: E402
from forge.model import Episode, Step, Unit, Viewer  # noqa: E402
from forge.server.testing import running  # noqa: E402
from forge.store import Filter  # noqa: E402
from server_support import make_setup  # noqa: E402


@pytest.fixture
def served(tmp_path: Path):
    setup = make_setup(tmp_path)
    with running(setup.app) as url:
        setup.url = url  # type: ignore[attr-defined]
        yield setup
    setup.memory.close()


def test_client_mirrors_memory(served) -> None:
    with Client(served.url, served.alice) as mem:
        ids = mem.add([Unit("When the ice is thin, step back.", kind="rule"), Unit("alice's diary", scope="private", owner="alice")])
        results = mem.recall("thin ice", viewer=Viewer.of("alice", ["red"]), k=5)
        assert isinstance(results[0], Recalled) and results[0].unit.id == ids[0] and results[0].reasons
        unit = mem.get(ids[1])
        assert isinstance(unit, Unit) and unit.owner == "alice"
        packed = mem.context("thin ice", budget=80)
        assert isinstance(packed, Packed) and "step back" in packed.render()
        rel = mem.relate(ids[0], ids[1], "supports", note="why")
        assert rel.type.value == "supports" and mem.relations(ids[0])[0].note == "why"
        eid = mem.add_episode(Episode(task="cross", env="ice", steps=(Step(action="left", reward=1.0),)))
        assert mem.get_episode(eid).agent == "alice"
        mem.set_status(ids[0], "archived", reason="obsolete")
        assert mem.recall("thin ice", k=5, filter=Filter.make(kinds=["rule"])) == []
        assert [e.op for e in mem.events(op="status")] == ["status"]
        with pytest.raises(NotFoundError):
            mem.get("missing")
        with pytest.raises(ConflictError):
            mem.add(Unit("again", id=ids[0]))
        with pytest.raises(ValidationError):
            mem.recall("", k=5)
        with pytest.raises(AccessError):  # the key decides the viewer: bob's view needs bob's key
            mem.recall("thin ice", viewer=Viewer.of("bob"))


def test_admin_client_exports_and_imports(served, tmp_path: Path) -> None:
    with Client(served.url, served.admin) as mem:
        mem.add([Unit(f"fact {i}") for i in range(5)])
        records = list(mem.export())
        assert sum(r["record"] == "unit" for r in records) == 5
        other = make_setup(tmp_path / "b" if (tmp_path / "b").mkdir() is None else tmp_path)
        with running(other.app) as url2, Client(url2, other.admin) as mem2:
            # every record counts: the units, and the operator's settings and appended events (history: asked for)
            with pytest.raises(ValidationError, match="history"):
                mem2.import_records(records)
            assert mem2.import_records(records, history=True) == len(records) and mem2.stats()["units"] == 5
        other.memory.close()
    with Client(served.url, served.bob) as bob, pytest.raises(AccessError):
        list(bob.export())


def test_async_client(served) -> None:
    async def main() -> None:
        async with AsyncClient(served.url, served.bob) as mem:
            [uid] = await mem.add(Unit("bob's rule: check the map first", kind="rule"))
            hits = await mem.recall("map", k=3)
            assert hits[0].unit.id == uid and isinstance(hits[0], Recalled)
            assert (await mem.get(uid)).owner == "bob"
            assert "check the map" in (await mem.context("map")).render()
            assert (await mem.stats())["units"] == 1
            [other] = await mem.add(Unit("bob's note: the map is old", scope="private", owner="bob"))
            changed = await mem.update(Unit("bob's rule: check the map twice", kind="rule", id=uid))
            assert changed.content.endswith("twice")
            assert (await mem.relate(uid, other, "supports", note="why")).note == "why"
            assert [r.note for r in await mem.relations(uid)] == ["why"]
            assert (await mem.trace(uid))
            eid = await mem.add_episode(Episode(task="map", env="lake", steps=(Step(action="up", reward=0.0),)))
            assert (await mem.get_episode(eid)).agent == "bob"
        async with AsyncClient(served.url, served.admin) as admin:
            records = [r async for r in admin.export()]
            assert sum(r["record"] == "unit" for r in records) == 2
            with pytest.raises(ConflictError):  # the same ids again: refused whole, as Memory.import_records does
                await admin.import_records([r for r in records if r["record"] == "unit"])
            assert (await admin.stats())["units"] == 2

    asyncio.run(main())


def test_async_client_has_every_verb_of_the_sync_client() -> None:
    """Code moves between Client and AsyncClient by adding awaits, never by losing a verb."""
    public = {n for n in dir(Client) if not n.startswith("_")} - {"close"}
    assert public <= {n for n in dir(AsyncClient) if not n.startswith("_")}


@pytest.mark.slow
def test_sixteen_clients_mixing_writes_and_reads_lose_nothing(served) -> None:
    """16 clients, each with its own key, add / recall / relate for a bounded number of rounds."""
    tokens = [served.keys.create(agent=f"agent-{i}", groups=["team"]) for i in range(16)]
    rounds = 6
    added: dict[int, list[str]] = {}
    errors: list[BaseException] = []
    deadline = time.monotonic() + 240  # bound, not an assertion: a loaded machine just does fewer rounds

    def work(i: int) -> None:
        try:
            with Client(served.url, tokens[i], timeout=120) as mem:
                mine: list[str] = []
                for r in range(rounds):
                    if time.monotonic() > deadline:
                        break
                    ids = mem.add([Unit(f"agent {i} round {r} note about the lake", scope="group:team"),
                                   Unit(f"agent {i} round {r} private", scope="private", owner=f"agent-{i}")])
                    mine += ids
                    mem.recall(f"round {r} lake", k=5)
                    mem.relate(ids[0], ids[1], "related_to")
                added[i] = mine
        except BaseException as exc:  # noqa: BLE001 - collected and re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not errors, errors[:3]
    assert all(not t.is_alive() for t in threads)
    with Client(served.url, served.admin) as admin:
        total = sum(len(v) for v in added.values())
        assert total > 0 and admin.stats()["units"] == total
        for i, ids in added.items():
            for uid in ids:
                assert admin.get(uid).content.startswith(f"agent {i} ")
            # Each agent's private units are visible to it and to nobody else in the team.
            with Client(served.url, tokens[(i + 1) % 16]) as other, pytest.raises(NotFoundError):
                other.get(ids[1])
        assert len(admin.events(op="relate", limit=1000)) == total // 2


def test_units_in_answers_are_checked_against_the_schema_and_off_it_by_unit_from_dict() -> None:
    """The client's fast path builds the same unit as Unit.from_dict, and refuses what it refuses."""
    import json

    from forge.client import _unit_of
    from forge.errors import ValidationError
    from forge.model import Context, Provenance

    u = Unit("the ferry leaves at noon", kind="fact", context=Context(domain="travel", tags=("ferry", "noon")),
             provenance=Provenance(source="api:ann", episodes=("e1",)), meta={"speaker": "ann"}, scope="private", owner="ann")
    d = json.loads(json.dumps(u.to_dict()))
    assert _unit_of(d) == Unit.from_dict(d) == u
    older = {k: v for k, v in d.items() if k not in ("access_count", "last_access")}  # an older server's shape
    assert _unit_of(older) == Unit.from_dict(older)
    for bad in ({"confidence": 2.0}, {"content": "  "}, {"access_count": True}, {"kind": "spell"}, {"owner": ""},
                {"content": "a \ud800 lone surrogate"}, {"context": {"tags": "ferry"}}, {"created_at": float("nan")},
                {"extra": 1}, {"meta": []}, {"provenance": {"source": "x", "forged": True}},
                {"provenance": {"episodes": [3]}}):
        with pytest.raises(ValidationError):
            _unit_of({**d, **bad})
