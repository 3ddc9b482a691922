"""Provenance: the chain behind one unit, as data (JSON) and as a readable tree.

    source episodes -> how it was made (reflection, seed, consolidation, a broadcast) -> the unit
    -> who sent it and through whom -> the receivers' exchange and consensus decisions -> merges
    and corroborations -> conflicts and supersessions -> recalls that returned it and the
    outcomes of its uses -> its change history

Everything is read back from what the engine already records (provenance, meta written by
the exchange, consensus and admission, the receivers' decision ledgers, relations, the event
log); nothing is kept twice.
Recalls are known from the service's audit events (``recall``/``context``) and the unit's
access counters; in-process recalls only move the counters.

This is the one trace: ``forge trace``, the library and the service (REST, MCP, dashboard)
all call :func:`trace`; the service adds only its access rules on history.
"""

from __future__ import annotations

from typing import Any

from forge.engine.port import MemoryPort
from forge.errors import NotFoundError
from forge.model import Viewer

__all__ = ["describe", "readable", "render", "trace", "when"]

#: At most this many recalls of the unit are read back, newest first: through the index of
#: the units each recall returned (``Store.events(naming=...)``), not a scan of every recall.
RECALL_SCAN = 100_000


def _brief(unit: Any) -> dict[str, Any]:
    return {"id": unit.id, "kind": unit.kind.value, "status": unit.status.value, "content": unit.content[:200]}


def trace(memory: MemoryPort, unit_id: str, *, viewer: Viewer | None = None, depth: int = 3) -> dict[str, Any]:
    """The provenance chain of ``unit_id`` as ``viewer`` may see it (default: the operator).

    An agent sees the units, relations and events it may see, episodes that are its own or
    nobody's, and no audited recalls (they would show other agents' queries).
    """
    admin = viewer or Viewer.admin()
    unit = memory.get(unit_id, viewer=admin)
    meta = unit.meta

    def sources(u: Any, left: int) -> list[dict[str, Any]]:
        out = []
        found = {p.id: p for p in memory.get_many(list(u.provenance.derived_from), viewer=admin)}
        for pid in u.provenance.derived_from:
            parent = found.get(pid)
            if parent is None:
                out.append({"id": pid, "missing": True})
                continue
            node = _brief(parent) | {"source": parent.provenance.source}
            if left > 1:
                node["derived_from"] = sources(parent, left - 1)
            out.append(node)
        return out

    episodes = []
    for eid in unit.provenance.episodes:
        try:
            ep = memory.get_episode(eid)
        except NotFoundError:
            episodes.append({"id": eid, "missing": True})
            continue
        if not admin.operator and ep.agent not in ("", admin.agent):
            continue
        episodes.append({"id": ep.id, "agent": ep.agent, "task": ep.task[:200], "env": ep.env, "outcome": dict(ep.outcome), "steps": len(ep.steps)})
    corr = meta.get("corroboration")
    if not isinstance(corr, dict):
        corr = {}
    relations = [r.to_dict() for r in memory.relations(unit_id, viewer=admin)]
    history = memory.events(viewer=admin, unit_id=unit_id, limit=10_000)
    recalls = []
    audited = memory.events(viewer=admin, ops=["recall", "context"], naming=unit_id, limit=RECALL_SCAN,
                           newest_first=True) if admin.operator else []
    for e in audited:
        hits = [h for h in e.data.get("hits", []) if isinstance(h, dict) and h.get("id") == unit_id]
        if hits:
            recalls.append({"seq": e.seq, "ts": e.ts, "actor": e.actor, "query": str(e.data.get("query", ""))[:200], "reasons": hits[0].get("reasons")})
    decisions: list[dict[str, Any]] = []
    if admin.operator:  # the receivers' ledgers: exchange and consensus decisions about this unit
        from forge.share.ledger import Ledger

        for name in Ledger.names(memory):
            for d in Ledger(memory, name=name).list(unit_id=unit_id):
                decisions.append({"ledger": name, "at": d.at, "outcome": d.outcome, "reason": d.reason, "detail": d.detail,
                                  "sender": d.sender, "origin": d.origin, "capsule_id": d.capsule_id})
        decisions.sort(key=lambda d: d["at"])
    return {
        "unit": unit.to_dict(),
        "decisions": decisions,
        "made_by": {
            "source": unit.provenance.source,
            "owner": unit.owner,
            "origin": meta.get("origin") or unit.owner,
            "episodes": episodes,
            "derived_from": sources(unit, depth),
        },
        "broadcast": {
            k: meta[k]
            for k in ("origin", "via", "sender", "capsule", "hops", "received_at", "received_scope", "assessment", "promoted_to", "consensus_of", "witnesses")
            if k in meta
        },
        "quarantine": meta.get("quarantine"),
        "corroborations": {
            "origins": list(corr.get("origins", [])), "count": corr.get("count", 0),
            "channels": list(corr.get("channels", [])), "merged": meta.get("merged", []),
        },
        "conflicts": [r for r in relations if r["type"] in ("contradicts", "supersedes")],
        "relations": [r for r in relations if r["type"] not in ("contradicts", "supersedes")],
        "use": {
            "recalled": unit.access_count,
            "last_recalled": unit.last_access,
            "uses": meta.get("uses", 0),
            "successes": meta.get("successes", 0),
            "failures": meta.get("failures", 0),
            "validation": unit.validation,
            "audited_recalls": list(reversed(recalls)),
        },
        "history": [{"seq": e.seq, "ts": e.ts, "op": e.op, "unit_id": e.unit_id, "actor": e.actor, "data": dict(e.data)} for e in history],
    }


