"""Scope probes against a live ``forge serve`` (issue 25): the MCP streamable-HTTP transport
through the MCP SDK's own client, and the server-sent event stream, on SQLite and
PostgreSQL behind two worker processes (MCP stateless) and on SQLite behind one (MCP
sessions).

Alice owns a private unit (SECRET) and one in her group red (GROUP), plus a global unit
(PUBLIC) that is derived from SECRET and related to it, so a visible unit points at the
invisible ones through provenance and the graph. Bob (group blue) probes them through
every MCP tool and resource and by id; his event stream, and Carol's (group red), must
carry only their own trail: never a marker word of Alice's units, never the id of a unit
they may not see. Alice's own stream and Carol's recall through MCP are the controls: they
do show what their subscriber may see, so the probes would notice a leak.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import anyio
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("mcp")
httpx = pytest.importorskip("httpx")

import pg_support  # noqa: E402
from forge.server.keys import KeyStore  # noqa: E402
from serve_support import Server  # noqa: E402

pytestmark = pytest.mark.slow  # each test runs against live servers (two workers, PostgreSQL)

SECRET = "zebra quartz 7431 alice private plan"
GROUP = "walrus 9902 red team runbook"
PUBLIC = "the public ferry timetable lists pier nine departures at dawn"
Q_SECRET = "alice private plan 7431"  # queries that match them without naming the marker words
Q_GROUP = "red team runbook 9902"
MARKERS = ("zebra", "quartz", "walrus")
WAIT = 150.0  # seconds a stream may take to deliver what it waits for, on a loaded machine


class Live:
    """A started server, its keys, and the ids of Alice's units."""

    def __init__(self, server: Server, tokens: dict[str, str], keys: KeyStore) -> None:
        self.server, self.tokens, self.keys = server, tokens, keys
        self.url = server.url
        self.ids: list[str] = []  # SECRET's and GROUP's ids: nobody but Alice (and Carol, GROUP) may learn them
        self.public = ""
        self.rid = ""  # a recall of Alice's: nobody else may credit it or learn from it

    def http(self, who: str) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.tokens[who]}"}, timeout=120)


