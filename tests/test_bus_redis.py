"""Redis-only behaviour: failures, killed subscribers, and a server restarted under a producer."""

from __future__ import annotations

import json
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from forge.errors import BusError, ConfigError
from forge.model import Unit
from forge.share.bus import open_bus
from forge.share.capsule import Capsule
from test_bus_support import REDIS_URL, cleanup, redis_bus

pytest.importorskip("redis", reason="redis-py is not installed (pip install 'forge-memory[redis]')")

from forge.share.bus.redis import RedisBus  # noqa: E402


@pytest.fixture
def rbus():
    b = redis_bus()
    yield b
    cleanup(b)


def capsule(i: int, sender: str = "p") -> Capsule:
    return Capsule.of(Unit(f"lesson number {i}", owner=sender), sender=sender)


def test_unreachable_server_fails_fast_with_one_line():
    bus = RedisBus.from_url("redis://127.0.0.1:1/0", socket_timeout=0.2, retries=2)
    t0 = time.monotonic()
    with pytest.raises(BusError) as err:
        bus.publish("t", b"x")
    msg = str(err.value)
    assert "\n" not in msg and "127.0.0.1:1" in msg and "3 tries" in msg  # bounded tries, then the error
    assert time.monotonic() - t0 < 30  # 3 refused connects and 0.15 s of backoff: it raised, it did not hang


def test_missing_redis_py_gives_install_hint(monkeypatch):
    monkeypatch.setitem(sys.modules, "redis", None)
    with pytest.raises(ConfigError, match=r"pip install 'forge-memory\[redis\]'"):
        open_bus("redis://127.0.0.1:6379/0")


def test_url_options_are_parsed_and_keywords_win():
    b = open_bus("redis://127.0.0.1:6379/0?prefix=x:&maxlen=500&socket_timeout=0.5")
    assert (b.prefix, b.maxlen) == ("x:", 500)
    b2 = open_bus("redis://127.0.0.1:6379/0?prefix=x:", prefix="y:", maxlen=7)
    assert (b2.prefix, b2.maxlen) == ("y:", 7)
    with pytest.raises(ConfigError):
        open_bus("redis://127.0.0.1:6379/0?maxlen=lots")
    b.close()
    b2.close()


def test_maxlen_bounds_the_stream_approximately():
    b = redis_bus(maxlen=100)
    try:
        b.publish_many("t", [b"x"] * 2000)
        assert 100 <= b.length("t") < 2000
    finally:
        cleanup(b)


def test_keys_live_under_the_prefix(rbus):
    rbus.publish("inbox.a", b"x")
    raw = rbus._r
    assert raw.exists(f"{rbus.prefix}inbox.a") == 1


def test_a_deleted_stream_is_recreated_for_the_subscriber(rbus):
    sub = rbus.subscribe("t", consumer="a")
    rbus._r.delete(rbus.key("t"))  # e.g. a server restarted without persistence
    assert sub.read(count=5) == []
    rbus.publish("t", b"after")
    assert [m.payload for m in sub.read()] == [b"after"]


def test_two_bus_instances_share_topics_like_two_processes(rbus):
    other = RedisBus.from_url(REDIS_URL, prefix=rbus.prefix, socket_timeout=0.5)
    sub = other.subscribe("t", consumer="b")
    rbus.publish("t", b"hello")
    assert [m.payload for m in sub.read(block_ms=500)] == [b"hello"]
    other.close()


# -- a subscriber killed with SIGKILL mid-stream -------------------------------------------

WORKER = textwrap.dedent(
    """
    import json, os, signal, sys
    from forge.share.bus.redis import RedisBus

    url, prefix, topic, done_path, log_path, total, die_after = sys.argv[1:8]
    total, die_after = int(total), int(die_after)
    bus = RedisBus.from_url(url, prefix=prefix, socket_timeout=2)
    sub = bus.subscribe(topic, consumer="worker")
    done = set(open(done_path).read().split()) if os.path.exists(done_path) else set()
    processed_now = 0
    while len(done) < total:
        batch = sub.read(count=10, block_ms=200)
        for m in batch:
            cid = json.loads(m.payload)["id"]
            with open(log_path, "a") as log:
                log.write(cid + "\\n")
            if cid in done:  # redelivered after a crash: already processed, just ack it
                continue
            with open(done_path, "a") as f:  # the side effect and its dedupe record, one write
                f.write(cid + "\\n")
                f.flush()
                os.fsync(f.fileno())
            done.add(cid)
            processed_now += 1
            if processed_now == die_after:
                os.kill(os.getpid(), signal.SIGKILL)  # dies mid-batch, before acking it
        sub.ack([m.id for m in batch])  # ack after the batch: a crash leaves some unacked
    """
)


