"""A client for the memory service with the same verbs and types as :class:`forge.Memory`.

    from forge.client import Client
    mem = Client("http://127.0.0.1:8765", key=os.environ["FORGE_API_KEY"])   # was: Memory.open("team.db")
    mem.add([Unit("When the ice is thin, step back", kind="rule")])
    for r in mem.recall("thin ice", viewer=Viewer.of("scout")):             # r is a forge.Recalled
        print(r.score, r.unit.content, r.reasons)

The viewer comes from the key on the server, never from the request: ``viewer=`` is accepted
so code moves between embedded and remote unchanged, and it is checked against the key
(asking for another agent's view raises :class:`~forge.errors.AccessError`).
:class:`AsyncClient` has the same methods as coroutines. Server errors come back as the
same :class:`~forge.errors.ForgeError` subclasses the library raises; a 429 is retried after
its ``Retry-After`` (up to ``retries`` times).
"""

from __future__ import annotations

import asyncio
import builtins
import dataclasses
import functools
import json
import math
import time
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from typing import Any

import httpx

from forge.curate.admission import Admitted
from forge.curate.messages import Ingested
from forge.engine.recall import Packed, Recalled, Recalls
from forge.errors import (
    AccessError,
    BackendError,
    ConflictError,
    ForgeError,
    NotFoundError,
    StoreError,
    ValidationError,
)
from forge.model import (
    MAX_CONTENT_CHARS,
    MAX_FIELD_CHARS,
    MAX_ID_CHARS,
    MAX_TAGS,
    Context,
    Episode,
    Kind,
    Provenance,
    Relation,
    Scope,
    Status,
    Unit,
    Viewer,
)
from forge.store import Filter
from forge.store.base import Event

__all__ = ["AsyncClient", "Client"]

_ERRORS: dict[int, type[ForgeError]] = {400: ValidationError, 401: AccessError, 403: AccessError, 404: NotFoundError, 409: ConflictError, 422: ValidationError}


def _filter(f: Filter) -> dict[str, Any]:
    return {
        "kinds": sorted(k.value for k in f.kinds),
        "status": sorted(s.value for s in f.status),
        "tags_all": sorted(f.tags_all),
        "tags_any": sorted(f.tags_any),
        "domain": f.domain, "task": f.task, "role": f.role, "owner": f.owner,
        "scopes": sorted(f.scopes), "since": f.since, "until": f.until,
    }


def _list_params(f: Filter, limit: int, offset: int) -> dict[str, Any]:
    """GET /v1/units's query for ``f``: kinds, statuses, tags (all of them), owner, one scope."""
    if f.tags_any or f.domain or f.task or f.role or f.since or f.until or len(f.scopes) > 1:
        raise ValidationError("list() over the service filters by kinds, status, tags_all, owner and one scope; "
                              "use recall() for the other filters")
    params: dict[str, Any] = {"kind": sorted(k.value for k in f.kinds), "status": sorted(s.value for s in f.status),
                              "tag": sorted(f.tags_all), "limit": limit, "offset": offset}
    if f.owner:
        params["owner"] = f.owner
    if f.scopes:
        params["scope"] = next(iter(f.scopes))
    return params


def _unit_in(u: Unit) -> dict[str, Any]:
    d = u.to_dict()
    for k in ("access_count", "last_access", "created_at", "updated_at"):
        d.pop(k)
    if not d["owner"]:
        d.pop("owner")
    return d


def _recalled(d: Mapping[str, Any]) -> Recalled:
    return Recalled(_unit_of(d["unit"]), float(d["score"]), dict(d["why"]))


_UNIT_KEYS = frozenset(f.name for f in dataclasses.fields(Unit))
_KINDS = {k.value: k for k in Kind}
_STATUSES = {s.value: s for s in Status}


