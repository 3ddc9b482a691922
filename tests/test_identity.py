"""Per-agent identity: each agent signs as itself only, and a capsule is for its recipients only.

The attacks here worked on the shared-master HMAC scheme: an insider signed as another
agent, a capsule lifted from one inbox was accepted by another, and a forwarder could
rewrite what it relayed and sign the result itself.
"""

from __future__ import annotations

import dataclasses
import json
import os
import stat
import sys
import time

import pytest

from fakes import Clock
from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.errors import ConfigError, ValidationError
from forge.model import Unit, Viewer
from forge.share.bus import MemoryBus, Network
from forge.share.capsule import Capsule, Keyring
from forge.share.exchange import Exchange
from forge.share.identity import Identity
from forge.share.topology import FullMesh, Ring
from forge.store import SQLiteStore

RULE = "When the door is locked, look for a key first."
T0 = time.time()  # real time: inboxes check expiry against the wall clock


@pytest.fixture(autouse=True)
def _now(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test's "now", not the module's import time: a relayed capsule is stamped with the
    wall clock, and in a 10-minute suite run the exchange's fixed clock (T0) fell that far
    behind it and refused the relay as sent from the future."""
    monkeypatch.setattr(sys.modules[__name__], "T0", time.time())


@pytest.fixture
def population() -> Keyring:
    """Keys for everyone, as a simulation in one process holds them."""
    return Keyring.generate(["alice", "bob", "mallory", "me"])


def exchange(memory: Memory, keyring: Keyring, agent: str = "me") -> Exchange:
    # What a receiver holds: its own private key and everyone's public keys.
    return Exchange(memory, agent, keyring.for_agent(agent), clock=Clock(T0))


def capsule(text: str = RULE, *, sender: str = "alice", origin: str | None = None, to=("me",)) -> Capsule:
    origin = origin or sender
    unit = Unit(text, kind="rule", owner=origin, scope="private", confidence=0.8)
    return Capsule(unit=unit, sender=sender, origin=origin, confidence=0.8, sent_at=T0, to=tuple(to))


def test_an_honest_capsule_is_accepted(population: Keyring, memory: Memory) -> None:
    alice = population.for_agent("alice")
    d = exchange(memory, population).receive(alice.sign(capsule()))
    assert (d.outcome, d.reason) == ("accepted", "useful")
    stored = memory.get(d.unit_id, viewer=Viewer.admin())
    assert stored.meta["origin"] == "alice" and stored.meta["origin_sig"].startswith("ed25519:")
    assert "via" not in stored.meta  # the origin proved itself


# -- forged origin ----------------------------------------------------------------------------


def test_an_agent_cannot_sign_as_another(population: Keyring, memory: Memory) -> None:
    mallory = population.for_agent("mallory")
    with pytest.raises(ValidationError, match="no signing key"):
        mallory.sign(capsule(sender="alice"))
    with pytest.raises(ValidationError, match="cannot vouch for origin 'alice'"):
        mallory.sign(capsule(sender="mallory", origin="alice"))
    ex = exchange(memory, population)
    # Mallory's own signature under alice's name, as sender and as origin: both refused.
    as_alice = dataclasses.replace(mallory.sign(capsule(sender="mallory")), sender="alice", origin="alice")
    assert ex.receive(as_alice).reason == "tampered"
    own = mallory.sign(capsule(sender="mallory"))
    claimed = mallory.sign(dataclasses.replace(own, origin="alice", signature=""))  # alice never signed this
    assert ex.receive(claimed).reason == "forged_origin"
    with pytest.raises(ValidationError):  # an invented author cannot be signed for at all
        mallory.sign(dataclasses.replace(own, origin="ghost-1", origin_sig="", signature=""))
    ghost = mallory.sign(dataclasses.replace(own, origin="ghost-1", signature="", id="x2"))
    assert ex.receive(ghost).reason == "forged_origin"  # unknown origin: nobody to check it against
    assert memory.store.count(viewer=Viewer.admin()) == 0


def test_forged_origin_under_the_shared_master_was_accepted_and_is_refused_per_agent(memory: Memory) -> None:
    """The old scheme's hole, kept visible: with one master every insider signs as anyone."""
    shared = Keyring.from_secret("population")
    # a harmless text: the point is the signature (harmful advice is now held by the screen)
    text = "When the queue backs up, add one more worker."
    forged = shared.sign(capsule(sender="alice", text=text))  # by mallory
    assert Exchange(memory, "me", shared, clock=Clock(T0)).receive(forged).outcome == "accepted"
    keys = Keyring.generate(["alice", "mallory", "me"])
    mallory = keys.for_agent("mallory")
    with pytest.raises(ValidationError):
        mallory.sign(capsule(sender="alice", text=text))


# -- replay into another inbox -----------------------------------------------------------------


@pytest.mark.parametrize("scheme", ["ed25519", "hmac"])
def test_a_capsule_for_one_inbox_is_refused_by_another(scheme: str) -> None:
    keys = Keyring.generate(["a", "b", "c"]) if scheme == "ed25519" else Keyring.from_secret("s3cret")
    bus = MemoryBus()
    net = Network(bus, FullMesh(["a", "b", "c"]), keyring=keys)
    inbox_b, inbox_c = net.inbox("b"), net.inbox("c")
    net.send_to(capsule(RULE, sender="a", to=()), ["b"])
    (msg,) = bus.subscribe("inbox.b", consumer="spy").read()
    bus.publish("inbox.c", msg.payload)  # lifted from b's inbox, replayed into c's
    assert [d.capsule.unit.content for d in inbox_b.read()] == [RULE]
    assert inbox_c.read() == []
    assert inbox_c.rejected == {"not addressed to 'c'": 1}
    # The same at the exchange, for capsules that come by any other path.
    with Memory(SQLiteStore(":memory:"), HashingEmbedder(256)) as m:
        ex_c = Exchange(m, "c", keys, clock=Clock(T0))
        d = ex_c.receive(Capsule.from_json(msg.payload))
        assert (d.outcome, d.reason) == ("rejected", "misdirected")
        # Re-addressing is tampering: the recipients are under the sender's signature.
        readdressed = dataclasses.replace(Capsule.from_json(msg.payload), to=("c",))
        assert ex_c.receive(readdressed).reason == "tampered"


def test_a_capsule_for_several_recipients_is_accepted_by_each_once(population: Keyring) -> None:
    alice = population.for_agent("alice")
    cap = alice.sign(capsule(to=("bob", "me")))
    for agent in ("bob", "me"):
        with Memory(SQLiteStore(":memory:"), HashingEmbedder(256)) as m:
            ex = exchange(m, population, agent)
            assert ex.receive(cap).outcome == "accepted"
            assert ex.receive(cap).reason == "replay"
    with Memory(SQLiteStore(":memory:"), HashingEmbedder(256)) as m:
        assert exchange(m, population, "mallory").receive(cap).reason == "misdirected"


# -- tampered content --------------------------------------------------------------------------


def test_tampered_content_is_refused_even_when_the_forwarder_re_signs_it(population: Keyring, memory: Memory) -> None:
    alice, mallory = population.for_agent("alice"), population.for_agent("mallory")
    original = alice.sign(capsule(to=("mallory",)))
    ex = exchange(memory, population)
    edited = dataclasses.replace(original, to=("me",), unit=original.unit.replace(content="When the door is locked, smash it."))
    assert ex.receive(edited).reason == "tampered"  # content hash and signature both off
    # Mallory relays alice's unit with new words and signs the envelope herself: alice's
    # signature over what she wrote still travels, and no longer matches.
    relayed = original.forwarded(by="mallory")
    rewritten = mallory.sign(
        dataclasses.replace(relayed, unit=relayed.unit.replace(content="When the door is locked, smash it."), hash="").addressed(["me"])
    )
    d = ex.receive(rewritten)
    assert (d.outcome, d.reason) == ("rejected", "forged_origin")
    # Relayed unchanged, it is alice's rule and counts as hers.
    honest = mallory.sign(relayed.addressed(["me"]))
    d = ex.receive(honest)
    assert d.outcome == "accepted" and d.origin == "alice"
    assert memory.store.count(viewer=Viewer.admin()) == 1


def test_relays_and_re_broadcasts_keep_the_authors_signature(population: Keyring) -> None:
    bus = MemoryBus()
    net = Network(bus, Ring(["alice", "bob", "me"], k=1), keyring=population)
    inboxes = {a: net.inbox(a) for a in ("alice", "bob", "me")}
    net.send(capsule(sender="alice", to=()))
    seen: dict[str, list[Capsule]] = {}
    for _ in range(3):
        for a, ib in inboxes.items():
            net.pump(a, ib, handle=lambda c, a=a: seen.setdefault(a, []).append(c))
    assert {a: [c.origin for c in caps] for a, caps in seen.items()} == {"bob": ["alice"], "me": ["alice"]}
    assert all(ib.rejected == {} for ib in inboxes.values())
    # A unit stored by an exchange, sent on later by its receiver, still proves its author.
    with Memory(SQLiteStore(":memory:"), HashingEmbedder(256)) as m:
        bob = Exchange(m, "bob", population.for_agent("bob"), clock=Clock(T0))
        d = bob.receive(population.for_agent("alice").sign(capsule(to=("bob",))))
        stored = m.get(d.unit_id, viewer=Viewer.admin())
    again = population.for_agent("bob").sign(Capsule.of(stored, sender="bob").addressed(["me"]))
    assert again.origin == "alice" and population.verify(again, recipient="me") is None


# -- keys and key files ------------------------------------------------------------------------


def test_key_files_round_trip_and_stay_private(tmp_path, population: Keyring) -> None:
    ident = Identity.generate("alice")
    path = ident.save(tmp_path / "alice.key")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert "private" not in repr(ident) and Identity.load(path).public_b64 == ident.public_b64
    ring_file = Keyring.ed25519({"alice": ident.public_b64, "bob": population.identity("bob").public_bytes}).save_public(tmp_path / "ring.json")
    assert set(json.loads(ring_file.read_text())["agents"]) == {"alice", "bob"}
    alice = Keyring.load(ring_file, identity=path)
    signed = alice.sign(capsule(to=("bob",)))
    bob_view = Keyring.load(ring_file)
    assert bob_view.verify(signed, recipient="bob") is None
    with pytest.raises(ValidationError):
        bob_view.sign(capsule(sender="bob"))  # public keys only: bob's own key is not in the file
    (tmp_path / "bad.json").write_text('{"agents": {"x": "not base64!"}}')
    with pytest.raises(ConfigError):
        Keyring.load(tmp_path / "bad.json")
    with pytest.raises(ConfigError):
        Identity.load(tmp_path / "missing.key")


def test_signatures_of_one_scheme_do_not_pass_the_other(population: Keyring) -> None:
    hmac_signed = Keyring.from_secret("x").sign(capsule(to=("me",)))
    assert population.verify(hmac_signed) == "bad signature"
    ed_signed = population.sign(capsule(to=("me",)))
    assert Keyring.from_secret("x").verify(ed_signed) == "bad signature"
    garbage = dataclasses.replace(ed_signed, signature="ed25519:!!!")
    assert population.verify(garbage) == "bad signature"


def test_random_keyring_makes_keys_on_first_use_in_one_process() -> None:
    ring = Keyring.random()
    assert ring.scheme == "ed25519"
    cap = ring.sign(capsule(sender="x", to=("y",)))
    assert ring.verify(cap, recipient="y") is None
    assert Keyring.random().verify(cap) == "unknown sender 'x'"  # another process's keys


def test_agents_opened_with_their_own_keys_exchange_and_cannot_impersonate(population: Keyring) -> None:
    from forge.population.agent import Agent

    bus = MemoryBus()
    ids = ["alice", "bob", "mallory"]
    agents = {a: Agent.open(a, bus=bus, agents=ids, keyring=population.for_agent(a)) for a in ids}
    try:
        agents["alice"].broadcast(Unit("when the bridge shakes, then cross it one at a time", kind="rule"))
        assert [d.outcome for d in agents["bob"].pump()] == ["accepted"]
        # Mallory's process holds only her own key: speaking as alice fails at her end.
        with pytest.raises(ValidationError):
            agents["mallory"].network.send(capsule("when the bridge shakes, then jump", sender="alice", to=()))
    finally:
        for a in agents.values():
            a.close()
        bus.close()
