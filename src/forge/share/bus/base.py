"""The broadcast port: append-only topics, consumer groups, explicit acks.

The contract is Redis Streams' (the production backend), so the in-process default behaves
the same way in tests:

- ``publish`` appends a payload to a topic and returns its message id. Once an id is
  returned the message is the bus's responsibility.
- ``subscribe(topic, consumer=...)`` joins a consumer group (by default one group per
  consumer, so every subscriber sees every message). Delivered messages stay *pending*,
  owned by that consumer, until it acks them: delivery is at-least-once, and receivers
  dedupe by capsule id.
- A subscription opened again under the same consumer name first replays that consumer's
  pending messages (the ones it read but never acked before it died), then reads new ones.
- ``claim`` takes over messages another consumer of the same group left pending longer
  than an idle timeout (a dead worker's share of the work).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

from forge.errors import ValidationError
from forge.share.capsule import Capsule

__all__ = ["Bus", "BusMessage", "Subscription", "encode", "check_name"]

_NAME = re.compile(r"^[A-Za-z0-9_.:@/+-]{1,200}$")


class BusMessage(NamedTuple):
    """One delivered message: the bus's id (used to ack) and the raw payload."""

    id: str
    payload: bytes


@runtime_checkable
class Subscription(Protocol):
    """One consumer's cursor on one topic."""

    topic: str
    group: str
    consumer: str

    def read(self, *, count: int = 64, block_ms: int = 0) -> list[BusMessage]:
        """Up to ``count`` messages: own pending ones first (replay), then new ones.

        ``block_ms`` > 0 waits that long for new messages when none are ready.
        """
        ...

    def ack(self, ids: Iterable[str]) -> int:
        """Mark messages processed; returns how many were pending and are now acked."""
        ...

    def claim(self, *, min_idle_ms: int, count: int = 100) -> list[BusMessage]:
        """Take over messages other consumers of this group left pending for ``min_idle_ms``."""
        ...

    def pending(self) -> int:
        """How many messages this consumer has read but not acked."""
        ...

    def close(self) -> None: ...


@runtime_checkable
class Bus(Protocol):
    """Topics of messages with consumer groups; see the module docstring for the semantics."""

    def publish(self, topic: str, message: Capsule | bytes) -> str: ...

    def publish_many(self, topic: str, messages: Sequence[Capsule | bytes]) -> list[str]:
        """Publish in one round trip; ids are returned in order."""
        ...

    def publish_to(self, topics: Sequence[str], message: Capsule | bytes) -> list[str]:
        """The same message to several topics (a fan-out) in one round trip."""
        ...

    def subscribe(
        self, topic: str, *, consumer: str, group: str | None = None, start: str = "earliest"
    ) -> Subscription:
        """Join ``group`` (default: ``consumer``) as ``consumer``.

        ``start`` applies only when the group is created: ``"earliest"`` delivers the topic's
        whole retained history (an inbox), ``"latest"`` only what is published afterwards.
        """
        ...

    def close(self) -> None: ...


def encode(message: Capsule | bytes) -> bytes:
    """Payload bytes for a capsule (its JSON) or raw bytes as given."""
    if isinstance(message, Capsule):
        return message.to_json().encode()
    if isinstance(message, (bytes, bytearray, memoryview)):
        return bytes(message)
    raise ValidationError(f"can only publish a Capsule or bytes, not {type(message).__name__}")


def check_name(value: str, what: str) -> str:
    """Topic, group and consumer names become Redis keys; keep them printable and bounded."""
    if not isinstance(value, str) or not _NAME.match(value):
        raise ValidationError(
            f"{what} {value!r} must be 1-200 characters of letters, digits and _.:@/+-"
        )
    return value


def check_start(start: str) -> str:
    if start not in ("earliest", "latest"):
        raise ValidationError(f"start must be 'earliest' or 'latest', not {start!r}")
    return start
