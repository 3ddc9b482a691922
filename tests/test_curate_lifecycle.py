"""Decay, TTL, caps, conflicts over time, restore and the timeline: the curation pass."""

from __future__ import annotations

import math

import pytest

from forge.curate import DAY, CurationPolicy, believed_at, curate, plan, restore, strength, timeline
from forge.curate.lifecycle import HALF_LIFE_DAYS
from forge.engine.memory import Memory
from forge.errors import UserError, ValidationError
from forge.model import Status, Unit, Viewer

ADMIN = Viewer.admin()
T0 = 1_767_225_600.0


def unit(text: str, *, kind: str = "fact", at: float = T0, **kw) -> Unit:
    return Unit(text, kind=kind, created_at=at, updated_at=at, **kw)


def status(memory: Memory, uid: str) -> Status:
    return memory.get(uid, viewer=ADMIN).status


# -- strength ------------------------------------------------------------------------------


def test_strength_halves_every_half_life_and_use_slows_it() -> None:
    u = unit("x", validation=0.5, importance=0.5)
    fresh = strength(u, now=T0)
    assert fresh.value == pytest.approx(0.25 + 0.75 * 0.5) and fresh.age_days == 0
    hl = HALF_LIFE_DAYS["fact"]
    assert strength(u, now=T0 + hl * DAY).value == pytest.approx(fresh.value / 2)
    assert strength(u, now=T0 + 2 * hl * DAY).value == pytest.approx(fresh.value / 4)
    used = u.replace(meta={"uses": 3, "successes": 3})
    assert strength(used, now=T0).half_life_days == pytest.approx(hl * (1 + 0.5 * math.log(4) + math.log(4)), rel=1e-4)
    assert strength(used, now=T0 + hl * DAY).value > strength(u, now=T0 + hl * DAY).value
    recalled = u.replace(last_access=T0 + hl * DAY)  # a recall restarts the clock
    assert strength(recalled, now=T0 + hl * DAY).value == pytest.approx(fresh.value)
    assert strength(u.replace(kind="episode"), now=T0 + 30 * DAY).value < strength(u, now=T0 + 30 * DAY).value


# -- decay, dry run, restore ---------------------------------------------------------------


def test_decay_archives_what_went_unused_and_a_dry_run_changes_nothing(memory: Memory) -> None:
    stale, used = unit("The old build server is at 10.0.0.7.", importance=0.3), unit("The build server is at 10.0.0.9.", importance=0.3)
    memory.add([stale, used])
    memory.record_use([used.id], success=True)
    now = T0 + 400 * DAY
    memory.store.update(memory.get(used.id, viewer=ADMIN).replace(last_access=now - DAY))
    before = len(memory.store.events(viewer=ADMIN))
    dry = curate(memory, now=now, dry_run=True)
    assert [(c.unit_id, c.cause) for c in dry.changes] == [(stale.id, "decay")] and not dry.applied
    assert "strength" in dry.changes[0].reason and "< 0.1" in dry.changes[0].reason
    assert len(memory.store.events(viewer=ADMIN)) == before and status(memory, stale.id) is Status.ACTIVE
    done = curate(memory, now=now)
    assert done.applied and status(memory, stale.id) is Status.ARCHIVED and status(memory, used.id) is Status.ACTIVE
    [ev] = memory.store.events(viewer=ADMIN, unit_id=stale.id, ops=["status"])
    assert ev.data["to"] == "archived" and f"curate {done.run_id}: decay" in ev.data["reason"]
    [run] = memory.store.events(viewer=ADMIN, ops=["curate"])
    assert run.data["counts"] == {"decay": 1}
    # archived units stay exportable, and come back on restore with a fresh clock
    exported = {r["id"]: r for r in memory.export(viewer=ADMIN) if r.get("record") == "unit"}
    assert exported[stale.id]["status"] == "archived"
    back = restore(memory, stale.id, reason="needed again", now=now)
    assert back.status is Status.ACTIVE and status(memory, stale.id) is Status.ACTIVE
    assert plan(memory, now=now).changes == []  # restored at `now`: not archived again at once
    with pytest.raises(UserError, match="not archived"):
        restore(memory, used.id)


# -- TTL --------------------------------------------------------------------------------------


def test_ttl_per_unit_per_scope_and_absolute_expiry(memory: Memory) -> None:
    own = unit("Ticket 7 is open.", meta={"ttl_s": 3600})
    team = unit("Standup moved to 10:30.", scope="group:ops")
    fixed = unit("The sale ends Friday.", meta={"expires_at": T0 + 2 * DAY})
    keep = unit("Water boils at 100 C at sea level.")
    memory.add([own, team, fixed, keep])
    policy = CurationPolicy(ttl_by_scope={"group:ops": DAY}, decay=False)
    p = plan(memory, policy=policy, now=T0 + 1.5 * DAY)
    assert {c.unit_id: c.cause for c in p.changes} == {own.id: "ttl", team.id: "ttl"}
    assert "its own ttl_s" in next(c.reason for c in p.changes if c.unit_id == own.id)
    assert "scope group:ops" in next(c.reason for c in p.changes if c.unit_id == team.id)
    p = plan(memory, policy=policy, now=T0 + 3 * DAY)
    assert {c.unit_id for c in p.changes} == {own.id, team.id, fixed.id}


# -- caps ---------------------------------------------------------------------------------------