def _unit_of(d: Any) -> Unit:
    """A unit from the server's JSON, checked against the schema it answers with (the fields,
    their types, enum values, ranges and lengths) and built without running every validator
    again: ``Unit.from_dict`` was ~1.4 ms of a recall's ~3.5 ms of client CPU (10 units). The
    boundary still holds: anything off the schema goes through ``Unit.from_dict``, which
    accepts what it would have (an older server's shape) or raises its ValidationError."""
    try:
        if type(d) is not dict or d.keys() != _UNIT_KEYS:
            raise TypeError
        ctx, prov, meta = d["context"], d["provenance"], d["meta"]
        uid, content, owner = d["id"], d["content"], d["owner"]
        if type(ctx) is not dict or type(prov) is not dict or type(meta) is not dict or ctx.keys() != _CONTEXT_KEYS:
            raise TypeError
        if not (type(uid) is str and 0 < len(uid) <= MAX_ID_CHARS and type(content) is str
                and len(content) <= MAX_CONTENT_CHARS and content.strip() and type(owner) is str and len(owner) <= MAX_FIELD_CHARS):
            raise TypeError
        if not (content.isascii() or content.encode("utf-8")):  # a lone surrogate raises (a ValueError)
            raise TypeError
        tags, domain, task, role = ctx["tags"], ctx["domain"], ctx["task"], ctx["role"]
        if type(tags) is not list or len(tags) > MAX_TAGS or (tags and not _strings(tags, MAX_FIELD_CHARS)):
            raise TypeError
        if not _strings((domain, task, role), MAX_FIELD_CHARS, empty=True):
            raise TypeError
        scores = (d["confidence"], d["validation"], d["importance"])
        for x in scores:
            if type(x) not in (float, int) or not 0.0 <= x <= 1.0:
                raise TypeError
        source, episodes, parents = prov.get("source", ""), prov.get("episodes", []), prov.get("derived_from", [])
        if (type(source) is not str or type(episodes) is not list or type(parents) is not list or not prov.keys() <= _PROV_KEYS
                or not _strings(episodes, MAX_ID_CHARS) or not _strings(parents, MAX_ID_CHARS)):
            raise TypeError
        created, updated, last = d["created_at"], d["updated_at"], d["last_access"]
        if not (_finite(created) and (updated is None or _finite(updated)) and (last is None or _finite(last))):
            raise TypeError
        count = d["access_count"]
        if type(count) is not int or count < 0:
            raise TypeError
        scope = _scope_of(d["scope"])
        if scope.kind == "private" and not owner:
            raise TypeError
        return Unit.restore(
            id=uid, kind=_KINDS[d["kind"]], content=content,
            context=Context.restore(domain=domain, task=task, role=role, tags=tuple(tags)),
            scope=scope, owner=owner, confidence=float(scores[0]), validation=float(scores[1]), importance=float(scores[2]),
            access_count=count, last_access=None if last is None else float(last), created_at=float(created),
            updated_at=float(created if updated is None else updated),
            provenance=Provenance.restore(source=source, episodes=tuple(episodes), derived_from=tuple(parents)),
            status=_STATUSES[d["status"]], meta=meta,
        )
    except (KeyError, TypeError, ValueError, ForgeError):
        return Unit.from_dict(d)  # the exact answer for anything off the fast path


_CONTEXT_KEYS = frozenset({"domain", "task", "role", "tags"})
_PROV_KEYS = frozenset({"source", "episodes", "derived_from"})


def _strings(values: Any, limit: int, *, empty: bool = False) -> bool:
    """Every value a string of at most ``limit`` characters (and not empty, unless ``empty``)."""
    for v in values:  # a loop, not all(): a generator per unit cost more than the checks  # noqa: SIM110
        if type(v) is not str or len(v) > limit or (not v and not empty):
            return False
    return True


def _finite(x: Any) -> bool:
    return type(x) in (float, int) and math.isfinite(x)


@functools.lru_cache(maxsize=1024)
def _scope_of(text: str) -> Scope:
    return Scope.parse(text)  # a Scope is frozen: one per distinct text is shared


