"""Regression tests for issue 9 (hardening): each test failed on the code before the fix.

Malformed capsules never block an inbox, scoped units travel only to their scope, a unit and
its ledger record are written together, ``Memory.add`` is one transaction, and the API raises
``ValidationError`` (never a raw Python exception) for the inputs the CLI rejects.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from fakes import Clock
from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.errors import StoreError, ValidationError
from forge.model import Unit, Viewer
from forge.population.agent import Agent
from forge.share.bus import MemoryBus, Network
from forge.share.capsule import MAX_TTL_S, Capsule, Keyring
from forge.share.exchange import Exchange
from forge.share.topology import FullMesh
from forge.share.triggers import PeriodicSync
from forge.store import ANY_STATUS, SQLiteStore
from test_bus_support import cleanup, redis_bus

ADMIN = Viewer.admin()
SECRET = "population-secret"
RULE = "When the door is locked, look for a key under the mat first."


@pytest.fixture
def keyring() -> Keyring:
    return Keyring.from_secret(SECRET)


def capsule_dict(keyring: Keyring, text: str = RULE, **fields) -> dict:
    """A signed, valid capsule as a dict, then ``fields`` overwritten (signature kept)."""
    unit = Unit(text, kind="rule", owner="alice")
    cap = keyring.sign(Capsule(unit=unit, sender="alice", origin="alice", confidence=0.8, sent_at=1_000_000.0, to=("me",)))
    return {**cap.to_dict(), **fields}


MALFORMED = [
    {"context": 5},
    {"context": {"domain": 5}},
    {"context": {"domain": "x" * 100_000}},
    {"sender": {}},
    {"sender": ""},
    {"origin": ["a"]},
    {"sent_at": "x"},
    {"sent_at": float("nan")},
    {"confidence": "high"},
    {"confidence": 7},
    {"id": [1]},
    {"id": ""},
    {"hops": -1},
    {"hops": "2"},
    {"hops": True},
    {"ttl": float("nan")},
    {"ttl": float("inf")},
    {"ttl": MAX_TTL_S * 10},
    {"ttl": "1"},
    {"scope": 5},
    {"scope": "galaxy"},
    {"kind": "virus"},
    {"reply_to": 3},
    {"signature": 12},
    {"unit": 5},
    {"unit": {"content": "x", "owner": 7}},
    {"unit": {"content": "x", "created_at": "yesterday"}},
    {"unit": {"content": "x", "meta": {"blob": "y" * 1_000_000}}},
    {"unit": {"content": "\ud800 lone surrogate"}},
    {"extra_field": 1},
]


@pytest.mark.parametrize("fields", MALFORMED, ids=[next(iter(f)) + "=" + repr(next(iter(f.values())))[:20] for f in MALFORMED])
def test_malformed_capsule_fields_are_validation_errors(keyring, fields):
    with pytest.raises(ValidationError):
        Capsule.from_dict(capsule_dict(keyring, **fields))


@pytest.mark.parametrize("fields", MALFORMED[:12], ids=[next(iter(f)) for f in MALFORMED[:12]])
def test_malformed_capsule_becomes_a_recorded_rejection(memory, keyring, fields):
    ex = Exchange(memory, "me", keyring, clock=Clock())
    d = ex.receive_raw(json.dumps(capsule_dict(keyring, **fields)))
    assert (d.outcome, d.reason) == ("rejected", "malformed")
    assert ex.counts() == {"malformed": 1}
    assert memory.store.count(viewer=ADMIN, filter=ANY_STATUS) == 0


def test_ttl_nan_never_expiring_is_refused_and_ttl_is_bounded():
    unit = Unit("x")
    for ttl in (math.nan, math.inf, -1.0, 0.0, MAX_TTL_S + 1):
        with pytest.raises(ValidationError, match="ttl"):
            Capsule(unit=unit, sender="a", origin="a", confidence=0.5, ttl=ttl)
    assert Capsule(unit=unit, sender="a", origin="a", confidence=0.5, ttl=MAX_TTL_S).ttl == MAX_TTL_S


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_a_malformed_message_does_not_block_the_inbox(backend, keyring):
    """The bad capsule is acked and counted; the valid ones behind it are stored."""
    bus = MemoryBus() if backend == "memory" else redis_bus()
    ids = ["a1", "a2"]
    agents = {a: Agent.open(a, bus=bus, agents=ids, secret=SECRET) for a in ids}
    try:
        a1, a2 = agents["a1"], agents["a2"]
        topic = a1.network.topic("a2")
        unit = Unit("When the lake thaws, then stay on the marked path.", kind="rule", owner="a1", importance=0.9)
        good = Capsule.of(unit, sender="a1")
        bad_payloads = [
            json.dumps(capsule_dict(keyring, context=5, sender="a1")).encode(),
            json.dumps(capsule_dict(keyring, sender={})).encode(),
            b"\xff\xfe not json",
            b"[]",
            json.dumps({"unit": {"content": "x"}, "sender": "a1", "origin": "a1", "confidence": "high"}).encode(),
        ]
        for p in bad_payloads:
            bus.publish(topic, p)
        a1.network.send_to(good, ["a2"])
        decisions = a2.drain()
        assert [d.outcome for d in decisions] == ["accepted"]
        assert sum(a2._inbox.rejected.values()) == len(bad_payloads)
        assert a2._inbox.pending() == 0  # everything acked: nothing replays on restart
        assert a2.stats()["rejected"] == len(bad_payloads)
    finally:
        for a in agents.values():
            a.close()
        if backend == "memory":
            bus.close()
        else:
            cleanup(bus)


def test_pump_acks_a_capsule_whose_handler_fails_and_goes_on(keyring):
    """A handler bug on one capsule is counted as a rejection, not an inbox blocked forever."""
    bus = MemoryBus()
    net = Network(bus, FullMesh(["a", "b"]), keyring=keyring)
    inbox = net.inbox("b")
    for i in range(3):
        net.send_to(Capsule.of(Unit(f"note {i}", owner="a"), sender="a"), ["b"])
    seen = []

    def handle(capsule):
        if capsule.unit.content == "note 1":
            raise TypeError("boom")
        seen.append(capsule.unit.content)

    assert net.pump("b", inbox, handle=handle) == 3
    assert seen == ["note 0", "note 2"]
    assert inbox.rejected == {"handler_error": 1} and inbox.pending() == 0


# -- scope ---------------------------------------------------------------------------------


def test_group_units_travel_only_to_members():
    """Importance trigger and periodic sync: a group:g1 unit reaches g1 members only."""
    bus = MemoryBus()
    ids = ["a1", "a2", "a3"]
    members = {"g1": ["a1", "a2"]}
    agents = {
        a: Agent.open(a, bus=bus, agents=ids, secret=SECRET, groups=["g1"] if a in members["g1"] else [], members=members)
        for a in ids
    }
    try:
        a1, a2, a3 = agents.values()
        secret_plan = Unit("When the red team probes port 22, then rotate the bastion keys.", kind="rule",
                           scope="group:g1", importance=0.95)
        a1.remember(secret_plan)  # the importance trigger fires
        a1.flush()
        quiet = Unit("When g1 meets, then the agenda is in the shared drive.", kind="rule", scope="group:g1",
                     importance=0.1, owner="a1")
        a1.remember(quiet)
        a1.sync(force=True)  # the periodic batch
        assert a3.drain() == []  # a non-member gets nothing at all
        assert not a3.recall("bastion keys agenda shared drive")
        got = {d.outcome for d in a2.drain()}
        assert got <= {"accepted", "merged"} and "accepted" in got  # the sync resends the first one
        assert {"bastion", "agenda"} <= {w for u in a2.memory.store.list(viewer=a2.viewer) for w in u.content.split()}
        assert a1.network.withheld["group:g1"] >= 2
    finally:
        for a in agents.values():
            a.close()
        bus.close()


def test_a_receiver_refuses_a_unit_outside_its_scope(memory, keyring):
    ex = Exchange(memory, "me", keyring, clock=Clock(), groups=["blue"])
    unit = Unit(RULE, kind="rule", owner="alice", scope="group:red")
    for scope in ("group:red", "global"):  # the unit's own scope counts, whatever the capsule says
        cap = keyring.sign(Capsule(unit=unit, sender="alice", origin="alice", confidence=0.8, sent_at=1_000_000.0, scope=scope, to=("me",)))
        d = ex.receive(cap)
        assert (d.outcome, d.reason) == ("rejected", "out_of_scope")
    assert memory.store.count(viewer=ADMIN, filter=ANY_STATUS) == 0
    blue = keyring.sign(Capsule(unit=Unit(RULE, kind="rule", scope="group:blue"), sender="alice", origin="alice",
                                confidence=0.8, sent_at=1_000_000.0, scope="group:blue", to=("me",)))
    assert ex.receive(blue).outcome == "accepted"


def test_periodic_sync_collects_group_units_only_for_the_network_to_filter(memory):
    memory.add([Unit("g note", scope="group:g1", owner="a1", created_at=1.0),
                Unit("h note", scope="group:h", owner="a1", created_at=2.0)])
    sync = PeriodicSync(memory, agent="a1", interval_s=1, groups=["g1"])
    assert [u.content for u in sync.collect()] == ["g note"]  # not a group a1 is not in


# -- unit + ledger in one transaction; seen only on commit ----------------------------------


class FlakyKV:
    """Makes the store's ledger writes (appended ``decision`` events) fail N times."""

    def __init__(self, store: SQLiteStore, fail: int) -> None:
        self.store, self.fail = store, fail
        self.real = store.append_event

    def __call__(self, op: str, **kw) -> int:
        if op == "decision" and self.fail > 0:
            self.fail -= 1
            raise StoreError("simulated: disk I/O error while writing the ledger")
        return self.real(op, **kw)


