"""``ForgeStore``: FORGE memory as a LangGraph ``BaseStore`` (long-term memory for graphs).

    from forge import Memory
    from forge.integrations.langgraph import ForgeStore
    store = ForgeStore(Memory.open("team.db"), agent="planner", groups=["ops"])
    graph = builder.compile(store=store)          # nodes get it as `store`

Each item is one FORGE unit, so LangGraph memories are recalled, scored, explained, audited
and shared like any other. The mapping:

- **key + namespace -> unit id**: a stable hash, so a put on the same key updates the unit;
- **namespace -> scope and tags**: a namespace starting with ``("private", ...)`` is private to
  ``agent``; ``("group", NAME, ...)`` is scoped to that group; anything else is global. Every
  prefix of the namespace is a tag, so a namespace-prefix search is a tag filter inside the
  store query (scope is enforced there as well);
- **value -> content + meta**: the text that is embedded is ``value["content"]`` (or
  ``text``, ``memory``, ``description``, ``body``), else the JSON of the value; the value
  itself is kept whole in ``meta``;
- **delete -> archive**: FORGE never erases (the change history stays); an archived item is
  gone for get and search, and a later put on its key brings it back.

Search with ``query`` is FORGE's hybrid recall (``SearchItem.score`` is its fused score);
``filter`` matches value fields exactly or with ``$eq $ne $gt $gte $lt $lte``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable, Mapping
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

from forge.model import Context, Provenance, Status, Unit, Viewer, derived_id
from forge.store import Filter

__all__ = ["ForgeStore"]

_MARK = "langgraph"  # tag on every unit this store writes
_TEXT_FIELDS = ("content", "text", "memory", "description", "body")
_ANY = frozenset(Status)


def _ns_tag(prefix: tuple[str, ...]) -> str:
    return "lg:" + json.dumps(list(prefix), separators=(",", ":"))


def _unit_id(namespace: tuple[str, ...], key: str) -> str:
    return derived_id("lg", json.dumps([list(namespace), key]), algorithm="sha256", digits=32, sep="-")


class ForgeStore(BaseStore):
    """A LangGraph store over a :class:`forge.Memory`, seen and written as one agent."""

    def __init__(self, memory: Any, *, agent: str = "langgraph", groups: Iterable[str] = (), kind: str = "fact") -> None:
        self.memory = memory
        self.agent = agent
        self.groups = frozenset(groups)
        self.viewer = Viewer.of(agent, self.groups)
        self.kind = kind

    # -- the two methods LangGraph needs -------------------------------------------------
    def batch(self, ops: Iterable[Op]) -> list[Result]:
        ops = list(ops)
        results: list[Result] = [None] * len(ops)
        # Puts are applied in order, after the last put on each key wins (LangGraph's semantics).
        for i, op in enumerate(ops):
            if isinstance(op, GetOp):
                results[i] = self._get(op)
            elif isinstance(op, SearchOp):
                results[i] = self._search(op)
            elif isinstance(op, ListNamespacesOp):
                results[i] = self._list_namespaces(op)
            elif isinstance(op, PutOp):
                self._put(op)
            else:
                raise ValueError(f"unknown store operation {type(op).__name__}")
        return results

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    # -- operations ----------------------------------------------------------------------
    def _scope(self, namespace: tuple[str, ...]) -> tuple[str, str]:
        if namespace[0] == "private":
            return "private", self.agent
        if namespace[0] == "group" and len(namespace) > 1:
            return f"group:{namespace[1]}", self.agent
        return "global", self.agent

    def _unit(self, namespace: tuple[str, ...], key: str) -> Unit | None:
        found = self.memory.store.get_many([_unit_id(namespace, key)], viewer=self.viewer)
        return found[0] if found else None

    def _item(self, unit: Unit, cls: type[Item] = Item, score: float | None = None) -> Item:
        lg = unit.meta[_MARK]
        kw: dict[str, Any] = {"score": score} if cls is SearchItem else {}
        return cls(
            value=lg["value"],
            key=lg["key"],
            namespace=tuple(lg["namespace"]),
            created_at=datetime.fromtimestamp(unit.created_at, tz=UTC),
            updated_at=datetime.fromtimestamp(unit.updated_at or unit.created_at, tz=UTC),
            **kw,
        )

    def _get(self, op: GetOp) -> Item | None:
        unit = self._unit(tuple(op.namespace), op.key)
        return self._item(unit) if unit is not None and unit.status is Status.ACTIVE else None

    def _put(self, op: PutOp) -> None:
        namespace = tuple(op.namespace)
        existing = self._unit(namespace, op.key)
        if op.value is None:
            if existing is not None and existing.status is Status.ACTIVE:
                self.memory.set_status(existing.id, Status.ARCHIVED, reason="deleted through LangGraph", actor=self.agent)
            return
        value = dict(op.value)
        text = next((value[f] for f in _TEXT_FIELDS if isinstance(value.get(f), str) and value[f].strip()), None)
        content = text or json.dumps(value, sort_keys=True, default=str)
        scope, owner = self._scope(namespace)
        tags = (_MARK, *(_ns_tag(namespace[: i + 1]) for i in range(len(namespace))))
        meta = {_MARK: {"namespace": list(namespace), "key": op.key, "value": value}}
        if existing is None:
            unit = Unit(content=content, kind=self.kind, id=_unit_id(namespace, op.key), context=Context(tags=tags),  # type: ignore[arg-type]
                        scope=scope, owner=owner, provenance=Provenance(source=f"langgraph:{self.agent}"), meta=meta)
            self.memory.add(unit, actor=self.agent)
            return
        changed = existing.replace(content=content, context=Context(tags=tags), scope=scope, meta=meta)
        self.memory.update(changed, actor=self.agent, reembed=changed.text != existing.text)
        if existing.status is not Status.ACTIVE:
            self.memory.set_status(existing.id, Status.ACTIVE, reason="put again through LangGraph", actor=self.agent)

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        f = Filter.make(tags_all=[_ns_tag(prefix)] if prefix else [_MARK])
        want = max(0, op.offset) + max(0, op.limit)
        if want == 0:
            return []
        if op.query:
            k = min(200, max(want * 4, 20)) if op.filter else min(200, want)
            hits = self.memory.recall(op.query, viewer=self.viewer, k=k, filter=f, hops=0, touch=False)
            found = [(r.unit, r.score) for r in hits if _matches(r.unit.meta[_MARK]["value"], op.filter)]
        else:
            found, offset = [], 0
            while len(found) < want:
                page = self.memory.store.list(viewer=self.viewer, filter=f, limit=500, offset=offset)
                found += [(u, None) for u in page if _matches(u.meta[_MARK]["value"], op.filter)]
                if len(page) < 500:
                    break
                offset += 500
        return [self._item(u, SearchItem, s) for u, s in found[op.offset : op.offset + op.limit]]  # type: ignore[misc]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        spaces: set[tuple[str, ...]] = set()
        offset = 0
        f = Filter.make(tags_all=[_MARK])
        while True:
            page = self.memory.store.list(viewer=self.viewer, filter=f, limit=1000, offset=offset)
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
    "$gt": lambda a, b: _num(a) is not None and _num(a) > _num(b),
    "$gte": lambda a, b: _num(a) is not None and _num(a) >= _num(b),
    "$lt": lambda a, b: _num(a) is not None and _num(a) < _num(b),
    "$lte": lambda a, b: _num(a) is not None and _num(a) <= _num(b),
}


def _num(v: Any) -> float | None:
    try:
        return float(v)
    except (TypeError, ValueError):
        return None


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
