"""Broadcast transport: the ``Bus`` port, its in-process default and Redis Streams.

    from forge.share.bus import open_bus
    bus = open_bus("memory://")                          # in-process, no server
    bus = open_bus("redis://127.0.0.1:6379/0")           # needs forge-memory[redis]

The Redis backend is imported only when a ``redis://`` URL is opened.
"""

from forge.errors import ConfigError
from forge.share.bus.base import Bus, BusMessage, Subscription, encode
from forge.share.bus.memory import MemoryBus, MemorySubscription
from forge.share.bus.network import CapsuleInbox, Delivery, Network, Rejection

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


def open_bus(
    url: str = "memory://",
    *,
    prefix: str | None = None,
    maxlen: int | None = None,
    socket_timeout: float | None = None,
) -> Bus:
    """A bus from a URL: ``memory://`` (in-process) or ``redis://host:port/db``.

    Redis options may also be given in the URL query (``?prefix=forge:&maxlen=100000``);
    keyword arguments win. The Redis client is imported only when asked for.
    """
    scheme, sep, _ = url.partition("://")
    if not sep:
        raise ConfigError(f"bus URL {url!r} has no scheme; use memory:// or redis://HOST:PORT/DB")
    if scheme == "memory":
        return MemoryBus(maxlen=maxlen)
    if scheme in ("redis", "rediss", "unix"):
        from forge.share.bus.redis import RedisBus

        return RedisBus.from_url(url, prefix=prefix, maxlen=maxlen, socket_timeout=socket_timeout)
    raise ConfigError(f"unknown bus URL scheme {scheme!r}; expected memory:// or redis://")
