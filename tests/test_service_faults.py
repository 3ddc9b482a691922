"""Fault injection on the service (issue 25): a real ``forge serve --workers 2`` over SQLite
and over PostgreSQL, many clients writing at once, the whole server (its process group: the
supervisor and both workers) SIGKILLed at a random moment, then restarted on the same store.

The invariants, checked through the restarted server and then on the store itself:

- nothing acknowledged is lost or changed: every unit of a write answered 2xx is there with
  the content, kind, scope, owner and tags sent; every update and status change answered 2xx
  holds; every relation answered 201 is there; the audit log has each acknowledged add and
  status change;
- nothing is half-written: a batch whose answer never came (the kill cut it) is there whole
  or not at all; an update cut by the kill left the old text or the new, nothing else;
- the restarted workers find what they were sent (recall by a unit's own text), and the
  SQLite file passes its integrity check with its vector index consistent.

Kills come when a random number of writes has been acknowledged (a condition, so a slow
machine kills later, not emptier); the seed is printed with every failure. Rounds:
``FORGE_FAULT_ROUNDS`` (default 2 kills per backend), seed: ``FORGE_FAULT_SEED``.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

import pg_support  # noqa: E402
from forge.model import Viewer  # noqa: E402
from forge.server.keys import KeyStore  # noqa: E402
from forge.store import ANY_STATUS  # noqa: E402
from serve_support import Server  # noqa: E402

pytestmark = pytest.mark.slow  # every test here takes seconds: processes started, killed and checked

SEED = int(os.environ.get("FORGE_FAULT_SEED", "20261202"))
ROUNDS = max(1, int(os.environ.get("FORGE_FAULT_ROUNDS", "2")))
WRITERS = 6
STATUSES = ("active", "quarantined", "archived", "superseded")


def _words(rng: random.Random, n: int) -> list[str]:
    """Pseudo-words of letters only (digits would look like changed values to admission)."""
    return ["".join(rng.choice("bcdfghjklmnpqrstvwxz") + rng.choice("aeiou") for _ in range(3)) for _ in range(n)]


VOCAB = _words(random.Random(7), 3000)


def _letters(n: int) -> str:
    out = ""
    while True:
        n, r = divmod(n, 26)
        out = chr(97 + r) + out
        if n == 0:
            return out


@dataclass
class Ledger:
    """What the clients sent and what was acknowledged, shared by the writer threads."""

    units: dict[str, dict[str, Any]] = field(default_factory=dict)  # acked: id -> expected fields
    cut_batches: list[list[dict[str, Any]]] = field(default_factory=list)  # answer never came
    cut_updates: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (old, new) content
    cut_status: dict[str, tuple[str, str]] = field(default_factory=dict)
    relations: set[tuple[str, str, str]] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)
    cut: int = 0  # requests the kills cut, over every round
    landed: int = 0  # of the cut batches, those that were stored (committed, never acknowledged)
    acked: int = 0  # requests answered 2xx
    statuses: dict[int, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _writer(url: str, token: str, agent: str, group: str, tag: str, seed: int, ledger: Ledger, stop: threading.Event) -> None:
    """Adds (batches, through admission or not), updates, status changes and relations of this
    agent's own units, until the server stops answering or ``stop`` is set."""
    rng = random.Random(seed)
    mine: list[str] = []
    n = 0
    headers = {"Authorization": f"Bearer {token}"}
    with httpx.Client(base_url=url, headers=headers, timeout=httpx.Timeout(120, connect=10)) as http:
        while not stop.is_set():
            roll = rng.random()
            fresh = {"Connection": "close"} if rng.random() < 0.5 else {}  # a new connection: either worker
            if roll < 0.6 or len(mine) < 2:
                batch = []
                for _ in range(rng.randint(1, 8)):
                    uid = f"{tag}-{n}"
                    batch.append({"id": uid, "content": " ".join(rng.choices(VOCAB, k=10)) + f" mark{tag}{_letters(n)}",
                                  "kind": rng.choice(["fact", "rule", "lesson"]),
                                  "scope": rng.choice(["global", "private", f"group:{group}"]),
                                  "context": {"tags": [f"w{tag}", rng.choice(["alpha", "beta"])]}})
                    n += 1
                body = {"units": batch, "admit": rng.random() < 0.5}
                try:
                    r = http.post("/v1/units", json=body, headers=fresh)
                except httpx.HTTPError:
                    with ledger.lock:
                        ledger.cut_batches.append(batch)
                    return
                with ledger.lock:
                    ledger.statuses[r.status_code] = ledger.statuses.get(r.status_code, 0) + 1
                    if r.status_code == 201:
                        ledger.acked += 1
                        got = r.json()
                        if got["ids"] != [u["id"] for u in batch] or {d["action"] for d in got["admission"]} != {"add"}:
                            ledger.errors.append(f"a batch of new units was not added as sent: {got}")
                        for u, d in zip(batch, got["admission"], strict=True):  # the screen may hold a group or global one
                            ledger.units[u["id"]] = {**u, "owner": agent, "status": "quarantined" if d["held"] else "active"}
                        mine.extend(u["id"] for u in batch)
            elif roll < 0.8:
                uid = rng.choice(mine)
                with ledger.lock:
                    old = ledger.units[uid]["content"]
                new = " ".join(rng.choices(VOCAB, k=10)) + f" mark{tag}{_letters(n)}"
                n += 1
                try:
                    r = http.patch(f"/v1/units/{uid}", json={"content": new}, headers=fresh)
                except httpx.HTTPError:
                    with ledger.lock:
                        ledger.cut_updates[uid] = (old, new)
                    return
                with ledger.lock:
                    ledger.statuses[r.status_code] = ledger.statuses.get(r.status_code, 0) + 1
                    if r.status_code == 200:
                        ledger.acked += 1
                        ledger.units[uid]["content"] = new
                        ledger.units[uid]["status"] = r.json()["status"]  # the screen may hold the new text
            elif roll < 0.9:
                uid = mine.pop(rng.randrange(len(mine)))  # archived: no longer updated
                with ledger.lock:
                    old = ledger.units[uid]["status"]
                try:
                    r = http.post(f"/v1/units/{uid}/status", json={"status": "archived", "reason": "fault test"}, headers=fresh)
                except httpx.HTTPError:
                    with ledger.lock:
                        ledger.cut_status[uid] = (old, "archived")
                    return
                with ledger.lock:
                    ledger.statuses[r.status_code] = ledger.statuses.get(r.status_code, 0) + 1
                    if r.status_code == 200:
                        ledger.acked += 1
                        ledger.units[uid]["status"] = "archived"
            else:
                src, dst = rng.sample(mine, 2)
                try:
                    r = http.post("/v1/relations", json={"src": src, "dst": dst, "type": "supports"}, headers=fresh)
                except httpx.HTTPError:
                    return
                with ledger.lock:
                    ledger.statuses[r.status_code] = ledger.statuses.get(r.status_code, 0) + 1
                    if r.status_code == 201:
                        ledger.acked += 1
                        ledger.relations.add((src, dst, "supports"))


