"""Capsules over a bus along a topology: signed sends, verified inboxes, relaying.

    net = Network(bus, Hierarchical.balanced(agents), keyring=keyring)
    net.send(Capsule.of(unit, sender="a1"))          # signed by a1, to a1's next hops
    inbox = net.inbox("a2")
    net.pump("a2", inbox, handle=exchange.receive)   # verify, handle, relay, then ack

Each agent has one inbox topic. A capsule is acked only after its handler returned, so a
receiver that dies mid-batch gets the rest again when it comes back (at-least-once; the
handler dedupes by capsule id). Capsules that fail decoding or verification, whatever their
bytes, are acked *and counted* with their reason in :attr:`CapsuleInbox.rejected`, and so
are capsules whose handler fails on them for any reason but a backend failure: a bad
message is never redelivered forever, never blocks the messages behind it, and is never
dropped without a trace. A backend failure (:class:`~forge.errors.BackendError`: the
store, the embedder) stops the batch with the failed capsule and the rest unacked, so they
come again.

Scope travels with a unit: a group-scoped capsule goes only to the group's members
(``members``: group name -> agent ids); what is held back is counted in
:attr:`Network.withheld`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from forge.errors import BackendError, ValidationError
from forge.model import Scope
from forge.share.bus.base import Bus, BusMessage, Subscription
from forge.share.capsule import Capsule, Keyring
from forge.share.topology import Topology

_log = logging.getLogger("forge.share")

__all__ = ["CapsuleInbox", "Delivery", "Network", "Rejection"]


@dataclass(frozen=True, slots=True)
class Delivery:
    """A verified capsule and the bus message id to ack once it is processed."""

    id: str
    capsule: Capsule


@dataclass(frozen=True, slots=True)
class Rejection:
    id: str
    reason: str
    sender: str = ""


class CapsuleInbox:
    """A subscription that decodes and verifies capsules at the boundary.

    With a keyring, unsigned, tampered, unknown-sender, forged-origin and expired capsules
    are rejected, and so are capsules not addressed to ``recipient`` (the inbox's agent);
    without a keyring, capsules are only decoded (for transports already trusted end to end).
    """

    def __init__(
        self,
        subscription: Subscription,
        *,
        keyring: Keyring | None,
        recipient: str | None = None,
        clock: Callable[[], float] = time.time,
        keep: int = 256,
    ) -> None:
        self.subscription = subscription
        self.keyring = keyring
        self.recipient = recipient
        self.clock = clock
        self.rejected: Counter[str] = Counter()
        self.rejections: deque[Rejection] = deque(maxlen=keep)  # the most recent, for inspection

    def _check(self, messages: list[BusMessage]) -> list[Delivery]:
        out, bad = [], []
        for m in messages:
            sender = ""
            try:
                capsule = Capsule.from_json(m.payload)
                sender = capsule.sender
                reason = self.keyring.verify(capsule, recipient=self.recipient) if self.keyring is not None else None
                if reason is None and capsule.expired(self.clock()):
                    reason = "expired"
                detail = reason or ""
            except ValidationError as exc:  # Capsule.from_json says every malformed payload with it
                reason, detail = "malformed", f"malformed: {exc}"
            if reason is None:
                out.append(Delivery(m.id, capsule))
            else:
                self.reject(m.id, reason, detail, sender)
                bad.append(m.id)
        if bad:
            self.subscription.ack(bad)
        return out

    def reject(self, message_id: str, reason: str, detail: str, sender: str = "") -> None:
        """Count a message as rejected (the caller acks it)."""
        self.rejected[reason] += 1
        self.rejections.append(Rejection(message_id, detail, sender))

    def read(self, *, count: int = 64, block_ms: int = 0) -> list[Delivery]:
        return self._check(self.subscription.read(count=count, block_ms=block_ms))

    def claim(self, *, min_idle_ms: int, count: int = 100) -> list[Delivery]:
        return self._check(self.subscription.claim(min_idle_ms=min_idle_ms, count=count))

    def ack(self, ids: Iterable[str]) -> int:
        return self.subscription.ack(ids)

    def pending(self) -> int:
        return self.subscription.pending()

    def close(self) -> None:
        self.subscription.close()


class Network:
    """Delivers capsules to the inboxes a topology names, signing every hop."""

    def __init__(
        self,
        bus: Bus,
        topology: Topology,
        *,
        keyring: Keyring,
        topic_prefix: str = "inbox.",
        members: Mapping[str, Iterable[str]] | None = None,
    ) -> None:
        self.bus = bus
        self.topology = topology
        self.keyring = keyring
        self.topic_prefix = topic_prefix
        self.members = {g: frozenset(agents) for g, agents in (members or {}).items()}
        self.sent: Counter[str] = Counter()  # bus messages published, by sending agent
        self.received: Counter[str] = Counter()  # capsules handled, by receiving agent
        self.withheld: Counter[str] = Counter()  # copies not sent because of scope, by scope

    def topic(self, agent: str) -> str:
        return f"{self.topic_prefix}{agent}"

    def may_receive(self, agent: str, capsule: Capsule) -> bool:
        """Whether ``agent`` may see the capsule's unit: a group unit (by either scope the
        capsule names) only if it is a member. Fails closed: a group nobody listed has no
        members. (A private unit is sent only when its owner sends it on purpose.)"""
        for text in {capsule.scope, str(capsule.unit.scope)}:
            scope = Scope.parse(text)
            if scope.kind == "group" and agent not in self.members.get(scope.name, ()):
                return False
        return True

    def send_to(self, capsule: Capsule, recipients: Iterable[str]) -> dict[str, str]:
        """Address to the permitted recipients, sign as ``capsule.sender`` and publish;
        returns ids. A recipient the capsule's scope does not allow is left out (counted in
        :attr:`withheld`). The recipients are signed into the capsule, so one inbox's copy is
        refused by any other inbox. A capsule already signed for exactly these recipients
        goes as it is.
        """
        wanted = set(recipients) - {capsule.sender}
        agents = sorted(a for a in wanted if self.may_receive(a, capsule))
        if len(agents) < len(wanted):
            self.withheld[capsule.scope] += len(wanted) - len(agents)
        if not agents:
            return {}
        signed = capsule if capsule.signature and capsule.to == tuple(agents) else self.keyring.sign(capsule.addressed(agents))
        ids = self.bus.publish_to([self.topic(a) for a in agents], signed)
        self.sent[capsule.sender] += len(agents)
        return dict(zip(agents, ids, strict=True))

    def send(self, capsule: Capsule) -> dict[str, str]:
        """Send a capsule its sender holds to the sender's next hops in the topology."""
        return self.send_to(capsule, self.topology.forward(capsule.sender, capsule))

    def relay(self, agent: str, capsule: Capsule) -> dict[str, str]:
        """Pass on a capsule ``agent`` received, if the topology makes it a relay for it."""
        hops = self.topology.forward(agent, capsule)
        if not hops:
            return {}
        return self.send_to(capsule.forwarded(by=agent), hops)

    def inbox(self, agent: str, *, verify: bool = True, start: str = "earliest") -> CapsuleInbox:
        sub = self.bus.subscribe(self.topic(agent), consumer=agent, start=start)
        return CapsuleInbox(sub, keyring=self.keyring if verify else None, recipient=agent)

    def pump(
        self,
        agent: str,
        inbox: CapsuleInbox,
        *,
        handle: Callable[[Capsule], object],
        count: int = 64,
        block_ms: int = 0,
        relay: bool = True,
    ) -> int:
        """Read one batch: handle each capsule, relay it, then ack it. Returns how many.

        A capsule its handler fails on is acked and counted as rejected (``handler_error``),
        unless the failure is the backend's (:class:`BackendError`): then the batch stops
        there, unacked from that capsule on, and the error is raised (redelivery retries).
        """
        batch = inbox.read(count=count, block_ms=block_ms)
        done: list[str] = []
        try:
            for d in batch:
                try:
                    handle(d.capsule)
                except BackendError:
                    raise
                except Exception as exc:  # noqa: BLE001  the caller's handler: counted as its error (not the sender's), and logged
                    _log.error("handler of %s failed on capsule %s", agent, d.capsule.id, exc_info=exc)
                    inbox.reject(d.id, "handler_error", f"{type(exc).__name__}: {exc}"[:300], d.capsule.sender)
                    done.append(d.id)
                    continue
                if relay:
                    self.relay(agent, d.capsule)
                done.append(d.id)
                self.received[agent] += 1
        finally:  # what was handled is acked even if a later capsule's handler raised
            if done:
                inbox.ack(done)
        return len(batch)