def when(ts: Any) -> str:
    """An epoch time as people read it (UTC, to the second)."""
    import datetime as dt

    if not isinstance(ts, int | float) or isinstance(ts, bool):
        return "-"
    return dt.datetime.fromtimestamp(float(ts), tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


#: Keys whose numbers are epoch times.
_TIME_KEYS = ("at", "ts", "created_at", "updated_at", "valid_from", "valid_to", "since", "until", "before",
              "received_at", "authored_at", "promoted_at", "last_access", "erased_at")


def readable(value: Any, *, key: str = "", width: int = 160) -> str:
    """A value as short plain text: times as dates, lists and objects as ``k=v`` lists, no JSON escapes."""
    if isinstance(value, int | float) and not isinstance(value, bool) and (key in _TIME_KEYS or key.endswith("_at")) and value > 1e8:
        text = when(value)
    elif isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, dict):
        text = ", ".join(f"{k}={readable(v, key=str(k), width=width)}" for k, v in value.items() if v not in (None, "", [], {}))
        text = "{" + text + "}" if text else "-"
    elif isinstance(value, list | tuple):
        text = "[" + ", ".join(readable(v, width=width) for v in value[:10]) + (f", +{len(value) - 10} more" if len(value) > 10 else "") + "]"
    elif value is None:
        text = "-"
    else:
        text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def describe(op: str, data: dict[str, Any]) -> tuple[str, str]:
    """(what happened, why) for one event of the log, in words: the dashboard's audit page
    and unit history, and ``forge trace``, print these instead of the raw data."""
    d = dict(data or {})
    why = str(d.get("reason") or d.get("note") or "")
    if op == "add":
        return f"added a {d.get('kind', 'unit')} in {d.get('scope', '-')}", why
    if op == "admit":
        action = d.get("action")
        what = {"add": "admitted as a new unit", "noop": f"merged {d.get('incoming')} into it",
                "update": f"superseded {d.get('existing')}"}.get(str(action), f"admission: {action}")
        return what, why
    if op == "status":
        return f"status {d.get('from', '?')} → {d.get('to', '?')}", why
    if op == "update":
        parts = []
        for field, change in d.items():
            if isinstance(change, dict) and {"from", "to"} <= set(change):
                old, new = change["from"], change["to"]
                if isinstance(old, dict) and isinstance(new, dict):
                    keys = sorted(k for k in {*old, *new} if old.get(k) != new.get(k))
                    parts.append(f"{field}: {', '.join(keys) or 'unchanged'}")
                else:
                    parts.append(f"{field}: {readable(old, width=60)} → {readable(new, width=60)}")
        return ("changed " + "; ".join(parts)) if parts else "changed", why
    if op == "relate":
        return f"{d.get('src')} {d.get('type', 'related_to')} {d.get('dst')}", why
    if op in ("recall", "context"):
        hits = d.get("hits") or []
        return f"{op} for {str(d.get('query', ''))[:80]!r}: {len(hits)} unit(s) shown", ""
    if op == "list":
        return f"listed {len(d.get('ids') or [])} unit(s)", ""
    if op == "read":
        return "read", ""
    if op == "erase":
        return f"erased a {d.get('kind', 'unit')} ({', '.join(d.get('removed', [])) or 'content'})", why
    rest = {k: v for k, v in d.items() if k not in ("reason", "note")}
    return readable(rest, width=200), why


