"""Champion broadcast over the bus: the FORGE protocol's delivery through ``forge.share.bus``.

The in-process :class:`~forge.protocols.forge.DirectDelivery` copies the champion's units
straight into each receiver. :class:`BusDelivery` sends the same units as signed capsules over
any :class:`~forge.share.bus.base.Bus` (in-process or Redis Streams) to the receiver's topic, and
only the units a receiving :class:`~forge.share.exchange.Exchange` admits replace the receiver's
memory, so a population spread over processes or machines evolves like one in a single process.

What that exchange checks, plainly: it is a real ``Exchange`` (signature against the keyring,
replay, flooding, the screen for injections and secrets, the assessor's usefulness), but over
a scratch in-memory store that holds only this delivery's capsules, on ``embedder`` (``hash``
by default). So its duplicate, novelty and conflict checks compare a capsule with the rest of
its batch, not with the receiver's memory, and what it writes (units, ledger) is thrown away.
It cannot be the receiver's own exchange over the run's memory: a broadcast *replaces* that
memory (comparing with the units about to be superseded would keep or drop champion units by
what they replace), and the run's store is written only by the parent, as replayable ops
(:mod:`forge.protocols.ops`), which is what makes a resumed run equal an uninterrupted one;
an exchange writing there would not replay.
"""

from __future__ import annotations

from collections.abc import Sequence

from forge.engine.memory import Memory
from forge.errors import BusError, ValidationError
from forge.model import Unit, new_id
from forge.protocols.forge import champion_copy
from forge.share.bus.base import Bus
from forge.share.capsule import Capsule, Keyring
from forge.share.exchange import Exchange

__all__ = ["BusDelivery"]

_ADMITTED = ("accepted", "merged", "corroborated")


class BusDelivery:
    """Broadcast with replacement through a bus; one topic per receiving instance.

    ``embedder`` names the embedder of the scratch store the receiving exchange judges in
    (duplicates and conflicts within one delivery; see the module docstring).
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
                    capsule = _parse(msg.payload)  # once: the exchange takes the parsed capsule
                    if capsule is None or capsule.reply_to != batch:
                        continue  # malformed, or an older delivery's leftover: acked below, not applied
                    decision = exchange.receive(capsule)
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
    """The capsule a bus message holds; None for one that is not a capsule (it cannot belong
    to this delivery's batch, which only well-formed capsules name)."""
    try:
        return Capsule.from_json(payload)
    except ValidationError:  # from_json says every malformed input with it
        return None