@pytest.fixture(scope="module", params=[("sqlite", 2), ("postgres", 2), ("sqlite", 1)], ids=["sqlite-2w", "postgres-2w", "sqlite-1w"])
def live(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    backend, workers = request.param
    tmp = tmp_path_factory.mktemp(f"leak-{backend}-{workers}")
    schema = None
    if backend == "postgres":
        if not pg_support.available():
            pytest.skip(pg_support.MISSING)
        pg = request.getfixturevalue("pg_server")
        schema = pg_support.new_schema()
        db = pg.url(schema)
    else:
        db = str(tmp / "leak.db")
    keys = KeyStore(tmp / "keys.json")
    tokens = {"admin": keys.create(admin=True), "alice": keys.create(agent="alice", groups=["red"]),
              "bob": keys.create(agent="bob", groups=["blue"]), "carol": keys.create(agent="carol", groups=["red"]),
              "dave": keys.create(agent="dave", groups=["blue"])}
    server = Server(db, tmp / "keys.json", tmp / "serve.log", workers=workers, extra=("--no-dashboard", "--llm", "test"))
    try:
        server.start()
        world = Live(server, tokens, keys)
        with world.http("alice") as a:
            r = a.post("/v1/units", json={"units": [{"content": SECRET, "scope": "private", "kind": "rule"},
                                                    {"content": GROUP, "scope": "group:red"}]})
            assert r.status_code == 201, r.text
            world.ids = r.json()["ids"]
            secret, group = world.ids
            r = a.post("/v1/units", json={"units": [{"content": PUBLIC, "provenance": {"derived_from": [secret]}}]})
            assert r.status_code == 201, r.text
            [world.public] = r.json()["ids"]
            for src, dst in ((secret, group), (world.public, secret)):
                assert a.post("/v1/relations", json={"src": src, "dst": dst, "type": "supports"}).status_code == 201
            assert a.post(f"/v1/units/{secret}/status", json={"status": "quarantined", "reason": "review"}).status_code == 200
            with world.http("admin") as op:  # releasing from quarantine is an operator's
                assert op.post(f"/v1/units/{secret}/status", json={"status": "active", "reason": "review"}).status_code == 200
            r = a.post("/v1/recall", json={"query": SECRET})
            assert r.status_code == 200
            world.rid = r.json()["recall_id"]
            assert a.post("/v1/episodes", json={"task": SECRET, "env": "lake"}).status_code == 201
        with world.http("bob") as b:
            assert b.post("/v1/units", json={"units": [{"content": "bob's own public note about lakes"}]}).status_code == 201
        yield world
        server.stop()
        assert "Traceback" not in server.log.read_text(), server.log.read_text()[-3000:]
    finally:
        server.kill()
        if schema is not None:
            request.getfixturevalue("pg_server").drop(schema)


def _clean(text: str, ids: list[str], sent: str = "", *, markers: tuple[str, ...] = MARKERS) -> None:
    """No marker word of Alice's hidden units, and none of their ids unless the request named it."""
    lowered = text.lower()
    for needle in (*markers, *(i for i in ids if i not in sent)):
        assert needle.lower() not in lowered, f"leaked {needle!r}: {text[:400]}"


# -- MCP over streamable HTTP ------------------------------------------------------------


async def _mcp(url: str, token: str, calls: list[tuple[str, dict[str, Any]]],
               resources: tuple[str, ...] = ()) -> tuple[set[str], list[tuple[str, str]]]:
    """Call ``calls`` (and read ``resources``) through the SDK's client over streamable HTTP;
    the tools the server lists, and each answer as JSON with what was sent."""
    import httpx2
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    out: list[tuple[str, str]] = []
    with anyio.fail_after(240):
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=120) as http, \
                streamable_http_client(f"{url}/mcp", http_client=http) as streams, \
                ClientSession(streams[0], streams[1]) as session:
            await session.initialize()
            tools = {t.name for t in (await session.list_tools()).tools}
            for name, args in calls:
                res = await session.call_tool(name, args)
                out.append((res.model_dump_json(), json.dumps(args)))
            for uri in resources:
                try:
                    got = await session.read_resource(uri)
                    out.append((got.model_dump_json(), uri))
                except Exception as exc:  # noqa: BLE001 - an error is fine, its text is checked too
                    out.append((str(exc), uri))
    return tools, out