def _admitted(body: Mapping[str, Any]) -> list[Admitted]:
    """POST /v1/units's answer as admission decisions (an older server sends only ids: added)."""
    rows = body.get("admission") or [{"action": "add", "unit_id": i, "incoming": i, "reason": ""} for i in body["ids"]]
    return [Admitted(r["action"], r["unit_id"], r.get("reason", ""), r.get("incoming", r["unit_id"]), r.get("existing"), r.get("similarity"))
            for r in rows]


def _recalls(d: Mapping[str, Any]) -> Recalls:
    out = Recalls(_recalled(r) for r in d["results"])
    out.recall_id = str(d.get("recall_id") or "")
    return out


def _packed(d: Mapping[str, Any]) -> Packed:
    """A context answer as the library's :class:`Packed` (its ``rules`` read from the units)."""
    sections = {n: [_recalled(r) for r in rs] for n, rs in d["sections"].items()}
    return Packed(sections, d["tokens"], d["budget"], [], recall_id=str(d.get("recall_id") or ""))


def _learn_body(trace: Any, outcome: Any) -> dict[str, Any]:
    """A trace and an outcome (typed or dicts) as ``POST /v1/learn`` takes them."""
    t = trace.to_dict() if hasattr(trace, "to_dict") else dict(trace)
    o = outcome.to_dict() if hasattr(outcome, "to_dict") else (dict(outcome) if outcome is not None else None)
    return {"trace": t, "outcome": o}


def _event(d: Mapping[str, Any]) -> Event:
    return Event(d["seq"], d["ts"], d["op"], d["unit_id"], d["actor"], d["data"])


def _raise_for(resp: httpx.Response) -> None:
    if resp.status_code < 400:
        return
    try:
        err = resp.json()["error"]
        message = f"{err['message']} (HTTP {resp.status_code} {err['code']})"
    except (ValueError, KeyError, TypeError):
        message = f"HTTP {resp.status_code}: {resp.text[:200]}"
    if resp.status_code == 429:
        raise BackendError(f"rate limited: {message}")
    raise _ERRORS.get(resp.status_code, StoreError if resp.status_code == 503 else BackendError)(message)


class _Calls:
    """Request building and response parsing shared by the sync and async clients."""

    def __init__(self, url: str, key: str | None) -> None:
        self.base = url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.me: dict[str, Any] | None = None

    def check_viewer(self, viewer: Viewer | None) -> None:
        if viewer is None or self.me is None or viewer.operator:
            return
        me = self.me
        if me["admin"] or viewer.agent != me["agent"] or not set(viewer.groups) <= set(me["groups"]):
            raise AccessError(
                f"this client's key acts as {'the operator' if me['admin'] else repr(me['agent'])}; the server takes the viewer "
                f"from the key, so use {viewer.agent!r}'s own key to see through its eyes"
            )

    @staticmethod
    def units(units: Unit | Sequence[Unit]) -> dict[str, Any]:
        units = [units] if isinstance(units, Unit) else list(units)
        return {"units": [_unit_in(u) for u in units]}

    @staticmethod
    def changes(unit: Unit) -> dict[str, Any]:
        """The fields a PATCH may change (the server keeps ids, owners and counters)."""
        return {k: v for k, v in _unit_in(unit).items() if k in ("content", "kind", "context", "scope", "confidence", "importance", "meta")}

    @staticmethod
    def turns(messages: Sequence[Any], scope: str, admit: bool) -> dict[str, Any]:
        from forge.curate.messages import parse_messages

        return {"messages": [{"role": m.role, "content": m.content} for m in parse_messages(messages)], "scope": scope, "admit": admit}

    @staticmethod
    def episode(episode: Episode) -> dict[str, Any]:
        d = episode.to_dict()
        d.pop("created_at")
        return d

    @staticmethod
    def ndjson(records: Iterable[dict[str, Any]]) -> bytes:
        return "".join(json.dumps(r) + "\n" for r in records).encode()


_NDJSON = {"content-type": "application/x-ndjson"}


