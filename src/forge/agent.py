"""One agent's facade: its memory, what it learns, what it sends and what it accepts.

    agent = Agent.open("a1", store="a1.db", bus="redis://127.0.0.1:6379/0", prefix="run7:",
                       topology="ring", agents=["a1", "a2", "a3"], secret=master, llm="local")
    items = agent.prompt_memory()              # its rules and examples, as a policy reads them
    units = agent.learn(trajectory, env=env, seed=7, shown=items)   # reflect on a failure
    agent.flush()                              # worthy new units go out, rate limited
    agent.pump()                               # peers' capsules: verify, screen, judge, store
    agent.record_outcome(used_ids, success=True)   # credit the agents whose units helped

The parts are the library's own: a :class:`~forge.memory.Memory` for storage and recall,
:func:`~forge.reflect.reflect` for learning, a :class:`~forge.triggers.Broadcaster`
(importance trigger, outbox, token bucket) over a :class:`~forge.bus.Network` for sending,
an :class:`~forge.exchange.Exchange` for receiving and its
:class:`~forge.consensus.Consensus` for reputation. The agent only wires them together so
that one object answers "what does this agent know, and where did it come from".

The agent does not play episodes (protocols do, one layer out); it takes their trajectories.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from forge.bus import Bus, CapsuleInbox, Network, open_bus
from forge.capsule import Keyring
from forge.consensus import Decision
from forge.embed import Embedder, open_embedder
from forge.envs.base import Env
from forge.errors import ConfigError, ForgeError, NotFoundError
from forge.exchange import Exchange, HeuristicAssessor
from forge.llm.base import LLM
from forge.memory import Memory
from forge.model import Context, Episode, Kind, Provenance, Status, Step, Unit
from forge.policy import MemoryItem, PromptMemory
from forge.recall import Packed, Recalled
from forge.reflect import (
    Snapshot,
    apply_reflection,
    fallback_reflection,
    reflect,
    safe_alternatives,
    stall_step,
)
from forge.store import Filter
from forge.topology import Topology, open_topology
from forge.triggers import Broadcaster, PeriodicSync, answer_help

__all__ = ["Agent", "TrajectoryLike"]

#: Capsule outcomes an exchange records; the rest of a ledger (promoted, resolved, outcome)
#: is consensus bookkeeping, not something that arrived.
_ARRIVALS = ("accepted", "merged", "corroborated", "quarantined", "rejected", "conflict")


class TrajectoryLike(Protocol):
    """What :meth:`Agent.learn` reads from an episode (``forge.protocols.episode.Trajectory``)."""

    steps: list[Step]
    actions: list[str]
    observations: list[str]
    rewards: list[float]
    failing: int | None
    done: bool

    @property
    def total(self) -> float: ...


class Agent:
    """One member of a population: memory in, memory out, each step on the record.

    ``roles`` are the policy roles whose rules this agent keeps (the flat policy has one,
    ``"actor"``). Units it writes are global and owned by it; units it receives are private
    copies with provenance ``broadcast:<sender>`` (the exchange's doing).
    """

    def __init__(
        self,
        agent_id: str,
        *,
        memory: Memory,
        network: Network,
        exchange: Exchange | None = None,
        broadcaster: Broadcaster | None = None,
        llm: LLM | None = None,
        groups: Iterable[str] = (),
        roles: Sequence[str] = ("actor",),
        importance: float = 0.8,
    ) -> None:
        if not agent_id:
            raise ConfigError("an agent needs an id")
        self.id = agent_id
        self.memory = memory
        self.network = network
        self.exchange = exchange if exchange is not None else Exchange(memory, agent_id, network.keyring, groups=groups)
        self.broadcaster = broadcaster if broadcaster is not None else Broadcaster(network, agent=agent_id)
        self.llm = llm
        self.roles = tuple(roles)
        self.importance = importance
        self.viewer = self.exchange.viewer  # its groups plus the consensus group
        self.started = time.time()
        self.episodes = 0
        self.returns: list[float] = []
        self.learned = 0  # units this agent wrote from its own experience
        self.help_asked = 0
        self.help_answered = 0  # help requests from peers this agent replied to
        self._groups = tuple(groups)
        self._sync: PeriodicSync | None = None
        self._inbox: CapsuleInbox | None = None
        self._owned: list[Any] = []  # what open() built, closed with the agent, innermost last

    # -- construction ---------------------------------------------------------------------
    @classmethod
    def open(
        cls,
        agent_id: str,
        *,
        store: str | Path = ":memory:",
        embedder: str | Embedder = "hash",
        bus: str | Bus = "memory://",
        prefix: str | None = None,
        topology: str | Topology = "full",
        agents: Sequence[str] | None = None,
        secret: str | bytes | None = None,
        keyring: Keyring | None = None,
        llm: str | LLM | None = None,
        threads: int | None = None,
        profile: str = "",
        groups: Iterable[str] = (),
    ) -> Agent:
        """Build an agent from strings; what it builds here it closes in :meth:`close`.

        ``keyring`` holds this agent's own Ed25519 key and its peers' public keys
        (:meth:`Keyring.load`): no agent can sign as another. ``secret`` is the legacy
        alternative, one master secret every agent's HMAC key derives from (any holder can
        sign as anyone). With neither, a random in-process keyring is made, which only an
        agent alone on an in-process bus can use. ``profile`` describes the agent's work to the usefulness
        assessor. ``threads`` caps a local LLM's CPU threads.
        """
        agents = list(agents) if agents is not None else [agent_id]
        if agent_id not in agents:
            raise ConfigError(f"agent {agent_id!r} is not among the topology's agents {agents}")
        if secret is None and keyring is None and isinstance(bus, str) and not bus.startswith("memory://"):
            raise ConfigError("agents on a shared bus need a keyring (keyring=Keyring.load(...)) or the population's master secret (secret=...)")
        owned: list[Any] = []
        try:
            emb = open_embedder(embedder) if isinstance(embedder, str) else embedder
            memory = Memory.open(store, embedder=emb)
            owned.append(memory)
            if isinstance(bus, str):
                bus = open_bus(bus, prefix=prefix)
                owned.append(bus)
            if isinstance(topology, str):
                profiles = None
                if topology == "similarity":
                    vecs = emb.embed([f"{a} {profile}" for a in agents])
                    profiles = {a: vecs[i] for i, a in enumerate(agents)}
                topology = open_topology(topology, agents=agents, profiles=profiles)
            if keyring is None:
                keyring = Keyring.from_secret(secret) if secret is not None else Keyring.random()
            network = Network(bus, topology, keyring=keyring)
            if isinstance(llm, str):
                from forge.llm import open_llm

                kwargs = {"n_threads": threads} if llm.startswith("local") and threads else {}
                llm = open_llm(llm, **kwargs)
                owned.append(llm)
            exchange = Exchange(memory, agent_id, keyring, groups=groups, assessor=HeuristicAssessor(profile=profile))
            agent = cls(agent_id, memory=memory, network=network, exchange=exchange, llm=llm, groups=groups)
        except BaseException:
            for thing in reversed(owned):
                with contextlib.suppress(Exception):
                    thing.close()
            raise
        agent._owned = owned
        return agent

    # -- reading --------------------------------------------------------------------------
    def recall(self, query: str, *, k: int = 10, **kw: Any) -> list[Recalled]:
        """What this agent may see that bears on ``query``, ranked and explained."""
        return self.memory.recall(query, viewer=self.viewer, k=k, **kw)

    def context(self, query: str, *, budget: int = 512, **kw: Any) -> Packed:
        """Recall packed into a ``budget``-token prompt block."""
        return self.memory.context(query, viewer=self.viewer, budget=budget, **kw)

    def prompt_memory(self, *, limit: int = 60) -> PromptMemory:
        """The newest ``limit`` active rules and examples, as a policy's prompt reads them.

        Received units are included (that is the point of broadcast); quarantined, archived
        and superseded ones are not, nor consensus copies, which repeat their original.
        """
        flt = Filter.make(kinds=["rule", "example"])
        total = self.memory.store.count(viewer=self.viewer, filter=flt)
        units = self.memory.store.list(viewer=self.viewer, filter=flt, limit=limit, offset=max(0, total - limit))
        items = []
        for u in units:
            if "consensus_of" in u.meta:
                continue
            meta: Mapping[str, Any] = u.meta if u.kind is Kind.EXAMPLE else {k: v for k, v in u.meta.items() if k == "fallback"}
            items.append(
                MemoryItem(
                    u.kind.value,
                    u.context.role or self.roles[0],
                    u.content,
                    id=u.id,
                    source=u.provenance.source or "reflection",
                    episodes=u.provenance.episodes,
                    derived_from=u.provenance.derived_from,
                    meta=dict(meta),
                )
            )
        return PromptMemory(tuple(items))

    # -- writing --------------------------------------------------------------------------
    def remember(self, units: Unit | Sequence[Unit]) -> list[Unit]:
        """Store units as this agent's own; offer each to the broadcaster's trigger.

        Units without an owner become this agent's. Returns the units as stored.
        """
        units = [units] if isinstance(units, Unit) else list(units)
        units = [u if u.owner else u.replace(owner=self.id) for u in units]
        self.memory.add(units, actor=f"agent:{self.id}")
        for u in units:
            self.broadcaster.offer(u)
        return units

    def learn(
        self,
        trajectory: TrajectoryLike,
        *,
        env: Env,
        seed: int,
        shown: PromptMemory | None = None,
        tau: float | None = None,
        representation: str = "rules",
        probe: bool = True,
        stalls: bool = True,
    ) -> list[Unit]:
        """Record the episode; if it failed, reflect on it and remember the result.

        A failure is a step whose reward fell below ``tau`` or, with ``stalls``, an episode
        the env ended unsuccessful anyway (a timeout; reflected on where it began to go in
        circles): small models mostly wander rather than fall. ``shown`` is what the policy saw
        (default: :meth:`prompt_memory` now), so rule deletions by index hit the rules the
        reflection saw. ``probe`` replays the seeded episode to find which other actions
        were safe at that step (env steps, no tokens). Without an LLM, or when it fails, the
        fallback rule is derived from the trajectory. Deleted rules are archived, not erased.
        """
        spec = env.spec
        tau = spec.tau if tau is None else tau
        shown = self.prompt_memory() if shown is None else shown
        t = trajectory.failing
        episode = Episode(
            agent=self.id,
            task=spec.name,
            env=spec.name,
            steps=tuple(trajectory.steps),
            outcome={
                "return": trajectory.total,
                "success": trajectory.total >= spec.success_return,
                "failing_step": t,
                "steps": len(trajectory.actions),
            },
            meta={"seed": seed},
        )
        self.memory.add_episode(episode, actor=f"agent:{self.id}")
        self.episodes += 1
        self.returns.append(trajectory.total)
        stalled = t is None and stalls and trajectory.done and bool(trajectory.actions) and trajectory.total < spec.success_return
        if stalled:
            t = stall_step(trajectory.observations, trajectory.actions)
        if t is None:
            return []
        safe = safe_alternatives(env, seed=seed, prefix=trajectory.actions[:t], failed=trajectory.actions[t], tau=tau, must_move=stalled) if probe else ()
        snapshot = Snapshot.of(
            trajectory, env=env, failing=t, roles=self.roles, acting_roles=self.roles,
            memory=shown, tau=tau, stalled=stalled, safe_actions=safe,
        )
        if self.llm is None:
            reflection = fallback_reflection(snapshot, representation=representation, error="no LLM")
        else:
            try:
                reflection = reflect(self.llm, snapshot, representation=representation)
            except ForgeError as exc:  # whatever the model did, the agent still learns something
                reflection = fallback_reflection(snapshot, representation=representation, error=str(exc))
        applied = apply_reflection(shown, reflection, rule_cap=10**6, example_cap=10**6, episodes=[episode.id])
        for item, why in applied.removed:
            with contextlib.suppress(NotFoundError):
                self.memory.set_status(item.id, Status.ARCHIVED, reason=why, actor=f"agent:{self.id}")
        units = [
            Unit(
                item.content,
                kind=item.kind,
                id=item.id,
                context=Context(domain=spec.name, task=spec.name, role=item.role),
                owner=self.id,
                confidence=0.5 if reflection.fallback else 0.7,
                importance=self.importance,
                provenance=Provenance(source="reflection", episodes=(episode.id,)),
                meta=dict(item.meta),
            )
            for item in applied.added
        ]
        self.learned += len(units)
        return self.remember(units) if units else []

    # -- sending --------------------------------------------------------------------------
    def broadcast(self, units: Unit | Sequence[Unit]) -> int:
        """Queue units for sending whatever the trigger says, then flush; returns how many went."""
        units = [units] if isinstance(units, Unit) else list(units)
        self.broadcaster.queue(u if u.owner else u.replace(owner=self.id) for u in units)
        return self.flush()

    def flush(self, *, limit: int | None = None) -> int:
        """Send what the outbox holds while the token bucket allows; the rest waits."""
        return self.broadcaster.flush(limit=limit)

    def sync(self, *, interval_s: float = 30.0, force: bool = False) -> int:
        """Periodic batched sync: send the shareable units written since the last sync.

        Event-driven broadcast sends only units whose importance crosses the trigger; this
        catches up on the rest every ``interval_s`` (or now, with ``force``).
        """
        if self._sync is None:
            self._sync = PeriodicSync(self.memory, agent=self.id, interval_s=interval_s, groups=self._groups)
        if not (force or self._sync.due()):
            return 0
        self.broadcaster.queue(self._sync.collect())
        return self.flush()

    def ask_help(self, problem: str, *, context: Context | None = None) -> str:
        """Stuck: ask the neighbours; their best matching units arrive as ``help_reply``
        capsules and go through the exchange like any other memory. Returns the request id."""
        self.help_asked += 1
        return self.broadcaster.ask_help(problem, context=context).id

    def answer(self, request: Any, *, k: int = 3) -> int:
        """Reply to a peer's help request with this agent's best matching global units."""
        replies = answer_help(request, memory=self.memory, agent=self.id, groups=self._groups, k=k)
        if replies:
            self.help_answered += 1
        return self.broadcaster.reply(request, replies)

    # -- receiving ------------------------------------------------------------------------
    def receive(self, capsule: Any) -> Decision:
        """Judge one capsule from any transport (verify, screen, dedup, assess, integrate)."""
        return self.exchange.receive(capsule)

    def pump(self, *, count: int = 64, block_ms: int = 0) -> list[Decision]:
        """Handle one batch from this agent's inbox; each capsule is acked once judged.

        Where the topology makes this agent a relay (a star's hub, a group's representative)
        it passes on only what its exchange did not quarantine or reject: a relay is a filter,
        not an amplifier for an insider's injections. Capsules the inbox refuses before
        judging (bad signature, expired) are counted in :meth:`stats` as rejected.
        """
        if self._inbox is None:
            self._inbox = self.network.inbox(self.id)
        decisions: list[Decision] = []

        def handle(capsule: Any) -> None:
            if getattr(capsule, "kind", "") == "help_request":
                self.answer(capsule)  # a question for this agent, not a memory to store
                return
            decision = self.exchange.receive(capsule)
            decisions.append(decision)
            if decision.outcome not in ("quarantined", "rejected"):
                self.network.relay(self.id, capsule)

        self.network.pump(self.id, self._inbox, handle=handle, count=count, block_ms=block_ms, relay=False)
        return decisions

    def drain(self, *, limit: int = 1000) -> list[Decision]:
        """Pump until the inbox is empty (or ``limit`` capsules were handled)."""
        out: list[Decision] = []
        while len(out) < limit:
            batch = self.pump(count=min(64, limit - len(out)))
            if not batch:
                break
            out += batch
        return out

    def record_outcome(self, unit_ids: Sequence[str], *, success: bool, weight: float = 1.0) -> dict[str, float]:
        """A task that used ``unit_ids`` succeeded or failed: move their authors' reputations."""
        return self.exchange.consensus.record_outcome(unit_ids, success=success, weight=weight)

    # -- reporting ------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Counters since this agent object started: what it played, sent, received, kept."""
        arrived = self.exchange.ledger.list(outcome=_ARRIVALS, since=self.started)
        by = {o: 0 for o in _ARRIVALS}
        for d in arrived:
            by[d.outcome] += 1
        inbox_rejected = sum(self._inbox.rejected.values()) if self._inbox is not None else 0
        return {
            "episodes": self.episodes,
            "mean_return": round(sum(self.returns) / len(self.returns), 4) if self.returns else 0.0,
            "learned": self.learned,
            "sent": self.broadcaster.sent,
            "messages": self.network.sent[self.id],
            "received": len(arrived) + inbox_rejected,
            "accepted": by["accepted"],
            "corroborated": by["corroborated"] + by["merged"],
            "quarantined": by["quarantined"],
            "rejected": by["rejected"] + inbox_rejected,
            "conflicts": by["conflict"],
            "help_asked": self.help_asked,
            "help_answered": self.help_answered,
            "units": self.memory.store.count(viewer=self.viewer, filter=Filter()),
        }

    def close(self) -> None:
        """Close the inbox and whatever :meth:`open` built (store, bus, LLM)."""
        if self._inbox is not None:
            with contextlib.suppress(Exception):
                self._inbox.close()
            self._inbox = None
        owned, self._owned = self._owned, []
        for thing in reversed(owned):
            thing.close()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Agent({self.id!r}, episodes={self.episodes})"
