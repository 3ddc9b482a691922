"""Champion broadcast over the bus: the FORGE protocol's ``Delivery`` through ``forge.bus``.

The in-process :class:`~forge.protocols.forge.DirectDelivery` copies the champion's memory
straight into each receiver. :class:`BusDelivery` sends the same memory as signed capsules
over any :class:`~forge.bus.base.Bus` (in-process or Redis Streams) to the receiver's topic;
the receiver verifies every capsule before it replaces its memory, so a population spread
over processes or machines evolves exactly like one in a single process.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from forge.bus.base import Bus
from forge.capsule import Capsule, Keyring
from forge.errors import BusError
from forge.model import Context, Kind, Unit, new_id
from forge.policy import MemoryItem, PromptMemory

__all__ = ["BusDelivery"]


class BusDelivery:
    """Broadcast with replacement through a bus; one topic per receiving instance."""

    def __init__(self, bus: Bus, *, keyring: Keyring | None = None, topic_prefix: str = "forge.champion.",
                 timeout_ms: int = 10_000) -> None:
        self.bus = bus
        self.keyring = keyring or Keyring.random()
        self.topic_prefix = topic_prefix
        self.timeout_ms = timeout_ms
        self.rejected = 0

    def _topic(self, receiver: int) -> str:
        return f"{self.topic_prefix}inst-{receiver}"

    def deliver(self, *, champion: int, receiver: int, memory: PromptMemory, stage: int) -> PromptMemory:
        sender = f"inst-{champion}"
        batch = new_id()  # ties this delivery's capsules together on a shared topic
        topic = self._topic(receiver)
        sub = self.bus.subscribe(topic, consumer=f"inst-{receiver}", start="latest")
        try:
            capsules = [
                self.keyring.sign(Capsule.of(_unit(item, owner=sender), sender=sender, reply_to=batch))
                for item in memory.items
            ]
            if capsules:
                self.bus.publish_many(topic, capsules)
            received: list[MemoryItem] = []
            waited = 0
            while len(received) < len(capsules):
                messages = sub.read(count=256, block_ms=200)
                if not messages:
                    waited += 200
                    if waited >= self.timeout_ms:
                        raise BusError(
                            f"champion broadcast to inst-{receiver}: {len(received)} of {len(capsules)} "
                            f"capsules arrived within {self.timeout_ms} ms"
                        )
                    continue
                for msg in messages:
                    capsule = Capsule.from_json(msg.payload)
                    if capsule.reply_to != batch:
                        continue  # an older delivery's leftover: acked below, not applied
                    if self.keyring.verify(capsule) is not None:
                        self.rejected += 1
                        continue
                    received.append(_item(capsule, champion=champion, stage=stage))
                sub.ack([m.id for m in messages])
        finally:
            sub.close()
        order = {item.id: i for i, item in enumerate(memory.items)}
        received.sort(key=lambda it: order.get(it.derived_from[0], 0))
        return PromptMemory(tuple(received))


def _unit(item: MemoryItem, *, owner: str) -> Unit:
    return Unit(
        content=item.content,
        kind=Kind.RULE if item.kind == "rule" else Kind.EXAMPLE,
        id=item.id,
        owner=owner,
        context=Context(role=item.role),
        meta={"item": item.to_dict()},
    )


def _item(capsule: Capsule, *, champion: int, stage: int) -> MemoryItem:
    data: dict[str, Any] = dict(capsule.unit.meta["item"])
    item = MemoryItem.from_dict(data)
    return replace(item, id=new_id(), source=f"broadcast:inst-{champion}", derived_from=(item.id,), stage=stage)