def test_a_failed_ledger_write_keeps_nothing_and_the_redelivery_is_judged_again(tmp_path, keyring):
    """A kill or error between the unit and its ledger record must not leave the unit behind
    (the redelivery would then be 'merged: already_counted') nor burn the capsule id."""
    memory = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(256))
    try:
        memory.store.append_event = FlakyKV(memory.store, fail=1)  # type: ignore[method-assign]
        ex = Exchange(memory, "me", keyring, clock=Clock())
        cap = Capsule.from_dict(capsule_dict(keyring))
        with pytest.raises(StoreError):
            ex.receive(cap)
        assert memory.store.count(viewer=ADMIN, filter=ANY_STATUS) == 0  # the unit went with it
        d = ex.receive(cap)  # redelivery
        assert (d.outcome, d.reason) == ("accepted", "useful")
        assert memory.store.count(viewer=ADMIN, filter=ANY_STATUS) == 1
    finally:
        memory.close()
    # After a restart the capsule is known (committed), and a third delivery is a replay.
    memory = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(256))
    try:
        ex = Exchange(memory, "me", keyring, clock=Clock())
        assert ex.receive(cap).reason == "replay"
        assert [d.reason for d in ex.decisions() if d.outcome != "rejected" or d.reason != "replay"].count("useful") == 1
    finally:
        memory.close()