@pytest.mark.slow
def test_killed_subscriber_resumes_and_processes_each_capsule_exactly_once(rbus, tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    done, log = tmp_path / "done.txt", tmp_path / "deliveries.txt"
    total = 200
    caps = [capsule(i) for i in range(total)]
    rbus.subscribe("jobs", consumer="worker").close()  # the worker has joined once before
    rbus.publish_many("jobs", caps[:100])

    def run(die_after: int) -> subprocess.Popen:
        args = [sys.executable, str(script), REDIS_URL, rbus.prefix, "jobs", str(done), str(log), str(total), str(die_after)]
        return subprocess.Popen(args, stderr=subprocess.PIPE)

    def lines(path) -> list[str]:
        return path.read_text().split() if path.exists() else []

    # 1: dies by its own SIGKILL after processing 35 capsules, in the middle of a batch
    p = run(35)
    assert p.wait(timeout=30) == -signal.SIGKILL
    p.stderr.close()
    assert len(lines(done)) == 35
    # 2: comes back while the producer is still sending; killed from outside part-way
    producer = threading.Thread(target=lambda: [rbus.publish("jobs", c) or time.sleep(0.002) for c in caps[100:]])
    producer.start()
    p = run(0)
    deadline = time.monotonic() + 30
    while len(lines(done)) < 90 and time.monotonic() < deadline:
        time.sleep(0.01)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=10)
    p.stderr.close()
    producer.join()
    # 3: comes back and finishes
    p = run(0)
    rc = p.wait(timeout=60)
    err = p.stderr.read().decode()[-2000:]
    p.stderr.close()
    assert rc == 0, err

    processed = lines(done)
    assert len(processed) == len(set(processed)) == total  # exactly once
    assert set(processed) == {c.id for c in caps}
    deliveries = lines(log)
    assert len(deliveries) > total  # the kills caused redeliveries, absorbed by the dedupe
    assert rbus.subscribe("jobs", consumer="worker").pending() == 0


# -- a durable server restarted under a producer ------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DurableRedis:
    """A second redis-server with AOF fsync on every write, which this test may kill."""

    def __init__(self, exe: str, workdir) -> None:
        self.exe, self.dir, self.port = exe, workdir, _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        args = [self.exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
                "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--protected-mode", "no"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2) as s:
                    s.sendall(b"PING\r\n")
                    if s.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                pass
            time.sleep(0.05)
        self.kill()
        pytest.skip("could not start a second redis-server for the restart test")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.proc = None


@pytest.fixture
def durable(tmp_path):
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed; the restart test starts its own server")
    server = DurableRedis(exe, tmp_path)
    server.start()
    yield server
    server.kill()


def test_nothing_acknowledged_is_lost_when_redis_is_killed_under_a_producer(durable):
    bus = RedisBus.from_url(durable.url, prefix="forge:", socket_timeout=0.5, retries=3)
    sub = bus.subscribe("inbox.b", consumer="b")
    acked: dict[str, str] = {}  # capsule id -> stream id returned by XADD
    failures = 0
    caps = [capsule(i) for i in range(300)]

    def produce() -> None:
        nonlocal failures
        for c in caps:
            deadline = time.monotonic() + 20
            while True:
                try:
                    acked[c.id] = bus.publish("inbox.b", c)
                    time.sleep(0.002)
                    break
                except BusError:
                    failures += 1
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)

    t = threading.Thread(target=produce)
    t.start()
    while len(acked) < 100:
        time.sleep(0.005)
    # the consumer reads 50 and acks 30 before the crash
    first = sub.read(count=50)
    assert sub.ack([m.id for m in first[:30]]) == 30
    assert len(acked) < len(caps)  # the producer is still going
    durable.kill()  # SIGKILL: no shutdown, no final flush
    time.sleep(0.3)
    durable.start()
    t.join(timeout=60)
    assert not t.is_alive()
    assert bus.retried + failures > 0  # the producer did see the outage and retried through it

    after = RedisBus.from_url(durable.url, prefix="forge:", socket_timeout=0.5)
    stored = [json.loads(m.payload)["id"] for m in after.subscribe("inbox.b", consumer="audit").read(count=10_000)]
    assert set(acked) <= set(stored)  # every XADD that returned an id survived
    assert set(stored) == {c.id for c in caps}
    # the consumer group survived too: the 20 unacked come back first, then the rest
    again = after.subscribe("inbox.b", consumer="b")
    replay = again.read(count=100)
    assert [m.id for m in replay] == [m.id for m in first[30:]]
    rest = []
    while batch := again.read(count=500):
        rest += batch
    assert {json.loads(m.payload)["id"] for m in first + rest} == set(stored)
    after.close()
    bus.close()



def test_pending_entries_trimmed_by_maxlen_are_counted_not_looped_on():
    b = redis_bus(maxlen=1)
    try:
        sub = b.subscribe("t", consumer="a")
        b.publish_many("t", [b"1", b"2"])
        sub.read()  # both pending
        b._r.xtrim(b.key("t"), maxlen=0, approximate=False)  # payloads gone, PEL entries stay
        again = b.subscribe("t", consumer="a")
        assert again.read() == [] and again.trimmed == 2
        assert again.pending() == 0
    finally:
        cleanup(b)