class Client:
    """Synchronous client. ``transport`` lets tests pass an in-process ASGI transport."""

    def __init__(self, url: str, key: str | None = None, *, timeout: float = 30.0, retries: int = 3, transport: httpx.BaseTransport | None = None) -> None:
        self._c = _Calls(url, key)
        self.retries = retries
        self._http = httpx.Client(base_url=self._c.base, headers=self._c.headers, timeout=timeout, transport=transport)

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                resp = self._http.request(method, path, **kw)
            except httpx.HTTPError as exc:
                raise StoreError(f"cannot reach the FORGE server at {self._c.base}: {exc}") from None
            if resp.status_code == 429 and attempt < self.retries:
                time.sleep(min(float(resp.headers.get("retry-after", "1")), 10.0))
                continue
            _raise_for(resp)
            return resp
        raise AssertionError("unreachable")

    def _viewer(self, viewer: Viewer | None) -> None:
        if viewer is not None and self._c.me is None:
            self._c.me = self.whoami()
        self._c.check_viewer(viewer)

    def whoami(self) -> dict[str, Any]:
        return self._call("GET", "/v1/whoami").json()

    # -- writing --------------------------------------------------------------------------
    def add(self, units: Unit | Sequence[Unit], *, actor: str = "", batch_size: int = 256, admit: bool = True) -> list[str]:
        """Add units (one transaction per batch); the ids of the units that hold them now.

        The server admits each unit (a duplicate merges into the unit already stored, whose id
        is returned; a newer contradicting one supersedes it): :meth:`admit` says what it did.
        ``admit=False`` stores them as given. ``actor`` is ignored: the key is the actor.
        """
        return [d.unit_id for d in self._write(units, batch_size, admit)]

    def admit(self, units: Unit | Sequence[Unit], *, actor: str = "", batch_size: int = 256) -> list[Admitted]:
        """Add units through the server's admission: one decision each, as :func:`forge.curate.admit` returns."""
        return self._write(units, batch_size, True)

    def _write(self, units: Unit | Sequence[Unit], batch_size: int, admit: bool) -> list[Admitted]:
        units = [units] if isinstance(units, Unit) else list(units)
        out: list[Admitted] = []
        for i in range(0, len(units), batch_size):
            body = {**_Calls.units(units[i : i + batch_size]), "admit": admit}
            out += _admitted(self._call("POST", "/v1/units", json=body).json())
        return out

    def update(self, unit: Unit, *, actor: str = "", reembed: bool = True) -> Unit:
        return Unit.from_dict(self._call("PATCH", f"/v1/units/{unit.id}", json=_Calls.changes(unit)).json())

    def set_status(self, unit_id: str, status: Status | str, *, reason: str, actor: str = "") -> None:
        self._call("POST", f"/v1/units/{unit_id}/status", json={"status": Status.parse(status).value, "reason": reason})

    def relate(self, src: str, dst: str, type: str = "related_to", *, weight: float = 1.0, note: str = "", actor: str = "") -> Relation:
        body = {"src": src, "dst": dst, "type": str(type), "weight": weight, "note": note}
        return Relation.from_dict(self._call("POST", "/v1/relations", json=body).json())

    def add_messages(self, messages: Sequence[Any], *, scope: str = "global", admit: bool = True, actor: str = "") -> Ingested:
        """Remember a conversation with the server's LLM (see :meth:`forge.Memory.add_messages`)."""
        return Ingested.from_dict(self._call("POST", "/v1/messages", json=_Calls.turns(messages, scope, admit)).json())

    def erase(self, unit_id: str, *, reason: str, actor: str = "") -> dict[str, Any]:
        """Erase a unit for good (an admin key; see :meth:`forge.Memory.erase`); the tombstone."""
        return self._call("DELETE", f"/v1/units/{unit_id}", params={"reason": reason}).json()

    def add_episode(self, episode: Episode, *, actor: str = "") -> str:
        return self._call("POST", "/v1/episodes", json=_Calls.episode(episode)).json()["id"]

    def get_episode(self, episode_id: str) -> Episode:
        return Episode.from_dict(self._call("GET", f"/v1/episodes/{episode_id}").json())

    # -- reading --------------------------------------------------------------------------
    def get(self, unit_id: str, *, viewer: Viewer | None = None) -> Unit:
        self._viewer(viewer)
        return Unit.from_dict(self._call("GET", f"/v1/units/{unit_id}").json())

    def list(self, *, viewer: Viewer | None = None, filter: Filter = Filter(), limit: int = 100, offset: int = 0) -> list[Unit]:
        """Units the key may see that pass ``filter``, oldest first, unranked (as :meth:`forge.Memory.list`)."""
        self._viewer(viewer)
        return [Unit.from_dict(u) for u in self._call("GET", "/v1/units", params=_list_params(filter, limit, offset)).json()["units"]]

    def recall(self, query: str, *, viewer: Viewer | None = None, k: int = 10, filter: Filter = Filter(), hops: int = 1, touch: bool = True,
               min_score: float = 0.0) -> Recalls:
        """The ``k`` best units for ``query`` as the key sees them, scored 0-1; none below ``min_score``;
        ``recall_id`` names them for :meth:`outcome`."""
        self._viewer(viewer)
        body = {"query": query, "k": k, "hops": hops, "filter": _filter(filter), "touch": touch, "min_score": min_score}
        return _recalls(self._call("POST", "/v1/recall", json=body).json())

    def context(self, query: str, *, viewer: Viewer | None = None, budget: int = 512, k: int = 20, filter: Filter = Filter(), hops: int = 1,
                min_score: float = 0.0) -> Packed:
        self._viewer(viewer)
        body = {"query": query, "budget": budget, "k": k, "filter": _filter(filter), "hops": hops, "min_score": min_score}
        return _packed(self._call("POST", "/v1/context", json=body).json())

    # -- learning ---------------------------------------------------------------------------
    def outcome(self, recall_id: str, *, success: bool | None = None, score: float | None = None, feedback: str = "") -> dict[str, Any]:
        """How the decision a recall fed turned out: credits the units it showed, once
        (``{"recall_id", "success", "credited", "retired"}``)."""
        body = {"recall_id": recall_id, "success": success, "score": score, "feedback": feedback}
        return dict(self._call("POST", "/v1/outcomes", json=body).json())

    def learn(self, trace: Any, outcome: Any = None, *, wait: bool = False, timeout: float = 120.0) -> dict[str, Any]:
        """Learn from a task (a :class:`~forge.learn.trace.Trace` or its dict) and its outcome:
        a job on the server. Its ``{"job_id", "status", "url"}``, or with ``wait`` the finished
        job (:meth:`job`)."""
        job = dict(self._call("POST", "/v1/learn", json=_learn_body(trace, outcome)).json())
        if not wait:
            return job
        end = time.monotonic() + timeout
        while True:
            got = self.job(job["job_id"])
            if got["status"] in ("done", "failed") or time.monotonic() > end:
                return got
            time.sleep(0.1)

    def job(self, job_id: str) -> dict[str, Any]:
        """How a learning job stands: ``status`` queued, running, done or failed; ``result``
        says what was learned and which peers received it."""
        return dict(self._call("GET", f"/v1/jobs/{job_id}").json())

    def relations(self, unit_id: str) -> builtins.list[Relation]:
        return [Relation.from_dict(r) for r in self._call("GET", f"/v1/units/{unit_id}/relations").json()]

    def trace(self, unit_id: str) -> dict[str, Any]:
        return self._call("GET", f"/v1/units/{unit_id}/trace").json()

    def events(self, **params: Any) -> builtins.list[Event]:
        return [_event(e) for e in self._call("GET", "/v1/events", params=params).json()["events"]]

    def stats(self) -> dict[str, Any]:
        return self._call("GET", "/v1/stats").json()

    # -- bulk -----------------------------------------------------------------------------
    def export(self) -> Iterator[dict[str, Any]]:
        with self._http.stream("GET", "/v1/export") as resp:
            if resp.status_code >= 400:
                resp.read()
                _raise_for(resp)
            for line in resp.iter_lines():
                if line.strip():
                    yield json.loads(line)

    def import_records(self, records: Iterable[dict[str, Any]], *, actor: str = "import", history: bool = False) -> int:
        """Import export records (admin); ``history``: also the audit events and settings they carry."""
        params = {"include_history": "true"} if history else None
        return self._call("POST", "/v1/import", content=_Calls.ndjson(records), headers=_NDJSON, params=params).json()["records"]

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncClient:
    """The same verbs as coroutines, over ``httpx.AsyncClient``."""

    def __init__(self, url: str, key: str | None = None, *, timeout: float = 30.0, retries: int = 3, transport: httpx.AsyncBaseTransport | None = None) -> None:
        self._c = _Calls(url, key)
        self.retries = retries
        self._http = httpx.AsyncClient(base_url=self._c.base, headers=self._c.headers, timeout=timeout, transport=transport)

    async def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        for attempt in range(self.retries + 1):
            try:
                resp = await self._http.request(method, path, **kw)
            except httpx.HTTPError as exc:
                raise StoreError(f"cannot reach the FORGE server at {self._c.base}: {exc}") from None
            if resp.status_code == 429 and attempt < self.retries:
                await asyncio.sleep(min(float(resp.headers.get("retry-after", "1")), 10.0))
                continue
            _raise_for(resp)
            return resp
        raise AssertionError("unreachable")

    async def _viewer(self, viewer: Viewer | None) -> None:
        if viewer is not None and self._c.me is None:
            self._c.me = await self.whoami()
        self._c.check_viewer(viewer)

    async def whoami(self) -> dict[str, Any]:
        return (await self._call("GET", "/v1/whoami")).json()

    async def add(self, units: Unit | Sequence[Unit], *, actor: str = "", batch_size: int = 256, admit: bool = True) -> list[str]:
        return [d.unit_id for d in await self._write(units, batch_size, admit)]

    async def admit(self, units: Unit | Sequence[Unit], *, actor: str = "", batch_size: int = 256) -> list[Admitted]:
        return await self._write(units, batch_size, True)

    async def _write(self, units: Unit | Sequence[Unit], batch_size: int, admit: bool) -> list[Admitted]:
        units = [units] if isinstance(units, Unit) else list(units)
        out: list[Admitted] = []
        for i in range(0, len(units), batch_size):
            body = {**_Calls.units(units[i : i + batch_size]), "admit": admit}
            out += _admitted((await self._call("POST", "/v1/units", json=body)).json())
        return out

    async def set_status(self, unit_id: str, status: Status | str, *, reason: str, actor: str = "") -> None:
        await self._call("POST", f"/v1/units/{unit_id}/status", json={"status": Status.parse(status).value, "reason": reason})

    async def relate(self, src: str, dst: str, type: str = "related_to", *, weight: float = 1.0, note: str = "", actor: str = "") -> Relation:
        body = {"src": src, "dst": dst, "type": str(type), "weight": weight, "note": note}
        return Relation.from_dict((await self._call("POST", "/v1/relations", json=body)).json())

    async def add_messages(self, messages: Sequence[Any], *, scope: str = "global", admit: bool = True, actor: str = "") -> Ingested:
        return Ingested.from_dict((await self._call("POST", "/v1/messages", json=_Calls.turns(messages, scope, admit))).json())

    async def erase(self, unit_id: str, *, reason: str, actor: str = "") -> dict[str, Any]:
        return (await self._call("DELETE", f"/v1/units/{unit_id}", params={"reason": reason})).json()

    async def get(self, unit_id: str, *, viewer: Viewer | None = None) -> Unit:
        await self._viewer(viewer)
        return Unit.from_dict((await self._call("GET", f"/v1/units/{unit_id}")).json())

    async def list(self, *, viewer: Viewer | None = None, filter: Filter = Filter(), limit: int = 100, offset: int = 0) -> list[Unit]:
        await self._viewer(viewer)
        got = (await self._call("GET", "/v1/units", params=_list_params(filter, limit, offset))).json()["units"]
        return [Unit.from_dict(u) for u in got]

    async def recall(self, query: str, *, viewer: Viewer | None = None, k: int = 10, filter: Filter = Filter(), hops: int = 1, touch: bool = True,
                     min_score: float = 0.0) -> Recalls:
        await self._viewer(viewer)
        body = {"query": query, "k": k, "hops": hops, "filter": _filter(filter), "touch": touch, "min_score": min_score}
        return _recalls((await self._call("POST", "/v1/recall", json=body)).json())

    async def context(self, query: str, *, viewer: Viewer | None = None, budget: int = 512, k: int = 20, filter: Filter = Filter(), hops: int = 1,
                      min_score: float = 0.0) -> Packed:
        await self._viewer(viewer)
        body = {"query": query, "budget": budget, "k": k, "filter": _filter(filter), "hops": hops, "min_score": min_score}
        return _packed((await self._call("POST", "/v1/context", json=body)).json())

    async def outcome(self, recall_id: str, *, success: bool | None = None, score: float | None = None, feedback: str = "") -> dict[str, Any]:
        body = {"recall_id": recall_id, "success": success, "score": score, "feedback": feedback}
        return dict((await self._call("POST", "/v1/outcomes", json=body)).json())

    async def learn(self, trace: Any, outcome: Any = None, *, wait: bool = False, timeout: float = 120.0) -> dict[str, Any]:
        job = dict((await self._call("POST", "/v1/learn", json=_learn_body(trace, outcome))).json())
        if not wait:
            return job
        end = time.monotonic() + timeout
        while True:
            got = await self.job(job["job_id"])
            if got["status"] in ("done", "failed") or time.monotonic() > end:
                return got
            await asyncio.sleep(0.1)

    async def job(self, job_id: str) -> dict[str, Any]:
        return dict((await self._call("GET", f"/v1/jobs/{job_id}")).json())

    async def update(self, unit: Unit, *, actor: str = "", reembed: bool = True) -> Unit:
        return Unit.from_dict((await self._call("PATCH", f"/v1/units/{unit.id}", json=_Calls.changes(unit))).json())

    async def add_episode(self, episode: Episode, *, actor: str = "") -> str:
        return (await self._call("POST", "/v1/episodes", json=_Calls.episode(episode))).json()["id"]

    async def get_episode(self, episode_id: str) -> Episode:
        return Episode.from_dict((await self._call("GET", f"/v1/episodes/{episode_id}")).json())

    async def relations(self, unit_id: str) -> builtins.list[Relation]:
        return [Relation.from_dict(r) for r in (await self._call("GET", f"/v1/units/{unit_id}/relations")).json()]

    async def trace(self, unit_id: str) -> dict[str, Any]:
        return (await self._call("GET", f"/v1/units/{unit_id}/trace")).json()

    async def stats(self) -> dict[str, Any]:
        return (await self._call("GET", "/v1/stats")).json()

    async def export(self) -> AsyncIterator[dict[str, Any]]:
        async with self._http.stream("GET", "/v1/export") as resp:
            if resp.status_code >= 400:
                await resp.aread()
                _raise_for(resp)
            async for line in resp.aiter_lines():
                if line.strip():
                    yield json.loads(line)

    async def import_records(self, records: Iterable[dict[str, Any]], *, actor: str = "import", history: bool = False) -> int:
        params = {"include_history": "true"} if history else None
        return (await self._call("POST", "/v1/import", content=_Calls.ndjson(records), headers=_NDJSON, params=params)).json()["records"]

    async def events(self, **params: Any) -> builtins.list[Event]:
        return [_event(e) for e in (await self._call("GET", "/v1/events", params=params)).json()["events"]]

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
