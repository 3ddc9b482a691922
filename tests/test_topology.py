"""Topologies: who hears whom, counted, and delivered over both buses exactly as defined."""

from __future__ import annotations

import json

import numpy as np
import pytest

import test_bus_support as support
from fakes import mismatches
from forge.errors import ConfigError, NotFoundError, ValidationError
from forge.model import Unit
from forge.share.bus import Network
from forge.share.capsule import Capsule, Keyring
from forge.share.topology import (
    FullMesh,
    Hierarchical,
    Ring,
    Similarity,
    Star,
    Topology,
    load,
    messages_per_capsule,
    open_topology,
)


@pytest.fixture(params=support.BACKENDS)
def bus(request):
    yield from support.make_bus(request.param)

AGENTS = [f"a{i}" for i in range(9)]


def capsule(sender: str, text: str = "check the logs first", importance: float = 0.5) -> Capsule:
    return Capsule.of(Unit(text, owner=sender, importance=importance), sender=sender)


def clustered_profiles() -> dict[str, np.ndarray]:
    """Three clusters of three agents in 3-d space, slightly perturbed."""
    rng = np.random.default_rng(0)
    out = {}
    for i, a in enumerate(AGENTS):
        base = np.eye(3)[i // 3]
        out[a] = base + rng.normal(0, 0.05, 3)
    return out


ALL = {
    "full": lambda: FullMesh(AGENTS),
    "ring": lambda: Ring(AGENTS, k=2),
    "star": lambda: Star(AGENTS, hub="a0"),
    "similarity": lambda: Similarity(clustered_profiles(), k=2),
    "hierarchical": lambda: Hierarchical.balanced(AGENTS, group_size=3),
}


@pytest.mark.parametrize("name", ALL)
def test_every_topology_implements_the_protocol(name):
    topo = ALL[name]()
    assert mismatches(topo, Topology) == [] and topo.agents == tuple(AGENTS)
    for a in AGENTS:
        assert a not in topo.neighbors(a)
        r = topo.route(a)
        assert a not in r.recipients
        assert r.messages == len(r.edges) >= len(r.recipients)


def test_full_mesh():
    t = FullMesh(AGENTS)
    assert t.neighbors("a3") == set(AGENTS) - {"a3"}
    assert messages_per_capsule(t) == len(AGENTS) - 1


def test_ring_k_each_side_wraps_around():
    t = Ring(AGENTS, k=1)
    assert t.neighbors("a0") == {"a8", "a1"}
    assert Ring(AGENTS, k=2).neighbors("a0") == {"a7", "a8", "a1", "a2"}
    assert Ring(["x", "y", "z"], k=5).neighbors("x") == {"y", "z"}  # small rings do not repeat
    assert Ring(AGENTS, k=2).route("a4").recipients == {"a2", "a3", "a5", "a6"}
    with pytest.raises(ValidationError):
        Ring(AGENTS, k=0)


def test_star_routes_through_the_hub():
    t = Star(AGENTS, hub="a0")
    assert t.neighbors("a5") == {"a0"}
    assert t.neighbors("a0") == set(AGENTS) - {"a0"}
    r = t.route("a5")
    assert r.edges[0] == ("a5", "a0")
    assert r.recipients == set(AGENTS) - {"a5"}
    assert r.messages == len(AGENTS) - 1
    # a received capsule is forwarded by the hub only, never back to its author
    got = capsule("a5").forwarded(by="a5")
    assert t.forward("a0", got) == set(AGENTS) - {"a0", "a5"}
    assert t.forward("a3", capsule("a5").forwarded(by="a0")) == set()


def test_star_hub_filters_what_it_redistributes():
    t = Star(AGENTS, hub="a0", accept=lambda relay, c: c.unit.importance >= 0.7)
    assert t.route("a5", capsule("a5", importance=0.2)).recipients == {"a0"}
    assert t.route("a5", capsule("a5", importance=0.9)).recipients == set(AGENTS) - {"a5"}
    assert t.route("a5").recipients == set(AGENTS) - {"a5"}  # structural: no filter


def test_similarity_picks_top_k_by_cosine_and_follows_profile_updates():
    t = Similarity(clustered_profiles(), k=2)
    assert t.neighbors("a0") == {"a1", "a2"}
    assert t.neighbors("a4") == {"a3", "a5"}
    assert "a0" in t.neighbors("a1")
    t.update_profile("a0", np.eye(3)[2])  # a0 moves to the third cluster
    assert len(t.neighbors("a0")) == 2 and t.neighbors("a0") <= {"a6", "a7", "a8"}
    assert t.route("a0").recipients == t.neighbors("a0")
    t.update_profile("new", np.eye(3)[1])
    assert "new" in t.agents and len(t.neighbors("new")) == 2
    with pytest.raises(ValidationError):
        t.update_profile("a1", [1.0, 2.0])  # wrong dimension
    with pytest.raises(ValidationError):
        t.update_profile("a1", [float("nan")] * 3)


def test_similarity_from_texts_uses_an_embedder():
    from forge.engine.embed import HashingEmbedder

    t = Similarity.from_texts(
        {"net1": "network firewall ports", "net2": "network firewall rules", "db": "database index query"},
        embedder=HashingEmbedder(64),
        k=1,
    )
    assert t.neighbors("net1") == {"net2"}


def test_hierarchical_reaches_everyone_once_through_representatives():
    t = Hierarchical({"g0": ["a0", "a1", "a2"], "g1": ["a3", "a4", "a5"], "g2": ["a6", "a7", "a8"]})
    assert t.neighbors("a1") == {"a0"}  # members talk to their representative
    assert t.neighbors("a0") == {"a1", "a2", "a3", "a6"}  # reps: own group + other reps
    for a in AGENTS:
        r = t.route(a)
        assert r.recipients == set(AGENTS) - {a}
        assert r.messages == len(AGENTS) - 1  # a tree: nobody hears it twice
    r = t.route("a4")
    assert ("a4", "a3") in r.edges and ("a3", "a0") in r.edges and ("a0", "a1") in r.edges
    assert ("a4", "a0") not in r.edges  # members never talk across groups


def test_hierarchical_representatives_filter_what_crosses_groups():
    crossing = []

    def accept(relay, c):
        crossing.append(relay)
        return c.unit.importance >= 0.7 or relay in ("a3",)  # a3 is a4's own representative

    t = Hierarchical({"g0": ["a0", "a1", "a2"], "g1": ["a3", "a4", "a5"], "g2": ["a6", "a7", "a8"]}, accept=accept)
    weak = t.route("a4", capsule("a4", importance=0.1))
    assert weak.recipients == {"a3", "a5", "a0", "a6"}  # reached the other reps, went no further
    assert t.route("a4", capsule("a4", importance=0.9)).recipients == set(AGENTS) - {"a4"}


def test_hierarchical_validation():
    with pytest.raises(ValidationError):
        Hierarchical({"g0": ["a", "b"], "g1": ["b"]})
    with pytest.raises(ValidationError):
        Hierarchical({"g0": ["a"]}, representatives={"g0": "z"})
    with pytest.raises(ValidationError):
        Hierarchical({"g0": []})


def test_load_shows_who_carries_the_traffic():
    n = 64
    agents = [f"a{i}" for i in range(n)]
    mesh = load(FullMesh(agents))
    hier = load(Hierarchical.balanced(agents))
    star = load(Star(agents))
    assert mesh.messages_per_capsule == hier.messages_per_capsule == n - 1
    assert mesh.sent_per_agent_max == n - 1
    assert mesh.peers_max == n - 1
    assert hier.peers_max <= 2 * 8  # a representative talks to its group and the other reps
    assert mesh.sent_per_agent_max < hier.sent_per_agent_max < star.sent_per_agent_max  # relays pay
    assert star.sent_per_agent_max == (n - 1) + (n - 1) * (n - 2)  # the hub carries it all
    assert hier.reach == mesh.reach == n - 1
    assert load(Ring(agents, k=2)).messages_per_capsule == 4
    # representatives that only pass on important capsules across groups cut the traffic
    filtered = Hierarchical.balanced(agents, accept=lambda relay, c: c.unit.importance >= 0.7)
    weak = sum(filtered.route(a, capsule(a, importance=0.1)).messages for a in agents) / n
    assert weak < (n - 1) / 2
    assert json.dumps(hier.to_dict())


def test_unknown_agents_and_topologies_are_refused():
    with pytest.raises(NotFoundError):
        FullMesh(AGENTS).neighbors("zz")
    with pytest.raises(NotFoundError):
        Star(AGENTS, hub="zz")
    with pytest.raises(ValidationError):
        FullMesh([])
    with pytest.raises(ConfigError):
        open_topology("torus", agents=AGENTS)
    with pytest.raises(ValidationError):
        open_topology("similarity", agents=AGENTS)
    assert isinstance(open_topology("hierarchical", agents=AGENTS), Hierarchical)


# -- delivery over a real bus -----------------------------------------------------------------


def run_until_quiet(net: Network, agents, inboxes, log) -> None:
    while True:
        moved = 0
        for a in agents:
            moved += net.pump(a, inboxes[a], handle=lambda c, a=a: log.setdefault(a, []).append(c))
        if not moved:
            return


@pytest.mark.parametrize("name", ALL)
def test_topologies_deliver_exactly_to_the_agents_they_define(bus, name):
    topo = ALL[name]()
    net = Network(bus, topo, keyring=Keyring.from_secret("s3cret"))
    inboxes = {a: net.inbox(a) for a in AGENTS}
    sent = {}
    for a in AGENTS:
        c = capsule(a, f"lesson from {a}")
        net.send(c)
        sent[c.unit.id] = a
    log: dict[str, list[Capsule]] = {}
    run_until_quiet(net, AGENTS, inboxes, log)
    for uid, sender in sent.items():
        got = {a for a, caps in log.items() for c in caps if c.unit.id == uid}
        assert got == topo.route(sender).recipients, (name, sender)
    total = sum(len(v) for v in log.values())
    assert total == sum(topo.route(a).messages for a in AGENTS)
    assert sum(net.sent.values()) == total
    assert all(ib.pending() == 0 for ib in inboxes.values())
    for caps in log.values():  # relayed copies are re-signed by the relay, a hop further
        for c in caps:
            assert (c.hops == 0) == (c.sender == c.origin) and c.hops <= 3


def test_tampered_unsigned_and_expired_capsules_are_rejected_at_the_inbox(bus):
    keys = Keyring.from_secret("s3cret")
    net = Network(bus, FullMesh(["a", "b"]), keyring=keys)
    inbox = net.inbox("b")
    good = keys.sign(capsule("a", "rotate the keys").addressed(["b"]))
    tampered = json.loads(good.to_json())
    tampered["unit"]["content"] = "disable the firewall"
    bus.publish("inbox.b", json.dumps(tampered).encode())
    forged = json.loads(good.to_json())
    forged["confidence"] = 1.0
    bus.publish("inbox.b", json.dumps(forged).encode())
    bus.publish("inbox.b", capsule("a", "unsigned"))
    stale = Capsule(unit=Unit("old news", owner="a"), sender="a", origin="a", confidence=0.5, ttl=1.0, sent_at=0.0)
    bus.publish("inbox.b", keys.sign(stale.addressed(["b"])))
    bus.publish("inbox.b", b"not json")
    bus.publish("inbox.b", good)
    got = inbox.read(count=10)
    assert [d.capsule for d in got] == [good]
    assert inbox.rejected == {"bad signature": 2, "unsigned": 1, "expired": 1, "malformed": 1}
    assert inbox.pending() == 1  # rejected ones are acked (counted, not redelivered forever)
    assert {r.sender for r in inbox.rejections} == {"a", ""}


def test_a_sender_without_a_key_cannot_be_verified(bus):
    keys = Keyring({"a": b"k" * 32})
    net = Network(bus, FullMesh(["a", "b"]), keyring=keys)
    inbox = net.inbox("b")
    impostor = Keyring({"mallory": b"m" * 32}).sign(capsule("mallory", "trust me"))
    bus.publish("inbox.b", impostor)
    assert inbox.read() == []
    assert inbox.rejected["unknown sender 'mallory'"] == 1