def _stored(server: Server, admin: str) -> dict[str, dict[str, Any]]:
    """Every unit, any status, as the restarted server lists it to the operator."""
    out: dict[str, dict[str, Any]] = {}
    h = {"Authorization": f"Bearer {admin}"}
    with httpx.Client(base_url=server.url, headers=h, timeout=120) as http:
        offset = 0
        while True:
            r = http.get("/v1/units", params={"status": list(STATUSES), "limit": 1000, "offset": offset})
            assert r.status_code == 200, r.text
            page = r.json()["units"]
            out.update((u["id"], u) for u in page)
            if len(page) < 1000:
                return out
            offset += 1000


def _check(server: Server, admin: str, ledger: Ledger, rng: random.Random, note: str) -> int:
    """The invariants, through the (restarted) server; how many units were checked."""
    stored = _stored(server, admin)
    for uid, want in ledger.units.items():
        got = stored.get(uid)
        assert got is not None, f"{note}: acknowledged unit {uid} lost"
        for key in ("content", "kind", "scope", "owner", "status"):
            if key == "content" and uid in ledger.cut_updates:  # acked before, then an update was cut
                assert got[key] in ledger.cut_updates[uid], f"{note}: {uid} content half-written: {got[key]!r}"
            elif key == "status" and uid in ledger.cut_status:
                assert got[key] in ledger.cut_status[uid], f"{note}: {uid} status {got[key]!r}"
            elif key == "status" and uid in ledger.cut_updates:  # the cut text, if written, may have been held
                assert got[key] in (want[key], "quarantined"), f"{note}: {uid} status {got[key]!r}"
            else:
                assert got[key] == want[key], f"{note}: {uid} {key} {got[key]!r} != acknowledged {want[key]!r}"
        assert got["context"]["tags"] == want["context"]["tags"], f"{note}: {uid} tags"
    for batch in ledger.cut_batches:
        present = [u["id"] in stored for u in batch]
        assert all(present) or not any(present), f"{note}: a batch cut by the kill is half there: {present}"
        for u in batch:
            if u["id"] in stored:
                assert stored[u["id"]]["content"] == u["content"], f"{note}: {u['id']} content"
    with httpx.Client(base_url=server.url, headers={"Authorization": f"Bearer {admin}"}, timeout=120) as http:
        # Writes are audited in their own transaction: an acknowledged write has its record.
        logged: dict[str, set[str]] = {"add": set(), "status": set()}
        seq = 0
        while page := http.get("/v1/events", params={"since_seq": seq, "op": ["add", "status"], "limit": 1000}).json()["events"]:
            for e in page:
                logged[e["op"]].add(e["unit_id"])
            seq = page[-1]["seq"]
        unlogged = [u for u in ledger.units if u not in logged["add"]]
        assert unlogged == [], f"{note}: acknowledged adds without their audit record: {unlogged[:5]}"
        archived = [u for u, w in ledger.units.items() if w["status"] == "archived" and u not in ledger.cut_status]
        assert [u for u in archived if u not in logged["status"]] == [], f"{note}: an acknowledged archive without its record"
        by_src: dict[str, set[tuple[str, str, str]]] = {}
        for rel in ledger.relations:
            by_src.setdefault(rel[0], set()).add(rel)
        for src, rels in by_src.items():
            r = http.get(f"/v1/units/{src}/relations", headers={"Connection": "close"})
            assert r.status_code == 200, r.text
            have = {(x["src"], x["dst"], x["type"]) for x in r.json()}
            assert rels <= have, f"{note}: acknowledged relations of {src} lost: {rels - have}"
        # Both restarted workers find a unit by its own text (fresh connections reach either).
        active = sorted(u for u, w in ledger.units.items() if w["status"] == "active" and u not in ledger.cut_updates
                        and u not in ledger.cut_status)
        for uid in rng.sample(active, min(12, len(active))):
            r = http.post("/v1/recall", json={"query": ledger.units[uid]["content"], "k": 5, "touch": False},
                          headers={"Connection": "close"})
            assert r.status_code == 200, r.text
            assert uid in [x["unit"]["id"] for x in r.json()["results"]], f"{note}: {uid} not recalled by its own text"
    return len(ledger.units)


