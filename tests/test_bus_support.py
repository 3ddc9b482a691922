"""Bus fixtures shared by the bus, topology and trigger tests (imported by them; no tests here).

The Redis backend runs against the real server at 127.0.0.1:6379 with a unique key prefix
per test, purged afterwards; an unreachable server skips those tests with the reason.
"""

from __future__ import annotations

import os

import pytest

from forge.errors import BusError
from forge.share.bus import MemoryBus

REDIS_URL = "redis://127.0.0.1:6379/0"


def redis_bus(url: str = REDIS_URL, **kw):
    """A RedisBus under a fresh prefix, or skip the test with the reason."""
    pytest.importorskip("redis", reason="redis-py is not installed (pip install 'forge-memory[redis]')")
    from forge.share.bus.redis import RedisBus

    prefix = f"forge-test:{os.getpid()}:{os.urandom(4).hex()}:"
    bus = RedisBus.from_url(url, prefix=prefix, socket_timeout=0.5, retries=0, **kw)
    try:
        bus.ping()
    except BusError as exc:
        bus.close()
        pytest.skip(f"Redis not reachable at {url}: {exc}")
    bus.retries = 3
    return bus


BACKENDS = ["memory", "redis"]


def make_bus(backend: str):
    """Generator for a ``bus`` fixture parametrised over :data:`BACKENDS`."""
    if backend == "memory":
        b = MemoryBus()
        yield b
        b.close()
        return
    b = redis_bus()
    yield b
    cleanup(b)


def cleanup(bus) -> None:
    """Delete the test's keys, even if the test closed its bus."""
    from forge.share.bus.redis import RedisBus

    with RedisBus.from_url(REDIS_URL, prefix=bus.prefix, socket_timeout=0.5) as fresh:
        fresh.purge()
    bus.close()