def render(t: dict[str, Any]) -> str:
    """The trace as an indented tree for a terminal."""
    u, made = t["unit"], t["made_by"]
    lines = [f"{u['id']} [{u['kind']}] {u['status']}: {u['content'][:100]}"]
    lines.append(f"├─ made by: source={made['source'] or '-'} owner={made['owner'] or '-'} origin={made['origin'] or '-'}")
    for ep in made["episodes"]:
        lines.append(f"│  ├─ episode {ep['id']}" + ("" if ep.get("missing") else f" ({ep['agent']}, {ep['env']}, outcome {readable(ep['outcome'], width=80)})"))

    def walk(nodes: list[dict[str, Any]], pad: str) -> None:
        for n in nodes:
            lines.append(f"{pad}├─ derived from {n['id']}" + ("" if n.get("missing") else f" [{n['kind']}] {n['status']}: {n['content'][:70]}"))
            walk(n.get("derived_from", []), pad + "│  ")

    walk(made["derived_from"], "│  ")
    if t["broadcast"]:
        lines.append("├─ broadcast: " + ", ".join(f"{k}={readable(v, key=k, width=60)}" for k, v in t["broadcast"].items() if k != "assessment"))
    c = t["corroborations"]
    lines.append(f"├─ corroborated by {len(c['channels'])} channel(s) ({', '.join(map(str, c['origins'])) or 'no other origin'}); "
                 f"{len(c['merged'])} merged duplicate(s)")
    for m in c["merged"]:
        lines.append(f"│  ├─ merged {m.get('id')} from {m.get('origin') or '-'} (cosine {m.get('similarity')}, {when(m.get('at'))})")
    for d in t.get("decisions", []):
        lines.append(f"├─ {d['ledger']} decided {d['outcome']} ({d['reason']}): {d['detail'][:80]}")
    for r in t["conflicts"]:
        lines.append(f"├─ {r['src']} -[{r['type']}]-> {r['dst']}: {r['note'][:80]}")
    use = t["use"]
    lines.append(
        f"├─ used: recalled {use['recalled']}x, {use['uses']} uses ({use['successes']} ok, {use['failures']} failed), validation {use['validation']:.2f}"
    )
    for r in use["audited_recalls"][-5:]:
        lines.append(f"│  ├─ recall #{r['seq']} by {r['actor'] or '-'}: {r['query'][:60]!r}")
    lines.append(f"└─ history: {len(t['history'])} event(s)")
    for e in t["history"]:
        what, why = describe(e["op"], e["data"])
        lines.append(f"   ├─ #{e['seq']} {when(e['ts'])} {e['op']} by {e['actor'] or '-'}: {what}" + (f" (why: {why[:120]})" if why else ""))
    return "\n".join(lines)