def _rounds(db: str, tmp_path: Path, label: str) -> dict[str, int]:
    keys = KeyStore(tmp_path / "keys.json")
    admin = keys.create(admin=True)
    agents = [("alice", "red", keys.create(agent="alice", groups=["red"])), ("bob", "blue", keys.create(agent="bob", groups=["blue"]))]
    rng = random.Random(f"{SEED}-{label}")
    server = Server(db, tmp_path / "keys.json", tmp_path / "serve.log", extra=("--no-dashboard", "--no-mcp"))
    ledger = Ledger()
    checked = kills = 0
    try:
        for round_ in range(ROUNDS):
            server.start()
            note = f"seed {SEED}, {label} round {round_}"
            if round_:
                checked = _check(server, admin, ledger, rng, note + " (after the kill)")
                _fold(server, admin, ledger)
            stop = threading.Event()
            target = ledger.acked + rng.randint(20, 80)
            threads = [threading.Thread(target=_writer, daemon=True, name=f"writer-{w}",
                                        args=(server.url, agents[w % 2][2], agents[w % 2][0], agents[w % 2][1], f"r{round_}w{w}",
                                              rng.randrange(10**9), ledger, stop)) for w in range(WRITERS)]
            for t in threads:
                t.start()
            deadline = time.monotonic() + 120
            while ledger.acked < target:  # the kill comes after a random number of acknowledgements
                assert time.monotonic() < deadline and any(t.is_alive() for t in threads), (
                    f"{note}: only {ledger.acked} of {target} writes acknowledged; statuses {ledger.statuses}; "
                    f"{server.log.read_text()[-2000:]}")
                time.sleep(0.01)
            server.kill()  # mid-request for most writers
            kills += 1
            stop.set()
            for t in threads:
                t.join(timeout=120)
                assert not t.is_alive(), f"{note}: a writer hung after the kill"
        server.start()
        checked = _check(server, admin, ledger, rng, f"seed {SEED}, {label} after the last kill")
        _fold(server, admin, ledger)
        server.stop()
    finally:
        server.kill()
    assert ledger.errors == [], f"seed {SEED}, {label}: {ledger.errors[:3]}"
    bad = {s: n for s, n in ledger.statuses.items() if s not in (200, 201)}
    assert bad == {}, f"seed {SEED}, {label}: answers other than 2xx to valid writes: {bad}; {server.log.read_text()[-2000:]}"
    assert "Traceback" not in server.log.read_text(), server.log.read_text()[-3000:]
    print(f"{label}: {kills} kills, {server.starts} starts, {ledger.acked} writes acknowledged, {checked} units checked, "
          f"{len(ledger.relations)} relations, {ledger.cut} requests cut by a kill ({ledger.landed} cut batches stored whole)")
    return {"kills": kills, "acked": ledger.acked, "checked": checked, "cut": ledger.cut}


