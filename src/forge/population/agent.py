"""One agent's facade: its memory, what it learns, what it sends and what it accepts.

    agent = Agent.open("a1", store="a1.db", bus="redis://127.0.0.1:6379/0", prefix="run7:",
                       topology="ring", agents=["a1", "a2", "a3"], secret=master, llm="local")
    traj = agent.play(env, policy, seed=7)     # an episode, prompts written from its recall
    units = agent.learn(traj, env=env, seed=7, policy=policy)       # reflect on a failure
    agent.flush()                              # worthy new units go out, rate limited
    agent.pump()                               # peers' capsules: verify, screen, judge, store
    agent.record_outcome(used_ids, success=True)   # credit the agents whose units helped

The parts are the library's own: a :class:`~forge.engine.memory.Memory` for storage and recall,
:func:`~forge.learn.reflect.reflect` for learning, a :class:`~forge.share.triggers.Broadcaster`
(importance trigger, outbox, token bucket) over a :class:`~forge.share.bus.Network` for sending,
an :class:`~forge.share.exchange.Exchange` for receiving and its
:class:`~forge.share.consensus.Consensus` for reputation. The agent only wires them together so
that one object answers "what does this agent know, and where did it come from".

The agent does not play episodes (protocols do, one layer out); it takes their trajectories.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from forge.curate.exposure import Exposure
from forge.engine.embed import Embedder, open_embedder
from forge.engine.memory import Memory
from forge.engine.recall import Packed, Recalled
from forge.envs.base import Env
from forge.errors import ConfigError, ValidationError
from forge.learn.loop import (
    Recaller,
    Trajectory,
    failure_point,
    learn_from,
    play_episode,
    reflect_on,
    retire_failing,
)
from forge.learn.online import Learned
from forge.learn.policy import Policy
from forge.learn.prompt import Recollection
from forge.learn.trace import Outcome, Trace
from forge.llm.base import LLM
from forge.model import Context, Episode, Unit, Viewer
from forge.share.bus import Bus, CapsuleInbox, Network, open_bus
from forge.share.capsule import Keyring
from forge.share.exchange import Exchange, HeuristicAssessor
from forge.share.ledger import Ruling
from forge.share.topology import Topology, open_topology
from forge.share.triggers import Broadcaster, PeriodicSync, answer_help
from forge.store import Filter

__all__ = ["Agent", "TrajectoryLike"]

#: Capsule outcomes an exchange records; the rest of a ledger (promoted, resolved, outcome)
#: is consensus bookkeeping, not something that arrived.
_ARRIVALS = ("accepted", "merged", "corroborated", "quarantined", "rejected", "conflict")


TrajectoryLike = Trajectory  # what Agent.learn reads: forge.learn.loop's trajectory


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
        admission: Any = None,
        exposure: Exposure | None = None,
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
        self.admission = admission  # an AdmissionPolicy: remember() goes through forge.curate.admit
        self.exposure = exposure  # warm-up / isolation of its prompts, by its episodes so far
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
        members: Mapping[str, Iterable[str]] | None = None,
        admission: Any = None,
        exposure: Exposure | None = None,
    ) -> Agent:
        """Build an agent from strings; what it builds here it closes in :meth:`close`.

        ``keyring`` holds this agent's own Ed25519 key and its peers' public keys
        (:meth:`Keyring.load`): no agent can sign as another. ``secret`` is the legacy
        alternative, one master secret every agent's HMAC key derives from (any holder can
        sign as anyone). With neither, a random in-process keyring is made, which only an
        agent alone on an in-process bus can use. ``profile`` describes the agent's work to the usefulness
        assessor. ``threads`` caps a local LLM's CPU threads. ``members`` maps each group to
        its agents: a group-scoped unit is sent only to them (without it, to nobody).
        ``exposure`` (warm-up, gradual enablement, isolation) narrows what its prompts show.
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
            members = dict(members or {})
            for g in groups:  # this agent is in its own groups, whoever else is
                members[g] = {*members.get(g, ()), agent_id}
            network = Network(bus, topology, keyring=keyring, members=members)
            if isinstance(llm, str):
                from forge.llm import open_llm

                kwargs = {"n_threads": threads} if llm.startswith("local") and threads else {}
                llm = open_llm(llm, **kwargs)
                owned.append(llm)
            exchange = Exchange(memory, agent_id, keyring, groups=groups, assessor=HeuristicAssessor(profile=profile))
            agent = cls(agent_id, memory=memory, network=network, exchange=exchange, llm=llm, groups=groups, admission=admission, exposure=exposure)
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

    def recaller(
        self, *, budget: int = 600, valid_actions: Sequence[str] | Callable[[], Sequence[str]] = (), abstract: Callable[[str], str] | None = None,
    ) -> Recaller:
        """How this agent's prompts get memory: the engine's recall, as this agent's viewer.

        Received units are included (that is the point of broadcast); quarantined, archived
        and superseded ones are not, and consensus copies never outrank their originals
        twice because packing keeps one copy of a text. An ``exposure`` hides what this
        agent may not read yet (warm-up by its episodes so far) or at all (isolation).
        """
        return Recaller(
            self.memory, self.viewer, budget=budget, filter=Filter.make(kinds=["rule", "lesson", "example", "procedure", "fact", "preference"]),
            valid_actions=valid_actions, exposure=self.exposure, episodes=self.episodes, abstract=abstract,
        )

    def recollect(self, role: str, query: str, *, budget: int = 600) -> Recollection:
        """The memory block this agent's ``role`` would see for ``query`` right now."""
        return self.recaller(budget=budget)(role, query)

    def play(
        self, env: Env, policy: Policy, *, seed: int, tau: float | None = None, abort: bool = True,
        budget: int = 600, max_steps: int | None = None,
    ) -> Trajectory:
        """Play one episode with prompts written from this agent's memory, and credit the units
        that were shown with the outcome (use counts and validation, authors' reputations)."""
        spec = env.spec
        tau = spec.tau if tau is None else tau
        traj = play_episode(env, policy, self.recaller(budget=budget, valid_actions=env.valid_actions, abstract=spec.abstract), seed=seed, tau=tau, abort=abort, max_steps=max_steps)
        used = traj.used
        if used:
            success = spec.succeeded(traj.total, aborted=traj.aborted)
            self.record_outcome(used, success=success)
        return traj

    # -- writing --------------------------------------------------------------------------
    def remember(self, units: Unit | Sequence[Unit]) -> list[Unit]:
        """Store units as this agent's own; offer each to the broadcaster's trigger.

        Units without an owner become this agent's. Returns the units as stored. With an
        ``admission`` policy each unit is admitted instead (:func:`forge.curate.admit`): a
        near-duplicate merges into the unit already held, which is returned and not offered
        again; an update supersedes what it contradicts.
        """
        units = [units] if isinstance(units, Unit) else list(units)
        units = [u if u.owner else u.replace(owner=self.id) for u in units]
        if self.admission is None:
            self.memory.add(units, actor=f"agent:{self.id}")
            fresh = units
        else:
            from forge.curate.admission import NOOP, admit

            decisions = admit(self.memory, units, actor=f"agent:{self.id}", policy=self.admission)
            admin = Viewer.admin()
            units = [self.memory.get(d.unit_id, viewer=admin) for d in decisions]
            fresh = [u for u, d in zip(units, decisions, strict=True) if d.action != NOOP]
        for u in fresh:
            self.broadcaster.offer(u)
        return units

    def learn_task(self, trace: Trace | Mapping[str, Any], outcome: Outcome | Mapping[str, Any] | None = None, **kw: Any) -> Learned:
        """Learn from a task this agent did outside any environment (its trace and outcome):
        credit the recalls it names, reflect with this agent's LLM, store what holds, and
        offer it to the peers through this agent's broadcaster, whose exchanges judge it.
        See :func:`forge.learn.online.learn`."""
        from forge.learn.online import learn

        def share(units: Sequence[Unit]) -> list[dict[str, Any]]:
            sent = self.broadcast(units)  # on purpose: the importance trigger never sends a private unit
            return [{"agent": "peers", "unit": u.id, "outcome": "sent", "reason": f"{sent} capsule(s) sent"} for u in units]

        return learn(self.memory, trace, outcome, agent=self.id, llm=self.llm, share=share, **kw)

    def learn(
        self,
        trajectory: Trajectory,
        *,
        env: Env | None = None,
        seed: int | None = None,
        policy: Policy | None = None,
        tau: float | None = None,
        representation: str = "rules",
        probe: bool = True,
        stalls: bool = True,
    ) -> list[Unit]:
        """Record the episode; if it failed, reflect on it and remember the result.

        A failure is a step whose reward fell below ``tau`` or, with ``stalls``, an episode
        that ended unsuccessful anyway (reflected on where it began to go in circles): small
        models mostly wander rather than fall. Rule deletions by index hit the rules the
        trajectory's recollections showed. ``probe`` replays the seeded episode to find which
        other actions were safe at that step. Without an LLM, or when it fails, the fallback
        rule is derived from the trajectory. Deleted rules are archived, not erased.
        """
        if env is None or seed is None:
            raise ValidationError(
                "Agent.learn replays a trajectory in its env from its seed; without an env, report a "
                "forge.learn.trace.Trace with Agent.learn_task(trace, outcome)"
            )
        spec = env.spec
        tau = spec.tau if tau is None else tau
        episode = Episode(
            agent=self.id,
            task=spec.name,
            env=spec.name,
            steps=tuple(trajectory.steps),
            outcome={
                "return": trajectory.total,
                "success": spec.succeeded(trajectory.total, aborted=trajectory.aborted),
                "failing_step": trajectory.failing,
                "steps": len(trajectory.actions),
                "shown": trajectory.used,
            },
            meta={"seed": seed},
        )
        self.memory.add_episode(episode, actor=f"agent:{self.id}")
        self.episodes += 1
        self.returns.append(trajectory.total)
        point = failure_point(trajectory, spec=spec, reflect_on_stall=stalls and (trajectory.done or trajectory.failing is not None))
        if point is None:
            return []
        at, stalled = point
        roles = policy.roles if policy is not None else self.roles
        acting = policy.acting_roles if policy is not None else self.roles
        reflection = reflect_on(
            trajectory, env=env, roles=roles, acting_roles=acting, llm=self.llm,
            seed=seed, tau=tau, at=at, stalled=stalled, representation=representation, probe_alternatives=probe,
        )
        confidence = 0.5 if reflection.fallback else 0.7

        def store(units: list[Unit]) -> list[Unit]:
            self.learned += len(units)
            return self.remember([u.replace(importance=self.importance, confidence=confidence) for u in units])

        shown = {role: rec.shown for role, rec in trajectory.recollections.items()}
        applied = learn_from(
            self.memory, reflection, owner=self.id, actor=f"agent:{self.id}", scope="global", shown=shown,
            viewer=self.viewer, context=Context(domain=spec.name, task=spec.name),
            episodes=[episode.id], valid_actions=env.valid_actions(), add=store,
        )
        return list(applied.added)

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
    def receive(self, capsule: Any) -> Ruling:
        """Judge one capsule from any transport (verify, screen, dedup, assess, integrate)."""
        return self.exchange.receive(capsule)

    def pump(self, *, count: int = 64, block_ms: int = 0) -> list[Ruling]:
        """Handle one batch from this agent's inbox; each capsule is acked once judged.

        Where the topology makes this agent a relay (a star's hub, a group's representative)
        it passes on only what its exchange did not quarantine or reject: a relay is a filter,
        not an amplifier for an insider's injections. Capsules the inbox refuses before
        judging (bad signature, expired) are counted in :meth:`stats` as rejected.
        """
        if self._inbox is None:
            self._inbox = self.network.inbox(self.id)
        decisions: list[Ruling] = []

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

    def drain(self, *, limit: int = 1000) -> list[Ruling]:
        """Pump until the inbox is empty (or ``limit`` capsules were handled)."""
        out: list[Ruling] = []
        while len(out) < limit:
            batch = self.pump(count=min(64, limit - len(out)))
            if not batch:
                break
            out += batch
        return out

    def record_outcome(self, unit_ids: Sequence[str], *, success: bool, weight: float = 1.0) -> dict[str, float]:
        """A task that used ``unit_ids`` succeeded or failed: count it on the units (the one
        credit model, :meth:`~forge.engine.memory.Memory.record_use`), retire the rules that
        keep failing, and move their authors' reputations, which it returns."""
        actor = f"agent:{self.id}"
        retire_failing(self.memory, self.memory.record_use(unit_ids, success=success, actor=actor), actor=actor)
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
            "units": self.memory.count(viewer=self.viewer, filter=Filter()),
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
