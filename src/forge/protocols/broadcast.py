"""Champion broadcast over the bus: the FORGE protocol's delivery through ``forge.share.bus``.

The in-process :class:`~forge.protocols.forge.DirectDelivery` copies the champion's units
straight into each receiver. :class:`BusDelivery` sends the same units as signed capsules over
any :class:`~forge.share.bus.base.Bus` (in-process or Redis Streams) to the receiver's topic; each
capsule goes through the receiver's :class:`~forge.share.exchange.Exchange` (verify, screen, judge),
and only the units it accepts replace the receiver's memory, so a population spread over
processes or machines evolves like one in a single process, with the same defences.
"""

from __future__ import annotations

from collections.abc import Sequence

from forge.engine.memory import Memory
from forge.errors import BusError
from forge.model import Unit, new_id
from forge.protocols.forge import champion_copy
from forge.share.bus.base import Bus
from forge.share.capsule import Capsule, Keyring
from forge.share.exchange import Exchange

__all__ = ["BusDelivery"]

_ADMITTED = ("accepted", "merged", "corroborated")


class BusDelivery:
    """Broadcast with replacement through a bus; one topic per receiving instance.

    ``embedder`` names the embedder of the receivers' exchanges (novelty and conflict checks).
    ``decisions`` counts what the exchanges decided, e.g. ``{"accepted": 12, "quarantined": 1}``.
    """

    def __init__(self, bus: Bus, *, keyring: Keyring | None = None, topic_prefix: str = "forge.champion.",
                 timeout_ms: int = 10_000, embedder: str = "hash") -> None:
        self.bus = bus
        self.keyring = keyring or Keyring.random()
        self.topic_prefix = topic_prefix
        self.timeout_ms = timeout_ms
        self.embedder = embedder
        self.rejected = 0
        self.decisions: dict[str, int] = {}

    def _topic(self, receiver: int) -> str:
        return f"{self.topic_prefix}inst-{receiver}"

    def deliver(self, *, champion: int, receiver: int, units: Sequence[Unit], stage: int) -> list[Unit]:
        sender = f"inst-{champion}"
        batch = new_id()  # ties this delivery's capsules together on a shared topic
        topic = self._topic(receiver)
        sub = self.bus.subscribe(topic, consumer=f"inst-{receiver}", start="latest")
        inbox = Memory.open(":memory:", embedder=self.embedder)
        exchange = Exchange(inbox, f"inst-{receiver}", self.keyring)
        try:
            capsules = [
                self.keyring.sign(Capsule.of(u.replace(owner=sender), sender=sender, reply_to=batch).addressed([f"inst-{receiver}"]))
                for u in units
            ]
            if capsules:
                self.bus.publish_many(topic, capsules)
            admitted: dict[str, Unit] = {}
            seen = 0
            waited = 0
            while seen < len(capsules):
                messages = sub.read(count=256, block_ms=200)
                if not messages:
                    waited += 200
                    if waited >= self.timeout_ms:
                        raise BusError(
                            f"champion broadcast to inst-{receiver}: {seen} of {len(capsules)} "
                            f"capsules arrived within {self.timeout_ms} ms"
                        )
                    continue
                for msg in messages:
                    decision = exchange.receive_raw(msg.payload)
                    capsule = _parse(msg.payload)
                    if capsule is None or capsule.reply_to != batch:
                        continue  # an older delivery's leftover: acked below, not applied
                    seen += 1
                    self.decisions[decision.outcome] = self.decisions.get(decision.outcome, 0) + 1
                    if decision.outcome in _ADMITTED:
                        admitted[capsule.unit.id] = champion_copy(capsule.unit.replace(owner=sender), champion=champion, receiver=receiver, stage=stage)
                    else:
                        self.rejected += 1
                sub.ack([m.id for m in messages])
        finally:
            sub.close()
            inbox.close()
        return [admitted[u.id] for u in units if u.id in admitted]


def _parse(payload: bytes | str) -> Capsule | None:
    try:
        return Capsule.from_json(payload)
    except Exception:  # noqa: BLE001 - the exchange already recorded why it is malformed
        return None