def test_no_mcp_tool_or_resource_leaks_over_streamable_http(live: Live) -> None:
    a, g = live.ids
    p = live.public
    calls = [("recall", {"query": Q_SECRET, "k": 50}), ("recall", {"query": Q_GROUP, "k": 50}),
             ("recall", {"query": PUBLIC, "k": 50}), ("recall", {"query": Q_SECRET + " " + PUBLIC, "k": 50, "kinds": ["rule", "fact"]}),
             ("context", {"query": Q_SECRET, "budget": 2000}), ("context", {"query": PUBLIC + " " + Q_GROUP, "budget": 2000}),
             ("relate", {"src": a, "dst": g}), ("relate", {"src": p, "dst": a}),
             ("remember_messages", {"messages": [{"role": "user", "content": Q_SECRET}]}),
             ("forget", {"unit_id": a, "reason": "x"}), ("erase", {"unit_id": a, "reason": "x"}), ("erase", {"unit_id": g, "reason": "x"}),
             ("trace", {"unit_id": a}), ("trace", {"unit_id": g}), ("trace", {"unit_id": p}),
             ("stats", {}), ("remember", {"content": "probe", "scope": "group:red"}),
             ("feedback", {"recall_id": live.rid, "success": False}),
             ("learn", {"task": Q_SECRET, "recall_ids": [live.rid], "success": False, "wait": 5})]
    resources = (f"forge://units/{a}", f"forge://units/{g}", f"forge://units/{p}", "forge://units", "forge://units?limit=1000", "forge://runs")
    tools, out = anyio.run(_mcp, live.url, live.tokens["bob"], calls, resources)
    assert {n for n, _ in calls} == tools, "an MCP tool the probes do not call"
    for text, sent in out:
        _clean(text, live.ids, sent)
    _, mine = anyio.run(_mcp, live.url, live.tokens["alice"], [("recall", {"query": Q_SECRET, "k": 5})])
    assert "zebra" in mine[0][0] and a in mine[0][0], "control: Alice recalls her own private unit over MCP"
    # Carol (group red) sees GROUP, never SECRET: the group probe can tell the two apart.
    _, carol = anyio.run(_mcp, live.url, live.tokens["carol"], [("recall", {"query": Q_GROUP, "k": 50}), ("recall", {"query": Q_SECRET, "k": 50}),
                                                               ("trace", {"unit_id": p}), ("trace", {"unit_id": g})])
    assert g in carol[0][0] and "walrus" in carol[0][0], "control: Carol recalls her group's unit"
    for text, sent in carol:
        _clean(text, [a], sent, markers=("zebra", "quartz"))
    # Dave remembers Alice's very text as his own: admission compares it with his units only.
    _, dave = anyio.run(_mcp, live.url, live.tokens["dave"], [("remember", {"content": SECRET, "scope": "private", "kind": "rule"}),
                                                             ("remember", {"content": GROUP, "scope": "private"})])
    for text, _ in dave:
        assert '"action":"add"' in text.replace(" ", ""), text
        _clean(text, live.ids, markers=())


def test_a_resource_the_caller_cannot_see_is_a_clear_not_found(live: Live) -> None:
    """Reading a unit one may not see (or a run that is not there) is the caller's not-found,
    with the reason, not a server crash logged with a traceback and a message that says nothing."""
    uris = (f"forge://units/{live.ids[0]}", "forge://runs/nope")
    _, out = anyio.run(_mcp, live.url, live.tokens["bob"], [], uris)
    for (text, uri), want in zip(out, (f"no unit with id {live.ids[0]}", "no run named 'nope'"), strict=True):
        assert "not_found" in text and want in text, (uri, text)
    log = live.server.log.read_text()
    assert "unexpected exception" not in log and "Traceback" not in log, log[-2000:]


MCP_HEADERS = {"Accept": "application/json, text/event-stream", "mcp-protocol-version": "2025-11-25"}


def _rpc(url: str, token: str, body: dict[str, Any], session: str | None = None) -> httpx.Response:
    headers = {**MCP_HEADERS, "Authorization": f"Bearer {token}", **({"mcp-session-id": session} if session else {})}
    return httpx.post(f"{url}/mcp", json=body, headers=headers, timeout=120)


