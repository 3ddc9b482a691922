"""Two service replicas over one PostgreSQL memory behave as one service (issue 11).

Each replica is its own app with its own ``Memory`` and connection, as two ``forge serve``
processes behind a load balancer would be; they share only the database and the key file.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient  # noqa: E402

import pg_support  # noqa: E402
from forge.engine.embed import HashingEmbedder  # noqa: E402
from forge.engine.memory import Memory  # noqa: E402
from forge.server.app import create_app  # noqa: E402
from server_support import make_setup  # noqa: E402

pytestmark = pytest.mark.skipif(not pg_support.available(), reason=pg_support.MISSING)


def test_a_unit_written_through_one_replica_is_recalled_through_the_other_at_once(pg_server, tmp_path: Path):
    from forge.store.postgres import PostgresStore

    schema = pg_support.new_schema()
    url = pg_server.url(schema)
    one = make_setup(tmp_path, store=PostgresStore(url))
    other = Memory(PostgresStore(url), HashingEmbedder(64))
    two = create_app(other, keys=one.keys, rate=1e6)
    try:
        with TestClient(one.app) as c1, TestClient(two) as c2:
            h = one.h(one.alice)
            r = c1.post("/v1/units", json={"units": [{"content": "the ferry leaves at dawn from pier nine",
                                                      "scope": "group:red"}]}, headers=h)
            uid = r.json()["ids"][0]
            hits = c2.post("/v1/recall", json={"query": "when does the ferry leave"}, headers=h).json()["results"]
            assert [x["unit"]["id"] for x in hits][:1] == [uid]
            # ... and the access rules hold on both: bob (group blue) sees it through neither.
            for c in (c1, c2):
                assert c.get(f"/v1/units/{uid}", headers=one.h(one.bob)).status_code == 404
            # The audit trail is one: the recall made through replica two is there for replica
            # one, once replica two has written its batch of read records (50 ms by default).
            deadline = time.monotonic() + 30
            while True:
                evs = c1.get("/v1/events", params={"actor": "alice"}, headers=one.h(one.admin)).json()["events"]
                if "recall" in [e["op"] for e in evs] or time.monotonic() > deadline:
                    break
                time.sleep(0.02)
            assert [e["op"] for e in evs] == ["add", "admit", "recall"]  # the post went through admission
    finally:
        one.memory.close()
        other.close()
        pg_server.drop(schema)


def test_two_replicas_of_one_receiver_act_on_a_capsule_once(pg_server):
    """Both replicas of agent 'me' get the same capsule at once (a redelivery racing the
    first delivery): exactly one stores it, the other records a replay."""
    import threading

    from forge.model import Unit, Viewer
    from forge.share.capsule import Capsule, Keyring
    from forge.share.exchange import Exchange
    from forge.store import ANY_STATUS
    from forge.store.postgres import PostgresStore

    schema = pg_support.new_schema()
    url = pg_server.url(schema)
    keyring = Keyring.from_secret("population-secret")
    memories = [Memory(PostgresStore(url), HashingEmbedder(64)) for _ in range(2)]
    try:
        replicas = [Exchange(m, "me", keyring, clock=lambda: 1_000_000.0) for m in memories]
        for i in range(5):
            unit = Unit(f"When door {i} is locked, look for a key under mat {i} first.", kind="rule", owner="alice")
            cap = keyring.sign(Capsule(unit=unit, sender="alice", origin="alice", confidence=0.8,
                                       sent_at=1_000_000.0, to=("me",)))
            go = threading.Barrier(2)
            out: list = [None, None]

            def take(j: int, cap=cap, go=go, out=out) -> None:
                go.wait()
                out[j] = replicas[j].receive(cap)

            threads = [threading.Thread(target=take, args=(j,)) for j in range(2)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(d.reason for d in out) == ["replay", "useful"], [(d.outcome, d.reason) for d in out]
        stored = memories[0].store.list(viewer=Viewer.admin(), filter=ANY_STATUS, limit=100)
        assert len([u for u in stored if "capsule" in u.meta]) == 5
    finally:
        for m in memories:
            m.close()
        pg_server.drop(schema)
