"""Broadcast transport: the ``Bus`` port, its in-process default and Redis Streams.

    from forge.bus import open_bus
    bus = open_bus("memory://")                          # in-process, no server
    bus = open_bus("redis://127.0.0.1:6379/0")           # needs forge-memory[redis]

The Redis backend is imported only when a ``redis://`` URL is opened.
"""

from forge.bus.base import Bus, BusMessage, Subscription, encode, open_bus
from forge.bus.memory import MemoryBus, MemorySubscription
from forge.bus.network import CapsuleInbox, Delivery, Network, Rejection

__all__ = [
    "Bus",
    "CapsuleInbox",
    "Delivery",
    "MemoryBus",
    "MemorySubscription",
    "BusMessage",
    "Network",
    "Rejection",
    "Subscription",
    "encode",
    "open_bus",
]
