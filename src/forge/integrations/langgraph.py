"""``ForgeStore``: FORGE memory as a LangGraph ``BaseStore`` (long-term memory for graphs), and
``learn_node``: a node that learns from the run that reached it.

    from forge import Memory
    from forge.integrations.langgraph import ForgeStore
    store = ForgeStore(Memory.open("team.db"), agent="planner", groups=["ops"])
    graph = builder.compile(store=store)          # nodes get it as `store`

    store = ForgeStore(Client("http://memory:8765", key))        # the same, on the service
    store = ForgeStore(AsyncClient("http://memory:8765", key))   # async graphs (aput, asearch...)

Each item is one FORGE unit, so LangGraph memories are recalled, scored, explained, audited
and shared like any other. Over a client the key decides the agent and its groups. The mapping:

- **key + namespace -> unit id**: a stable hash, so a put on the same key updates the unit;
- **namespace -> scope and tags**: a namespace starting with ``("private", ...)`` is private to
  ``agent``; ``("group", NAME, ...)`` is scoped to that group; anything else is global. Every
  prefix of the namespace is a tag, so a namespace-prefix search is a tag filter inside the
  store query (scope is enforced there as well);
- **value -> content + meta**: the text that is embedded is ``value["content"]`` (or
  ``text``, ``memory``, ``description``, ``body``), else the JSON of the value; the value
  itself is kept whole in ``meta``;
- **a new key goes through admission** (:func:`forge.curate.admit`, ``admit=False`` to
  store as given), within its namespace: a duplicate of an item already there is merged
  into it, and the new key becomes another name for that unit (``get`` returns the value
  put under it, a query search returns the memory once, a listing without a query lists
  every key); a newer statement that contradicts an item supersedes it, and the old key
  then reads as deleted (its text stays in the unit's history). ``last_admission`` holds
  the latest put's decision;
- **delete -> archive**: FORGE never erases here (the change history stays); an archived
  item is gone for get and search, and a later put on its key brings it back.

Search with ``query`` is FORGE's hybrid recall (``SearchItem.score`` is its fused score);
``filter`` matches value fields exactly or with ``$eq $ne $gt $gte $lt $lte``.

Learning: ``learn_node(memory, outcome=judge)`` is a node to put at the end of a graph. It
reads the state's messages (the user's, the model's replies and tool calls, the tools'
answers and errors) as a trace, asks ``judge(state)`` how the task went (a dict of
``success``, ``score``, ``feedback``, or a :class:`forge.learn.trace.Outcome`), and sends both
to FORGE's learning entry (``POST /v1/learn`` over a client, :meth:`forge.Memory.learn` over a
memory, as ``agent``). Recall ids the state holds under ``recall_ids`` are credited with the
outcome. :class:`forge.integrations.langchain.ForgeTraceHandler` records a graph's run as a
callback instead (``config={"callbacks": [handler]}``), for graphs whose state has no messages.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import Callable, Coroutine, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from forge.curate.admission import ADD, NOOP, Admitted
from forge.errors import AccessError, ConfigError, ValidationError
from forge.integrations._learn import TraceRecorder, areport, report
from forge.integrations._port import ForgeMemory
from forge.learn.trace import Outcome
from forge.model import Context, Provenance, Status, Unit, Viewer, derived_id
from forge.store import Filter

__all__ = ["ForgeStore", "learn_node"]

_MARK = "langgraph"  # tag on every unit this store writes
_TEXT_FIELDS = ("content", "text", "memory", "description", "body")
_EVERY_STATUS = [s.value for s in Status]


def _ns_tag(prefix: tuple[str, ...]) -> str:
    return "lg:" + json.dumps(list(prefix), separators=(",", ":"))


def _unit_id(namespace: tuple[str, ...], key: str) -> str:
    return derived_id("lg", json.dumps([list(namespace), key]), algorithm="sha256", digits=32, sep="-")


def _key_tag(namespace: tuple[str, ...], key: str) -> str:
    """The tag of a unit that holds a key it was not created for (a merged duplicate's)."""
    return "lgk:" + _unit_id(namespace, key)


def _keys(unit: Unit) -> list[tuple[str, Any]]:
    """(key, value) of every item a unit holds: the one it was made for, then merged ones."""
    lg = unit.meta.get(_MARK) or {}
    first = [(lg["key"], lg["value"])] if "key" in lg else []
    return first + [(a["key"], a["value"]) for a in lg.get("aliases", [])]


def _holds(unit: Unit, namespace: tuple[str, ...], key: str) -> bool:
    lg = unit.meta.get(_MARK) or {}
    return tuple(lg.get("namespace", ())) == namespace and any(k == key for k, _ in _keys(unit))


def _drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never waits (one over a blocking backend) to its end, here.

    The store's logic is written once, as coroutines over a backend; a blocking backend's
    methods return without suspending, so one ``send`` finishes them, with no event loop.
    """
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a blocking backend suspended")  # a bug: the blocking backends never wait


_ASYNC_ONLY = ("this ForgeStore is over an AsyncClient: use the async methods (aput, aget, asearch, ...), "
               "or give it a Client for the sync ones")


class _Local:
    """A :class:`forge.Memory` in this process; admission by :func:`forge.curate.admit`."""

    blocking = True

    def __init__(self, memory: ForgeMemory, agent: str, groups: frozenset[str]) -> None:
        self.memory, self.agent, self.groups = memory, agent, groups
        self.viewer = Viewer.of(agent, groups)

    async def who(self) -> tuple[str, frozenset[str]]:
        return self.agent, self.groups

    async def find(self, unit_id: str) -> Unit | None:
        found = self.memory.get_many([unit_id], viewer=self.viewer)
        return found[0] if found else None

    async def page(self, f: Filter, limit: int, offset: int) -> list[Unit]:
        return self.memory.list(viewer=self.viewer, filter=f, limit=limit, offset=offset)

    async def write(self, unit: Unit, admit: bool) -> Admitted:
        if admit:
            from forge.curate.admission import admit as admit_units

            return admit_units(self.memory, unit, actor=self.agent)[0]
        [uid] = self.memory.add(unit, actor=self.agent)
        return Admitted(ADD, uid, "stored as given (admission off)", uid)

    async def update(self, unit: Unit, *, reembed: bool) -> None:
        self.memory.update(unit, actor=self.agent, reembed=reembed)

    async def set_status(self, unit_id: str, status: Status, reason: str) -> None:
        self.memory.set_status(unit_id, status, reason=reason, actor=self.agent)

    async def recall(self, query: str, k: int, f: Filter) -> list[tuple[Unit, float]]:
        hits = self.memory.recall(query, viewer=self.viewer, k=k, filter=f, hops=0, touch=False)
        return [(r.unit, r.score) for r in hits]


class _Remote:
    """A :class:`forge.client.Client`: the service admits, and the key is the viewer."""

    blocking = True

    def __init__(self, client: Any, agent: str | None, groups: frozenset[str]) -> None:
        self.client, self.agent, self.groups = client, agent, groups

    async def _do(self, name: str, *args: Any, **kw: Any) -> Any:
        return getattr(self.client, name)(*args, **kw)

    async def who(self) -> tuple[str, frozenset[str]]:
        if self.agent is None:
            me = await self._do("whoami")
            self.agent, self.groups = me["agent"] or "langgraph", frozenset(me["groups"])
        return self.agent, self.groups

    async def find(self, unit_id: str) -> Unit | None:
        from forge.errors import NotFoundError

        try:
            return await self._do("get", unit_id)
        except NotFoundError:
            return None

    async def page(self, f: Filter, limit: int, offset: int) -> list[Unit]:
        return await self._do("list", filter=f, limit=min(limit, 1000), offset=offset)

    async def write(self, unit: Unit, admit: bool) -> Admitted:
        if admit:
            return (await self._do("admit", unit))[0]
        [uid] = await self._do("add", unit, admit=False)
        return Admitted(ADD, uid, "stored as given (admission off)", uid)

    async def update(self, unit: Unit, *, reembed: bool) -> None:
        await self._do("update", unit)

    async def set_status(self, unit_id: str, status: Status, reason: str) -> None:
        await self._do("set_status", unit_id, status, reason=reason)

    async def recall(self, query: str, k: int, f: Filter) -> list[tuple[Unit, float]]:
        return [(r.unit, r.score) for r in await self._do("recall", query, k=min(k, 200), filter=f, hops=0, touch=False)]


class _AsyncRemote(_Remote):
    """A :class:`forge.client.AsyncClient`: the same calls, awaited."""

    blocking = False

    async def _do(self, name: str, *args: Any, **kw: Any) -> Any:
        return await getattr(self.client, name)(*args, **kw)


def _backend(memory: ForgeMemory, agent: str | None, groups: frozenset[str]) -> Any:
    from forge.client import AsyncClient, Client

    if isinstance(memory, AsyncClient):
        return _AsyncRemote(memory, agent, groups)
    if isinstance(memory, Client):
        return _Remote(memory, agent, groups)
    return _Local(memory, agent or "langgraph", groups)


class ForgeStore(BaseStore):
    """A LangGraph store over a :class:`forge.Memory`, a :class:`forge.client.Client` or an
    :class:`~forge.client.AsyncClient`, seen and written as one agent.

    ``agent`` and ``groups`` default to the key's over a client (and ``"langgraph"`` over a
    memory); ``admit=False`` stores every put as given, without admission.
    """

    def __init__(self, memory: ForgeMemory, *, agent: str | None = None, groups: Iterable[str] = (), kind: str = "fact",
                 admit: bool = True) -> None:
        self.memory = memory
        self.kind = kind
        self.admit = admit
        self.last_admission: Admitted | None = None
        self._backend = _backend(memory, agent, frozenset(groups))

    @property
    def agent(self) -> str:
        """The agent this store reads and writes as (over a client: the key's, asked once;
        over an AsyncClient known after the first async call)."""
        self._know()
        return self._backend.agent

    @property
    def groups(self) -> frozenset[str]:
        self._know()
        return self._backend.groups

    def _know(self) -> None:
        if self._backend.agent is None:
            if not self._backend.blocking:
                raise ConfigError(_ASYNC_ONLY)
            _drive(self._backend.who())

    # -- the two methods LangGraph needs -------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        if not self._backend.blocking:
            raise ConfigError(_ASYNC_ONLY)
        return _drive(self._run(list(ops)))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        if self._backend.blocking:  # a blocking memory or client: off the event loop
            return await asyncio.to_thread(self.batch, list(ops))
        return await self._run(list(ops))

    async def _run(self, ops: list[Op]) -> list[Result]:
        results: list[Result] = [None] * len(ops)
        for i, op in enumerate(ops):  # in order: a get after a put in one batch sees it
            if isinstance(op, GetOp):
                results[i] = await self._get(op)
            elif isinstance(op, SearchOp):
                results[i] = await self._search(op)
            elif isinstance(op, ListNamespacesOp):
                results[i] = await self._list_namespaces(op)
            elif isinstance(op, PutOp):
                await self._put(op)
            else:
                raise ValueError(f"unknown store operation {type(op).__name__}")
        return results

    # -- operations ----------------------------------------------------------------------
    async def _scope(self, namespace: tuple[str, ...]) -> tuple[str, str]:
        agent, _ = await self._backend.who()
        if namespace[0] == "private":
            return "private", agent
        if namespace[0] == "group" and len(namespace) > 1:
            return f"group:{namespace[1]}", agent
        return "global", agent

    async def _unit(self, namespace: tuple[str, ...], key: str) -> Unit | None:
        """The unit holding ``key``: the one made for it, else one it was merged into."""
        unit = await self._backend.find(_unit_id(namespace, key))
        if unit is not None and _holds(unit, namespace, key):
            return unit
        tagged = Filter.make(tags_all=[_key_tag(namespace, key)], status=_EVERY_STATUS)
        return next((u for u in await self._backend.page(tagged, 10, 0) if _holds(u, namespace, key)), None)

    def _item(self, unit: Unit, key: str, value: Any, cls: type[Item] = Item, score: float | None = None) -> Item:
        kw: dict[str, Any] = {"score": score} if cls is SearchItem else {}
        return cls(
            value=value,
            key=key,
            namespace=tuple(unit.meta[_MARK]["namespace"]),
            created_at=datetime.fromtimestamp(unit.created_at, tz=UTC),
            updated_at=datetime.fromtimestamp(unit.updated_at or unit.created_at, tz=UTC),
            **kw,
        )

    async def _get(self, op: GetOp) -> Item | None:
        unit = await self._unit(tuple(op.namespace), op.key)
        if unit is None or unit.status is not Status.ACTIVE:
            return None
        value = next(v for k, v in _keys(unit) if k == op.key)
        return self._item(unit, op.key, value)

    async def _put(self, op: PutOp) -> None:
        namespace = tuple(op.namespace)
        existing = await self._unit(namespace, op.key)
        if op.value is None:
            if existing is not None and existing.status is Status.ACTIVE:
                await self._detach(existing, namespace, op.key, why="deleted through LangGraph")
            return
        value = dict(op.value)
        text = next((value[f] for f in _TEXT_FIELDS if isinstance(value.get(f), str) and value[f].strip()), None)
        content = text or json.dumps(value, sort_keys=True, default=str)
        scope, owner = await self._scope(namespace)
        tags = (_MARK, *(_ns_tag(namespace[: i + 1]) for i in range(len(namespace))))
        context = Context(task=_ns_tag(namespace), tags=tags)  # admission compares within a namespace
        meta = {_MARK: {"namespace": list(namespace), "key": op.key, "value": value}}
        if existing is not None and len(_keys(existing)) == 1:  # its own unit: updated in place
            changed = existing.replace(content=content, context=context, scope=scope, meta={**existing.meta, **meta})
            await self._backend.update(changed, reembed=changed.text != existing.text)
            if existing.status is not Status.ACTIVE:
                await self._backend.set_status(existing.id, Status.ACTIVE, "put again through LangGraph")
            self.last_admission = None
            return
        if existing is not None:  # merged with other keys: this key leaves, and is put anew
            await self._detach(existing, namespace, op.key, why="put anew through LangGraph")
        uid = _unit_id(namespace, op.key)
        taken = await self._backend.find(uid) is not None
        if taken:  # the key's own id went to a unit that holds other keys now: tag the new one
            context = Context(task=context.task, tags=(*tags, _key_tag(namespace, op.key)))
        named: dict[str, Any] = {} if taken else {"id": uid}
        unit = Unit(content=content, kind=self.kind, context=context, scope=scope, owner=owner,  # type: ignore[arg-type]
                    provenance=Provenance(source=f"langgraph:{owner}"), meta=meta, **named)
        decision = await self._backend.write(unit, self.admit)
        if decision.action == NOOP and decision.unit_id != unit.id:
            decision = await self._alias(decision, unit, namespace, op.key, value)
        self.last_admission = decision

    async def _alias(self, decision: Admitted, unit: Unit, namespace: tuple[str, ...], key: str, value: Any) -> Admitted:
        """The put was merged into another unit: that unit now holds this key too."""
        into = await self._backend.find(decision.unit_id)
        if into is not None and _MARK in into.meta and tuple(into.meta[_MARK]["namespace"]) == namespace:
            lg = dict(into.meta[_MARK])
            lg["aliases"] = [*(a for a in lg.get("aliases", []) if a["key"] != key), {"key": key, "value": value}]
            tags = tuple(dict.fromkeys((*into.context.tags, _key_tag(namespace, key))))
            try:
                await self._backend.update(into.replace(meta={**into.meta, _MARK: lg}, context=dataclasses.replace(into.context, tags=tags)),
                                           reembed=False)
                return decision
            except (AccessError, ValidationError):
                pass  # another agent's unit over the service, or one full of keys: this key gets its own
        return await self._backend.write(unit, False)

    async def _detach(self, unit: Unit, namespace: tuple[str, ...], key: str, *, why: str) -> None:
        """``key`` no longer names ``unit``: archived if it was its only key, else the key is dropped."""
        held = _keys(unit)
        if len(held) == 1:
            await self._backend.set_status(unit.id, Status.ARCHIVED, why)
            return
        rest = [(k, v) for k, v in held if k != key]
        lg = {"namespace": list(namespace), "key": rest[0][0], "value": rest[0][1],
              "aliases": [{"key": k, "value": v} for k, v in rest[1:]]}
        tags = tuple(t for t in unit.context.tags if t != _key_tag(namespace, key))
        await self._backend.update(unit.replace(meta={**unit.meta, _MARK: lg}, context=dataclasses.replace(unit.context, tags=tags)), reembed=False)

    async def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        f = Filter.make(tags_all=[_ns_tag(prefix)] if prefix else [_MARK])
        want = max(0, op.offset) + max(0, op.limit)
        if want == 0:
            return []
        found: list[tuple[Unit, str, Any, float | None]] = []
        if op.query:  # a memory once, under its first key
            k = min(200, max(want * 4, 20)) if op.filter else min(200, want)
            for unit, score in await self._backend.recall(op.query, k, f):
                key, value = next(((k_, v) for k_, v in _keys(unit) if _matches(v, op.filter)), (None, None))
                if key is not None:
                    found.append((unit, key, value, score))
        else:  # a listing: every key
            offset = 0
            while len(found) < want:
                page = await self._backend.page(f, 500, offset)
                found += [(u, k_, v, None) for u in page for k_, v in _keys(u) if _matches(v, op.filter)]
                if len(page) < 500:
                    break
                offset += 500
        return [self._item(u, k_, v, SearchItem, s) for u, k_, v, s in found[op.offset : op.offset + op.limit]]  # type: ignore[misc]

    async def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        spaces: set[tuple[str, ...]] = set()
        offset = 0
        f = Filter.make(tags_all=[_MARK])
        while True:
            page = await self._backend.page(f, 1000, offset)
            spaces.update(tuple(u.meta[_MARK]["namespace"]) for u in page)
            if len(page) < 1000:
                break
            offset += 1000
        if op.match_conditions:
            spaces = {s for s in spaces if all(_namespace_matches(c, s) for c in op.match_conditions)}
        if op.max_depth is not None:
            spaces = {s[: op.max_depth] for s in spaces}
        return sorted(spaces)[op.offset : op.offset + op.limit]


def _namespace_matches(cond: MatchCondition, ns: tuple[str, ...]) -> bool:
    path = tuple(cond.path)
    if len(ns) < len(path):
        return False
    part = ns[: len(path)] if cond.match_type == "prefix" else ns[len(ns) - len(path) :]
    return all(want == "*" or want == have for want, have in zip(path, part, strict=True))


_OPS = {
    "$eq": lambda a, b: a == b,
    "$ne": lambda a, b: a != b,
    "$gt": lambda a, b: (x := _num(a)) is not None and x > _bound(b),
    "$gte": lambda a, b: (x := _num(a)) is not None and x >= _bound(b),
    "$lt": lambda a, b: (x := _num(a)) is not None and x < _bound(b),
    "$lte": lambda a, b: (x := _num(a)) is not None and x <= _bound(b),
}


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


def _bound(v: Any) -> float:
    """A comparison's bound: a number (anything else is a TypeError, as comparing with None was)."""
    n = _num(v)
    if n is None:
        raise TypeError(f"a comparison bound must be a number, got {v!r}")
    return n


