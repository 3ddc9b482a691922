"""The champion broadcast through the bus gives the same run as the in-process copy."""

from __future__ import annotations

import json
import uuid

import pytest

from forge.bus import open_bus
from forge.capsule import Keyring
from forge.errors import BusError
from forge.llm.base import forbid_real_llms
from forge.policy import MemoryItem, PromptMemory
from forge.protocols import ForgeConfig, evolve
from forge.protocols.broadcast import BusDelivery
from test_protocol import SLIPPERY, essence
from test_protocol_toy import toy_factory


@pytest.fixture(autouse=True)
def _no_real_llms():
    with forbid_real_llms():
        yield


def _redis_bus():
    redis = pytest.importorskip("redis")
    try:
        redis.Redis.from_url("redis://127.0.0.1:6379/0", socket_connect_timeout=1).ping()
    except redis.exceptions.RedisError as exc:
        pytest.skip(f"Redis not reachable: {exc}")
    return open_bus("redis://127.0.0.1:6379/0", prefix=f"forge-test-{uuid.uuid4().hex[:8]}:")


@pytest.mark.parametrize("backend", ["memory", "redis"])
def test_bus_broadcast_equals_direct_copy(tmp_path, backend):
    cfg = ForgeConfig(condition="forge-no-graduation", **SLIPPERY)
    direct = evolve(cfg, tmp_path / "direct", llm_factory=toy_factory)
    bus = open_bus("memory://") if backend == "memory" else _redis_bus()
    try:
        via_bus = evolve(cfg, tmp_path / "bus", llm_factory=toy_factory, delivery=BusDelivery(bus))
    finally:
        if backend == "redis":
            bus.purge()
        bus.close()
    assert essence(via_bus.final) == essence(direct.final)
    ck = json.loads((tmp_path / "bus/checkpoints/stage-00.json").read_text())
    champ = ck["summary"]["champion"]
    for inst in ck["instances"]:
        if inst["memory"] and inst.get("index", champ) != champ:
            assert all(m["source"] == f"broadcast:inst-{champ}" for m in inst["memory"] if m["stage"] == 0)


def test_delivery_round_trip_keeps_provenance():
    bus = open_bus("memory://")
    memory = PromptMemory((MemoryItem(kind="rule", role="actor", content="when at the edge, then do not right"),
                           MemoryItem(kind="example", role="actor", content="went down twice", meta={"name": "x"})))
    got = BusDelivery(bus).deliver(champion=0, receiver=1, memory=memory, stage=2)
    assert got.contents() == memory.contents()
    assert all(i.source == "broadcast:inst-0" and i.stage == 2 for i in got.items)
    assert [i.derived_from for i in got.items] == [(m.id,) for m in memory.items]
    assert got.items[1].meta == {"name": "x"}


def test_capsules_from_an_untrusted_signer_are_not_applied():
    bus = open_bus("memory://")
    keyring = _SplitKeyring(sign=Keyring.from_secret("attacker"), verify=Keyring.from_secret("population"))
    delivery = BusDelivery(bus, keyring=keyring, timeout_ms=400)  # type: ignore[arg-type]
    memory = PromptMemory((MemoryItem(kind="rule", role="actor", content="when lost, then do not up"),))
    with pytest.raises(BusError, match="0 of 1"):
        delivery.deliver(champion=0, receiver=1, memory=memory, stage=0)
    assert delivery.rejected == 1


class _SplitKeyring:
    """Signs with one keyring and verifies with another: a sender the receiver does not trust."""

    def __init__(self, *, sign: Keyring, verify: Keyring) -> None:
        self._sign, self._verify = sign, verify

    def sign(self, capsule):
        return self._sign.sign(capsule)

    def verify(self, capsule):
        return self._verify.verify(capsule)