def test_a_transient_store_error_does_not_mark_the_capsule_seen(memory, keyring, monkeypatch):
    ex = Exchange(memory, "me", keyring, clock=Clock())
    cap = Capsule.from_dict(capsule_dict(keyring))
    real_add = memory.store.add
    calls = {"n": 0}

    def flaky_add(*a, **kw):
        calls["n"] += 1
        if calls["n"] == 1:
            raise StoreError("simulated: database is locked")
        return real_add(*a, **kw)

    monkeypatch.setattr(memory.store, "add", flaky_add)
    with pytest.raises(StoreError):
        ex.receive(cap)
    assert ex.decisions()[-1].reason == "error" and not ex.decisions()[-1].verified
    assert ex.receive(cap).outcome == "accepted"  # not 'replay': at-least-once stays so


def test_a_rejection_after_a_failed_attempt_is_counted_once(memory, keyring):
    """Store errors leave no in-memory trace either: counts match the durable ledger."""
    memory.store.append_event = FlakyKV(memory.store, fail=1)  # type: ignore[method-assign]
    ex = Exchange(memory, "me", keyring, clock=Clock())
    unit = Unit(RULE, kind="rule", owner="alice")
    cap = keyring.sign(Capsule(unit=unit, sender="alice", origin="alice", confidence=0.8, sent_at=0.0, ttl=1.0, to=("me",)))  # expired
    with pytest.raises(StoreError):
        ex.receive(cap)
    assert ex.receive(cap).reason == "expired"
    reloaded = Exchange(memory, "me", keyring, clock=Clock())
    assert [d.reason for d in reloaded.decisions()] == [d.reason for d in ex.decisions()] == ["error", "expired"]