def _matches(value: Mapping[str, Any], flt: Mapping[str, Any] | None) -> bool:
    """Every filter field equals the value's (nested objects compared field by field), or
    passes its comparison operators."""
    if not flt:
        return True
    return all(_field(value.get(k), want) for k, want in flt.items())


def _field(have: Any, want: Any) -> bool:
    if isinstance(want, Mapping):
        if want and all(isinstance(k, str) and k.startswith("$") for k in want):
            for op, arg in want.items():
                if op not in _OPS:
                    raise ValueError(f"unsupported filter operator {op!r}; use one of {', '.join(_OPS)}")
                if not _OPS[op](have, arg):
                    return False
            return True
        return isinstance(have, Mapping) and all(_field(have.get(k), v) for k, v in want.items())
    return have == want


# -- learning -------------------------------------------------------------------------------


def _field_of(state: Any, key: str) -> Any:
    """A state's field: a dict state's key, or a dataclass or pydantic state's attribute."""
    return state.get(key) if isinstance(state, Mapping) else getattr(state, key, None)


def learn_node(memory: ForgeMemory, *, outcome: Callable[[Any], Mapping[str, Any] | Outcome], kind: str = "", agent: str = "",
               wait: bool = False, messages_key: str = "messages", recall_ids_key: str = "recall_ids",
               result_key: str | None = None) -> Callable[[Any], Any]:
    """A graph node that reports the run in the state to ``memory``'s learning entry (see the
    module docstring). It changes no state, unless ``result_key`` names the state field that
    receives what came back (the queued job over a client, what was learned over a memory).
    Over an :class:`~forge.client.AsyncClient` the node is async (run the graph with ``ainvoke``)."""
    from forge.client import AsyncClient
    from forge.integrations.langchain import record_messages

    def judged(state: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        rec = record_messages(TraceRecorder(kind=kind), list(_field_of(state, messages_key) or []))
        for rid in _field_of(state, recall_ids_key) or []:
            rec.recalled(rid)
        said = outcome(state)
        verdict = said.to_dict() if isinstance(said, Outcome) else Outcome.from_dict(said).to_dict()
        return rec.trace(), verdict

    def done(got: dict[str, Any]) -> dict[str, Any]:
        return {result_key: got} if result_key else {}

    if isinstance(memory, AsyncClient):
        async def alearn(state: Any) -> dict[str, Any]:
            trace, verdict = judged(state)
            return done(await areport(memory, trace, **verdict, agent=agent, wait=wait))

        return alearn

    def learn(state: Any) -> dict[str, Any]:
        trace, verdict = judged(state)
        return done(report(memory, trace, **verdict, agent=agent, wait=wait))

    return learn