def test_another_keys_mcp_session_id_gives_nothing_of_its_owner(live: Live) -> None:
    """Bob sends calls on Alice's MCP session id (a stateful server keeps sessions): each call
    is still his, answered with what he may see."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}}
    r = _rpc(live.url, live.tokens["alice"], init)
    assert r.status_code == 200, r.text
    sid = r.headers.get("mcp-session-id")
    assert bool(sid) == (live.server.workers == 1), "sessions are kept only by a server of one process"
    assert _rpc(live.url, live.tokens["alice"], {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid).status_code in (200, 202)
    calls = [("recall", {"query": Q_SECRET, "k": 50}), ("recall", {"query": Q_GROUP, "k": 50}), ("trace", {"unit_id": live.ids[0]}),
             ("context", {"query": Q_SECRET + " " + Q_GROUP, "budget": 2000})]
    for n, (name, args) in enumerate(calls, 2):
        r = _rpc(live.url, live.tokens["bob"], {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": name, "arguments": args}}, sid)
        assert r.status_code < 500, r.text
        _clean(r.text, live.ids, json.dumps(args))
    for uri in (f"forge://units/{live.ids[0]}", "forge://units?limit=1000"):
        r = _rpc(live.url, live.tokens["bob"], {"jsonrpc": "2.0", "id": 50, "method": "resources/read", "params": {"uri": uri}}, sid)
        _clean(r.text, live.ids, uri)
    # Control: the same session answers Alice with her unit.
    r = _rpc(live.url, live.tokens["alice"], {"jsonrpc": "2.0", "id": 60, "method": "tools/call",
                                               "params": {"name": "recall", "arguments": {"query": Q_SECRET, "k": 5}}}, sid)
    assert "zebra" in r.text, r.text[:500]


def test_another_key_cannot_end_or_use_an_mcp_session(live: Live) -> None:
    """A session belongs to the key that opened it: Bob, holding Alice's session id, can
    neither close it (DELETE) nor open its server-to-client stream; to him it does not exist."""
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "probe", "version": "0"}}}
    r = _rpc(live.url, live.tokens["alice"], init)
    sid = r.headers.get("mcp-session-id")
    if not sid:
        pytest.skip("a server of several processes keeps no MCP sessions")
    assert _rpc(live.url, live.tokens["alice"], {"jsonrpc": "2.0", "method": "notifications/initialized"}, sid).status_code == 202
    bob = {**MCP_HEADERS, "Authorization": f"Bearer {live.tokens['bob']}", "mcp-session-id": sid}
    assert httpx.delete(f"{live.url}/mcp", headers=bob, timeout=60).status_code == 404
    with httpx.stream("GET", f"{live.url}/mcp", headers=bob, timeout=60) as r:
        assert r.status_code == 404
    listed = _rpc(live.url, live.tokens["bob"], {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, sid)
    assert listed.status_code == 404 and "Session not found" in listed.text
    r = _rpc(live.url, live.tokens["alice"], {"jsonrpc": "2.0", "id": 3, "method": "tools/list"}, sid)
    assert r.status_code == 200 and "recall" in r.text, "Alice's session survives Bob's attempts"
    alice = {**MCP_HEADERS, "Authorization": f"Bearer {live.tokens['alice']}", "mcp-session-id": sid}
    assert httpx.delete(f"{live.url}/mcp", headers=alice, timeout=60).status_code == 200  # her own: she may


# -- the event stream --------------------------------------------------------------------


class Stream(threading.Thread):
    """``GET /v1/events/stream`` read as a subscriber does, until ``until(events)`` holds or the
    server ends the stream."""

    def __init__(self, url: str, token: str, until: Callable[[list[dict[str, Any]]], bool], since_seq: int = 0) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.until, self.since_seq = url, token, until, since_seq
        self.events: list[dict[str, Any]] = []
        self.raw: list[str] = []
        self.status = 0
        self.satisfied = self.ended = False
        self.error: BaseException | None = None

    def run(self) -> None:
        params = {"since_seq": self.since_seq, "poll_s": 0.05, "timeout_s": WAIT}
        try:
            with httpx.stream("GET", f"{self.url}/v1/events/stream", params=params, headers={"Authorization": f"Bearer {self.token}"},
                              timeout=httpx.Timeout(WAIT + 60, connect=30)) as r:
                self.status = r.status_code
                block: dict[str, Any] = {}
                for line in r.iter_lines():
                    self.raw.append(line)
                    if line.startswith("data: "):
                        block = json.loads(line[len("data: "):])
                    elif not line and block:
                        self.events.append(block)
                        block = {}
                        if self.until(self.events):
                            self.satisfied = True
                            return
            self.ended = True
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc

    def wait(self) -> Stream:
        self.join(timeout=WAIT + 90)
        assert not self.is_alive(), "the event stream neither delivered nor ended"
        assert self.error is None, f"the event stream failed: {self.error!r}"
        assert self.status == 200, self.status
        return self

    def text(self) -> str:
        return "\n".join(self.raw)


def _added(uid: str) -> Callable[[list[dict[str, Any]]], bool]:
    return lambda evs: any(e["op"] == "add" and e["unit_id"] == uid for e in evs)


def _recalls(live: Live, who: str) -> int:
    with live.http(who) as h:
        r = h.get("/v1/events", params={"actor": who, "op": "recall", "limit": 1000})
        assert r.status_code == 200, r.text
        return len(r.json()["events"])


def _await_recalls(live: Live, who: str, n: int) -> None:
    """Until ``who``'s trail holds ``n`` recall records: read records are written in batches,
    by whichever worker served the recall."""
    deadline = time.monotonic() + WAIT
    while (have := _recalls(live, who)) < n:
        assert time.monotonic() < deadline, f"{who}'s recall records: {have} of {n}"
        time.sleep(0.05)


def test_event_streams_carry_only_each_subscribers_own_trail(live: Live) -> None:
    a, g = live.ids
    p = live.public
    start = {who: _recalls(live, who) for who in ("alice", "bob", "carol")}
    done = {who: f"{who}-done-{time.monotonic_ns()}" for who in ("alice", "bob", "carol")}
    streams = {who: Stream(live.url, live.tokens[who], _added(done[who])) for who in done}
    for s in streams.values():
        s.start()
    with live.http("bob") as b:  # while the streams run: Bob's probes, each leaving (or not) a record
        for body in ({"query": Q_SECRET, "k": 50}, {"query": Q_GROUP, "k": 50}, {"query": PUBLIC, "k": 50, "hops": 3},
                     {"query": Q_SECRET, "k": 50, "filter": {"owner": "alice", "scopes": ["private", "group:red"]}}):
            assert b.post("/v1/recall", json=body).status_code == 200
        assert b.post("/v1/context", json={"query": PUBLIC + " " + Q_SECRET, "budget": 2000}).status_code == 200
        assert b.get("/v1/units", params={"limit": 1000}).status_code == 200
        for path in (f"/v1/units/{p}", f"/v1/units/{p}/trace", f"/v1/units/{p}/relations", f"/v1/units/{p}/history"):
            assert b.get(path).status_code == 200, path
        for path in (f"/v1/units/{a}", f"/v1/units/{g}/trace", f"/v1/units/{a}/history"):
            assert b.get(path).status_code == 404, path
        assert b.post("/v1/relations", json={"src": p, "dst": a}).status_code == 404
        assert b.patch(f"/v1/units/{a}", json={"content": "overwritten"}).status_code == 404
        assert b.get("/v1/events", params={"actor": "alice"}).status_code == 403
    with live.http("carol") as c:
        for q in (Q_GROUP, Q_SECRET, PUBLIC):
            assert c.post("/v1/recall", json={"query": q, "k": 50}).status_code == 200
        assert c.get(f"/v1/units/{g}/trace").status_code == 200
    with live.http("alice") as al:
        assert al.patch(f"/v1/units/{a}", json={"content": SECRET + " revised"}).status_code == 200
        assert al.post("/v1/recall", json={"query": Q_SECRET}).status_code == 200
    for who, n in (("bob", 4), ("carol", 3), ("alice", 1)):
        _await_recalls(live, who, start[who] + n)  # so each marker comes after its writer's records
    for who, uid in done.items():
        with live.http(who) as h:
            assert h.post("/v1/units", json={"units": [{"id": uid, "content": f"{who} is done probing"}], "admit": False}).status_code == 201
    got = {who: s.wait() for who, s in streams.items()}
    assert all(s.satisfied for s in got.values()), {who: (s.satisfied, s.ended, len(s.events)) for who, s in got.items()}

    bob = got["bob"]
    assert {e["actor"] for e in bob.events} == {"bob"}, "Bob's stream carries another actor's entries"
    assert sum(e["op"] == "recall" for e in bob.events) >= start["bob"] + 4, "control: Bob's own recalls are in his stream"
    _clean(bob.text(), live.ids)
    assert p in bob.text(), "control: the public unit Bob was shown is named in his trail"
    carol = got["carol"]
    assert {e["actor"] for e in carol.events} == {"carol"}
    _clean(carol.text(), [a], markers=("zebra", "quartz"))
    assert g in carol.text(), "control: Carol's trail names the group unit she was shown"
    alice = got["alice"]
    assert {e["actor"] for e in alice.events} == {"alice"}
    assert a in alice.text() and "zebra" in alice.text(), "control: Alice's stream shows her own private unit's history"


def test_a_revoked_keys_event_stream_ends(live: Live) -> None:
    """A key revoked while its stream is open stops receiving: the stream ends, and what the
    agent does afterwards with another key never reaches it."""
    spare = live.keys.create(agent="bob", groups=["blue"], note="revoked mid-stream")
    key_id = live.keys.list()[-1].id
    before, after = f"before-{time.monotonic_ns()}", f"after-{time.monotonic_ns()}"
    revoked = threading.Event()

    def until(evs: list[dict[str, Any]]) -> bool:
        if not revoked.is_set():
            if _added(before)(evs):
                live.keys.revoke(key_id)  # the stream is live: revoke its key now
                revoked.set()
            return False
        return any(e["unit_id"] == after for e in evs)  # delivered after the revocation: a leak

    stream = Stream(live.url, spare, until)
    stream.start()
    with live.http("bob") as b:
        assert b.post("/v1/units", json={"units": [{"id": before, "content": "written while the key is valid"}], "admit": False}).status_code == 201
        deadline = time.monotonic() + WAIT
        while not revoked.wait(0.05):
            assert stream.is_alive() and time.monotonic() < deadline, "the stream never delivered the first write"
        assert b.post("/v1/units", json={"units": [{"id": after, "content": "written after the key was revoked"}], "admit": False}).status_code == 201
    stream.wait()
    assert not stream.satisfied, "a revoked key's stream delivered an entry written after the revocation"
    assert stream.ended
    r = httpx.get(f"{live.url}/v1/events/stream", params={"timeout_s": 1}, headers={"Authorization": f"Bearer {spare}"}, timeout=60)
    assert r.status_code == 401


def test_the_stream_delivers_every_entry_once_under_concurrent_writers(live: Live) -> None:
    """Entries written by many clients at once, through both workers, reach a subscriber
    each exactly once: the stream's position never skips an entry committed after a later one."""
    with live.http("admin") as h:
        newest = h.get("/v1/events", params={"newest_first": True, "limit": 1}).json()["events"]
    since = newest[0]["seq"] if newest else 0
    marker = f"admin-done-{time.monotonic_ns()}"
    stream = Stream(live.url, live.tokens["admin"], _added(marker), since_seq=since)
    stream.start()
    failures: list[str] = []

    def write(who: str, n: int) -> None:
        with live.http(who) as c:
            for i in range(12):
                units = [{"content": f"{who} writer {n} batch {i} note {j} " + " ".join(map(str, range(j, j + 5)))} for j in range(4)]
                r = c.post("/v1/units", json={"units": units}, headers={"Connection": "close"})
                if r.status_code != 201:
                    failures.append(r.text)

    threads = [threading.Thread(target=write, args=(who, n)) for n, who in enumerate(["alice", "bob", "carol"] * 2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=WAIT)
    assert failures == [] and not any(t.is_alive() for t in threads), failures[:3]
    with live.http("admin") as h:
        assert h.post("/v1/units", json={"units": [{"id": marker, "content": "the writers are done"}], "admit": False}).status_code == 201
        stream.wait()
        assert stream.satisfied
        logged, seq = [], since
        while page := h.get("/v1/events", params={"since_seq": seq, "limit": 1000}).json()["events"]:
            logged += [e["seq"] for e in page]
            seq = page[-1]["seq"]
    delivered = [e["seq"] for e in stream.events]
    upto = delivered[-1]
    want = [s for s in logged if s <= upto]
    assert len(delivered) == len(set(delivered)), "an entry was delivered twice"
    missing = sorted(set(want) - set(delivered))
    assert missing == [], f"{len(missing)} of {len(want)} entries never reached the stream: {missing[:10]}"