# -- Memory.add is one transaction --------------------------------------------------------


def test_memory_add_is_one_transaction_and_names_the_bad_unit(memory):
    existing = Unit("already here")
    memory.add(existing)
    units = [Unit(f"unit number {i}") for i in range(299)] + [Unit("clash", id=existing.id)]
    with pytest.raises(ValidationError, match=rf"unit 300 of 300, id {existing.id}"):
        memory.add(units, batch_size=256)
    assert memory.store.count(viewer=ADMIN) == 1  # none of the 299 stayed behind
    with pytest.raises(ValidationError, match="unit 2 of 2"):
        memory.add([Unit("fine"), {"content": "a dict"}])  # type: ignore[list-item]
    assert memory.store.count(viewer=ADMIN) == 1


# -- the API raises ValidationError for what the CLI rejects ---------------------------------


@pytest.mark.parametrize(
    "kw",
    [{"k": 2.5}, {"k": 10**20}, {"k": 0}, {"k": True}, {"hops": -1}, {"hops": 1.5}, {"hops": 10**20}],
)
def test_recall_arguments_are_validated(memory, kw):
    memory.add(Unit("something to find"))
    with pytest.raises(ValidationError):
        memory.recall("something", viewer=ADMIN, **kw)


@pytest.mark.parametrize("query", [5, None, "\udcff bad bytes", "x" * 200_001])
def test_recall_query_is_validated(memory, query):
    with pytest.raises(ValidationError):
        memory.recall(query, viewer=ADMIN)  # type: ignore[arg-type]


def test_store_reads_validate_counts(memory):
    store = memory.store
    for call in (
        lambda: store.list(viewer=ADMIN, limit=10**20),
        lambda: store.list(viewer=ADMIN, limit=2.5),
        lambda: store.list(viewer=ADMIN, offset=-1),
        lambda: store.keyword_search("x", k=10**20, viewer=ADMIN),
        lambda: store.keyword_search(5, k=1, viewer=ADMIN),
        lambda: store.vector_search(np.ones(4), k=2.5, viewer=ADMIN),
        lambda: store.vector_search(["a", "b"], k=1, viewer=ADMIN),
        lambda: store.events(viewer=ADMIN, limit=10**20),
    ):
        with pytest.raises(ValidationError):
            call()


# -- damaged and read-only database files ---------------------------------------------------


def _filled(path, n: int = 400) -> list[Unit]:
    units = [Unit(f"unit number {i} " + "padding " * 40) for i in range(n)]
    with SQLiteStore(path) as s:
        s.add(units, np.random.default_rng(0).normal(size=(n, 16)).astype(np.float32))
    return units