def _fold(server: Server, admin: str, ledger: Ledger) -> None:
    """After a restart: a cut batch that landed is the writers' now (acked in effect), a cut
    update or status change is what the store says. The next round's checks start there."""
    stored = _stored(server, admin)
    ledger.cut += len(ledger.cut_batches) + len(ledger.cut_updates) + len(ledger.cut_status)
    ledger.landed += sum(batch[0]["id"] in stored for batch in ledger.cut_batches)
    for batch in ledger.cut_batches:
        for u in batch:
            if u["id"] in stored:
                got = stored[u["id"]]
                ledger.units[u["id"]] = {**u, "owner": got["owner"], "status": got["status"]}
    for uid in ledger.cut_updates:
        ledger.units[uid]["content"] = stored[uid]["content"]
    for uid in ledger.cut_status:
        ledger.units[uid]["status"] = stored[uid]["status"]
    ledger.cut_batches, ledger.cut_updates, ledger.cut_status = [], {}, {}


def test_sqlite_behind_two_workers_survives_kill_9(tmp_path: Path) -> None:
    db = tmp_path / "served.db"
    got = _rounds(str(db), tmp_path, "sqlite")
    assert got["kills"] == ROUNDS and got["acked"] >= 20 * ROUNDS and got["checked"] > 0
    con = sqlite3.connect(db)
    try:
        assert con.execute("PRAGMA integrity_check").fetchall() == [("ok",)], f"seed {SEED}"
    finally:
        con.close()
    from forge.store import SQLiteStore

    store = SQLiteStore(db)
    try:
        assert store.check_index() == [], f"seed {SEED}: the vector index disagrees with the database"
        assert store.count(viewer=Viewer.admin(), filter=ANY_STATUS) >= got["checked"]
    finally:
        store.close()


@pytest.mark.skipif(not pg_support.available(), reason=pg_support.MISSING)
def test_postgres_behind_two_workers_survives_kill_9(pg_server, tmp_path: Path) -> None:
    schema = pg_support.new_schema()
    try:
        got = _rounds(pg_server.url(schema), tmp_path, "postgres")
        assert got["kills"] == ROUNDS and got["acked"] >= 20 * ROUNDS and got["checked"] > 0
    finally:
        pg_server.drop(schema)