def test_caps_evict_the_weakest_first_and_never_a_pinned_unit(memory: Memory) -> None:
    eps = [unit(f"Episode {i}: tried route {i}.", kind="episode", at=T0 + i * DAY, validation=0.5) for i in range(5)]
    eps[0] = eps[0].replace(meta={"pinned": True})  # the oldest, so the weakest: but pinned
    memory.add(eps)
    p = plan(memory, policy=CurationPolicy(cap_per_kind={"episode": 2}, decay=False), now=T0 + 5 * DAY)
    assert [c.unit_id for c in p.changes] == [eps[1].id, eps[2].id, eps[3].id]  # oldest unpinned first
    assert all(c.cause == "cap" and "lowest strength first" in c.reason for c in p.changes)
    mine = [unit(f"note {i} about bikes", owner="ann", at=T0 + i, importance=0.1 * (i + 1)) for i in range(3)]
    memory.add(mine)
    p = plan(memory, policy=CurationPolicy(cap_per_agent=1, decay=False), now=T0 + DAY)
    assert [c.unit_id for c in p.changes] == [mine[0].id, mine[1].id]  # lowest importance -> lowest strength
    with pytest.raises(ValidationError):
        CurationPolicy(cap_per_kind={"gizmo": 3})


# -- conflicts over time -------------------------------------------------------------------------


def test_a_newer_validated_contradiction_supersedes_and_the_timeline_reads_back(memory: Memory) -> None:
    old = unit("When the queue backs up, then add workers.", kind="rule", at=T0, validation=0.55)
    new = unit("When the queue backs up, then do not add workers.", kind="rule", at=T0 + 10 * DAY, validation=0.5)
    memory.add([old, new])
    memory.relate(new.id, old.id, "contradicts", note="negation")
    policy = CurationPolicy(decay=False)
    assert plan(memory, policy=policy, now=T0 + 11 * DAY).changes == []  # the newer one has not earned it yet
    memory.record_use([new.id], success=True)
    memory.record_use([new.id], success=True)  # validation (1+2)/(2+2) = 0.75
    p = curate(memory, policy=policy, now=T0 + 12 * DAY)
    [c] = p.changes
    assert (c.op, c.unit_id, c.cause, c.by) == ("supersede", old.id, "conflict", new.id)
    assert status(memory, old.id) is Status.SUPERSEDED and status(memory, new.id) is Status.ACTIVE
    beliefs = timeline(memory, new.id)
    assert [b.unit_id for b in beliefs] == [old.id, new.id]
    first, second = beliefs
    assert first.valid_from == T0 and first.valid_to == T0 + 10 * DAY and first.superseded_by == new.id
    assert first.recorded_at is not None and first.retired_at is not None and "conflict" in first.reason
    assert second.valid_to is None and second.status == "active"
    assert believed_at(beliefs, T0 + DAY).unit_id == old.id
    assert believed_at(beliefs, T0 + 20 * DAY).unit_id == new.id
    assert believed_at(beliefs, T0 - DAY) is None
    assert timeline(memory, old.id) == beliefs


# -- provenance ----------------------------------------------------------------------------------


def test_trace_follows_sources_merges_and_conflicts_as_the_viewer_may_see_them(memory: Memory) -> None:
    from forge.curate import admit
    from forge.curate.trace import render, trace
    from forge.model import Episode, Provenance

    ep = memory.add_episode(Episode(agent="ann", task="open the vault", outcome={"success": False}))
    secret = unit("ann's scratch note on the vault", scope="private", owner="ann")
    memory.add(secret)
    [d] = admit(memory, unit("When the vault jams, then reset the dial.", kind="rule", owner="ann",
                          provenance=Provenance("reflection", episodes=(ep,), derived_from=(secret.id,))))
    admit(memory, unit("When the vault jams, then reset the dial.", kind="rule", owner="bob"))
    t = trace(memory, d.unit_id)
    assert t["made_by"]["source"] == "reflection" and t["made_by"]["episodes"][0]["outcome"] == {"success": False}
    assert t["made_by"]["derived_from"][0]["id"] == secret.id and "scratch" in t["made_by"]["derived_from"][0]["content"]
    assert [m["origin"] for m in t["corroborations"]["merged"]] == ["bob"]
    assert [e["op"] for e in t["history"]][:2] == ["add", "admit"]
    assert "merged" in render(t) and "episode " + ep in render(t)
    from forge.share.consensus import Consensus

    Consensus(memory, agent_id="ann").corroborate(d.unit_id, origin="carol")
    t = trace(memory, d.unit_id)
    assert [(x["ledger"], x["outcome"], x["origin"]) for x in t["decisions"]] == [("ann", "corroborated", "carol")]
    assert "ann decided corroborated" in render(t)
    bob = trace(memory, d.unit_id, viewer=Viewer.of("bob"))
    assert bob["made_by"]["derived_from"] == [{"id": secret.id, "missing": True}]  # not bob's to see
    assert bob["made_by"]["episodes"] == [] and bob["use"]["audited_recalls"] == [] and bob["decisions"] == []


def test_a_pass_reads_every_unit_whatever_the_store_s_page_limit(memory: Memory) -> None:
    from forge.curate.changes import all_units

    units = [unit(f"fact number {i}", at=T0 + i) for i in range(5)]
    memory.add(units)
    assert [u.id for u in all_units(memory.store, page=2)] == [u.id for u in units]