def test_a_database_with_corrupt_pages_refuses_writes(tmp_path):
    import os

    db = tmp_path / "x.db"
    _filled(db)
    size = db.stat().st_size
    with db.open("r+b") as fh:  # a torn page in the middle of the file
        fh.seek(4096 * (size // 4096 // 2))
        fh.write(os.urandom(4096))
    s = SQLiteStore(db)
    with pytest.raises(StoreError, match="corrupt"):
        s.add([Unit("new")], np.ones((1, 16), dtype=np.float32))
    with pytest.raises(StoreError, match="corrupt"):
        s.import_records([{"record": "unit", "content": "also new"}])
    s.close()


def test_corruption_met_by_a_read_stops_writes(tmp_path, monkeypatch):
    import sqlite3

    db = tmp_path / "x.db"
    _filled(db, 5)
    s = SQLiteStore(db)
    s.add([Unit("fine")], np.ones((1, 16), dtype=np.float32))  # passed its check
    err = sqlite3.DatabaseError("database disk image is malformed")
    err.sqlite_errorcode = sqlite3.SQLITE_CORRUPT
    s._seen_error(err)  # what _q does when a query hits a bad page
    with pytest.raises(StoreError, match="corrupt"):
        s.add([Unit("refused")], np.ones((1, 16), dtype=np.float32))
    s.close()


def test_a_read_only_database_can_be_read(tmp_path, monkeypatch):
    db = tmp_path / "ro.db"
    units = _filled(db, 20)
    monkeypatch.setattr("forge.store.sqlite._writable", lambda path: False)  # as for a non-root user
    mem = Memory(SQLiteStore(db), HashingEmbedder(16))
    assert mem.store.readonly
    assert mem.store.count(viewer=ADMIN) == 20
    assert mem.store.vector_search(np.random.default_rng(0).normal(size=(20, 16))[3], k=1, viewer=ADMIN)[0].id == units[3].id
    assert mem.recall("unit number 7", viewer=ADMIN)  # touch() is skipped, not an error
    with pytest.raises(StoreError, match="read-only"):
        mem.store.add([Unit("no")], np.ones((1, 16), dtype=np.float32))
    mem.close()


def test_a_database_on_a_read_only_file_system_can_be_read(tmp_path):
    """For real: no write to the file or its directory (the WAL's -shm cannot be made)."""
    import os
    import shutil
    import subprocess
    import sys

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) to mount a read-only file system")
    src, mnt = tmp_path / "src", tmp_path / "mnt"
    src.mkdir()
    mnt.mkdir()
    _filled(src / "ro.db", 10)
    script = (
        "from forge.engine.embed import HashingEmbedder\nfrom forge.engine.memory import Memory\n"
        "from forge.store import SQLiteStore\nfrom forge.model import Viewer\n"
        f"m = Memory(SQLiteStore({str(mnt / 'ro.db')!r}), HashingEmbedder(16))\n"
        "hits = m.recall('unit number 3', viewer=Viewer.admin(), k=1)\n"
        "print(m.store.readonly, m.store.count(viewer=Viewer.admin()), len(hits)); m.close()\n"
    )
    shell = (
        f"mount --bind {src} {mnt} && mount -o remount,bind,ro {mnt} && "
        f"exec {sys.executable} -c \"$FORGE_SCRIPT\""
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "FORGE_SCRIPT": script}
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("this machine does not allow a private mount namespace")
    out = subprocess.run(["unshare", "-m", "sh", "-c", shell], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-500:]
    assert out.stdout.split() == ["True", "10", "1"]
    assert sorted(p.name for p in src.iterdir()) == ["ro.db"]  # nothing was written beside it


# -- issue 25: command-line breaks ----------------------------------------------------------
def _forge(capsys, *args: str) -> tuple[int, str, str]:
    """``forge ARGS`` through the real entry point: its exit status, stdout and stderr."""
    from forge.cli import main

    with pytest.raises(SystemExit) as stop:
        main(list(args))
        raise SystemExit(0)
    out = capsys.readouterr()
    return int(stop.value.code or 0), out.out, out.err


def _one_line_error(code: int, err: str, expected: int = 2) -> str:
    assert code == expected, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    return err


@pytest.fixture
def filled_db(tmp_path, capsys):
    db = tmp_path / "x.db"
    assert _forge(capsys, "--db", str(db), "--embedder", "hash:64", "add", "When the ice is thin, step back.")[0] == 0
    return db


@pytest.mark.parametrize("kind", ["fifo", "symlink", "device"])
def test_export_refuses_what_is_not_a_regular_file_and_leaves_it(tmp_path, capsys, filled_db, kind):
    import os
    import stat

    target = tmp_path / "out"
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "symlink":
        (tmp_path / "real.jsonl").write_text("kept\n")
        target.symlink_to(tmp_path / "real.jsonl")
    else:
        target = Path("/dev/null")
    before = os.lstat(target)
    code, _, err = _forge(capsys, "--db", str(filled_db), "export", str(target))
    assert kind.replace("fifo", "FIFO").replace("symlink", "symbolic link") in _one_line_error(code, err)
    after = os.lstat(target)
    assert (after.st_ino, stat.S_IFMT(after.st_mode)) == (before.st_ino, stat.S_IFMT(before.st_mode))
    if kind == "symlink":
        assert (tmp_path / "real.jsonl").read_text() == "kept\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.")]  # no temporary file left


def test_export_still_replaces_a_regular_file(tmp_path, capsys, filled_db):
    target = tmp_path / "out.jsonl"
    target.write_text("old\n")
    assert _forge(capsys, "--db", str(filled_db), "export", str(target))[0] == 0
    assert "thin" in target.read_text()


@pytest.mark.parametrize("spec", ["hash:0", "hash:-5", "bogus:thing", "hash:99999999999", "hash:x", "openai:"])
def test_a_bad_embedder_creates_nothing_on_disk(tmp_path, capsys, spec):
    db = tmp_path / "new.db"
    code, _, err = _forge(capsys, "--db", str(db), "--embedder", spec, "add", "a rule")
    _one_line_error(code, err)
    assert "internal error" not in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("port", ["99999", "-1", "0", "65536"])
def test_serve_refuses_ports_out_of_range_in_one_line(tmp_path, capsys, port):
    pytest.importorskip("fastapi")
    code, _, err = _forge(capsys, "--db", str(tmp_path / "s.db"), "serve", "--port", port)
    assert "between 1 and 65535" in _one_line_error(code, err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("query", ["", "   "])
def test_recall_of_nothing_is_a_user_error_not_every_unit(capsys, filled_db, query):
    code, out, err = _forge(capsys, "--db", str(filled_db), "recall", query)
    assert "query is empty" in _one_line_error(code, err) and out == ""


@pytest.mark.parametrize("before", ["nan", "inf", "-1"])
def test_audit_refuses_a_before_that_is_no_time(capsys, filled_db, before):
    pytest.importorskip("fastapi")
    code, _, err = _forge(capsys, "--db", str(filled_db), "audit", "--before", before)
    assert "--before" in _one_line_error(code, err)


def test_an_exact_text_match_is_recalled_when_the_vector_index_misses_it(memory, monkeypatch):
    """HNSW is approximate (3 of 3,000 units were not found by their own vector at k=10 on a
    20,000-unit store, 0 of 3,000 by hybrid recall): the keyword path finds the exact text."""
    texts = [f"When the {w} door is locked, look under the {v} mat." for w in ("red", "blue", "green") for v in ("door", "porch")]
    ids = memory.add([Unit(t) for t in texts])
    monkeypatch.setattr(memory.store, "vector_search", lambda *a, **k: [])  # the ANN index returns nothing
    for uid, text in zip(ids, texts, strict=True):
        hits = memory.recall(text, viewer=ADMIN, k=1, touch=False)
        assert [h.unit.id for h in hits] == [uid]
