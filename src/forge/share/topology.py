"""Who hears whom: full mesh, star, ring, similarity and hierarchical topologies.

A topology answers two questions behind one small protocol:

- ``neighbors(agent)``: whom an agent sends its own capsules to directly;
- ``forward(agent, capsule)``: to whom an agent passes on a capsule it holds. For a capsule
  the agent wrote this is ``neighbors``; for one it received, relaying topologies (the star's
  hub, hierarchical representatives) name the next hop, flat ones return nothing.

``route(sender)`` plays a capsule's whole journey through ``forward`` and returns every hop,
which is what :func:`messages_per_capsule` and :func:`load` count. Relays can filter
(``accept``): a hub or representative that drops what it judges not worth forwarding is
where star and hierarchical topologies save traffic; structurally every topology that
reaches everyone costs N-1 messages per capsule and differs in *who carries* them.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np

from forge.errors import ConfigError, NotFoundError, ValidationError
from forge.share.capsule import Capsule

__all__ = [
    "Accept",
    "FullMesh",
    "Hierarchical",
    "Load",
    "Ring",
    "Route",
    "Similarity",
    "Star",
    "Topology",
    "load",
    "messages_per_capsule",
    "open_topology",
]

#: A relay's filter: ``accept(relay_agent, capsule)`` is True to pass the capsule on.
Accept = Callable[[str, Capsule], bool]


@dataclass(frozen=True, slots=True)
class Route:
    """One capsule's journey: every hop ``(from, to)`` in order, and who ended up with it."""

    sender: str
    edges: tuple[tuple[str, str], ...]
    recipients: frozenset[str]

    @property
    def messages(self) -> int:
        return len(self.edges)


@runtime_checkable
class Topology(Protocol):
    @property
    def agents(self) -> tuple[str, ...]: ...

    def neighbors(self, agent: str) -> set[str]: ...

    def forward(self, agent: str, capsule: Capsule) -> set[str]: ...

    def route(self, sender: str, capsule: Capsule | None = None) -> Route: ...


class _Base:
    """Shared machinery: subclasses define ``_next(at, prev, origin)``, the hop rule.

    ``prev`` is None when ``at`` originates the capsule, else the agent it came from.
    """

    name = "base"
    relays = False  # whether any agent ever forwards what it received

    def __init__(self, agents: Iterable[str], *, accept: Accept | None = None) -> None:
        agents = tuple(dict.fromkeys(agents))
        if not agents or not all(isinstance(a, str) and a for a in agents):
            raise ValidationError("a topology needs at least one agent, each a non-empty string")
        self._agents = agents
        self._set = frozenset(agents)
        self.accept = accept

    @property
    def agents(self) -> tuple[str, ...]:
        return self._agents

    def _known(self, agent: str) -> None:
        if agent not in self._set:
            raise NotFoundError(f"agent {agent!r} is not part of this {self.name} topology")

    def _next(self, at: str, prev: str | None, origin: str) -> set[str]:  # pragma: no cover
        raise NotImplementedError

    def neighbors(self, agent: str) -> set[str]:
        """Whom ``agent`` sends its own capsules to directly."""
        self._known(agent)
        return self._next(agent, None, agent)

    def forward(self, agent: str, capsule: Capsule) -> set[str]:
        """Next hops for a capsule ``agent`` holds (``capsule.sender`` is who sent it here)."""
        self._known(agent)
        prev = None if capsule.sender == agent else capsule.sender
        if prev is not None and self.accept is not None and not self.accept(agent, capsule):
            return set()
        return self._next(agent, prev, capsule.origin)

    def route(self, sender: str, capsule: Capsule | None = None) -> Route:
        """Every hop a capsule from ``sender`` takes. With a capsule, relay filters apply."""
        self._known(sender)
        edges: list[tuple[str, str]] = []
        got: set[str] = set()
        queue: deque[tuple[str, str | None]] = deque([(sender, None)])
        origin = capsule.origin if capsule is not None else sender
        while queue:
            at, prev = queue.popleft()
            relayed = prev is not None and capsule is not None and self.accept is not None
            if relayed and not self.accept(at, capsule.forwarded(by=prev)):  # type: ignore[misc, union-attr, arg-type]
                continue
            for nxt in sorted(self._next(at, prev, origin)):
                edges.append((at, nxt))
                if nxt not in got and nxt != sender:
                    got.add(nxt)
                    queue.append((nxt, at))
        return Route(sender=sender, edges=tuple(edges), recipients=frozenset(got))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({len(self._agents)} agents)"


class FullMesh(_Base):
    """Everyone sends to everyone: maximal reach, N-1 messages per capsule from each sender."""

    name = "full"

    def _next(self, at: str, prev: str | None, origin: str) -> set[str]:
        return set(self._set - {at}) if prev is None else set()


class Ring(_Base):
    """Agents on a circle, each sending to ``k`` neighbours on each side; no relaying."""

    name = "ring"

    def __init__(self, agents: Iterable[str], *, k: int = 1) -> None:
        super().__init__(agents)
        if k < 1:
            raise ValidationError("a ring needs k >= 1 neighbours on each side")
        self.k = k
        self._index = {a: i for i, a in enumerate(self._agents)}

    def _next(self, at: str, prev: str | None, origin: str) -> set[str]:
        if prev is not None:
            return set()
        n, i = len(self._agents), self._index[at]
        return {self._agents[(i + d) % n] for d in range(-self.k, self.k + 1) if d} - {at}


class Star(_Base):
    """A hub aggregates: members send to it; it filters (``accept``) and redistributes.

    The hub carries N-2 messages for every member capsule, so it is the bottleneck; in
    return it sees everything once and can drop duplicates and weak units for everybody.
    """

    name = "star"
    relays = True

    def __init__(self, agents: Iterable[str], *, hub: str | None = None, accept: Accept | None = None) -> None:
        super().__init__(agents, accept=accept)
        self.hub = hub if hub is not None else self._agents[0]
        self._known(self.hub)

    def _next(self, at: str, prev: str | None, origin: str) -> set[str]:
        if at != self.hub:
            return {self.hub} if prev is None else set()
        return set(self._set - {self.hub, origin} - ({prev} if prev else set()))


class Similarity(_Base):
    """Each agent sends to the ``k`` agents whose profile vectors are closest (cosine).

    Profiles are embeddings of an agent's domain or skills; :meth:`update_profile` replaces
    one and the neighbour lists are recomputed on next use.
    """

    name = "similarity"

    def __init__(self, profiles: Mapping[str, Sequence[float] | np.ndarray], *, k: int = 3) -> None:
        super().__init__(profiles.keys())
        if k < 1:
            raise ValidationError("a similarity topology needs k >= 1")
        self.k = k
        self._profiles: dict[str, np.ndarray] = {}
        self._dim: int | None = None
        for agent, vec in profiles.items():
            self._profiles[agent] = self._check(vec)
        self._cache: dict[str, frozenset[str]] | None = None

    @classmethod
    def from_texts(cls, profiles: Mapping[str, str], *, embedder: object, k: int = 3) -> Similarity:
        """Profiles from text (an agent's domain or skill summary) through an embedder."""
        names = list(profiles)
        vecs = embedder.embed([profiles[a] for a in names])  # type: ignore[attr-defined]
        return cls(dict(zip(names, vecs, strict=True)), k=k)

    def _check(self, vec: Sequence[float] | np.ndarray) -> np.ndarray:
        v = np.asarray(vec, dtype=np.float32).reshape(-1)
        if v.size == 0 or not np.all(np.isfinite(v)):
            raise ValidationError("a profile must be a non-empty vector of finite numbers")
        if self._dim is not None and v.size != self._dim:
            raise ValidationError(f"profile has {v.size} dimensions; the others have {self._dim}")
        self._dim = v.size
        norm = float(np.linalg.norm(v))
        return v / norm if norm else v

    def update_profile(self, agent: str, vector: Sequence[float] | np.ndarray) -> None:
        """Set (or add) an agent's profile; every neighbour list is recomputed lazily."""
        v = self._check(vector)
        if agent not in self._set:
            self._agents = (*self._agents, agent)
            self._set = frozenset(self._agents)
        self._profiles[agent] = v
        self._cache = None

    def _table(self) -> dict[str, frozenset[str]]:
        if self._cache is None:
            names = list(self._agents)
            m = np.stack([self._profiles[a] for a in names])
            sims = m @ m.T
            np.fill_diagonal(sims, -np.inf)
            k = min(self.k, len(names) - 1)
            table = {}
            for i, a in enumerate(names):
                # stable tie-break by name so routes are reproducible
                order = sorted(range(len(names)), key=lambda j, i=i: (-sims[i, j], names[j]))  # type: ignore[misc]
                table[a] = frozenset(names[j] for j in order[:k] if j != i)
            self._cache = table
        return self._cache

    def _next(self, at: str, prev: str | None, origin: str) -> set[str]:
        return set(self._table()[at]) if prev is None else set()


class Hierarchical(_Base):
    """Groups with representatives: members talk to their representative, who forwards.

    A member's capsule goes to its representative, who passes it to the rest of the group
    and to the other representatives (if ``accept`` lets it through); each of those passes
    it to its own members. Every agent talks to O(group size + groups) others instead of
    N-1, and the representatives' filters decide what crosses group lines.
    """

    name = "hierarchical"
    relays = True

    def __init__(
        self,
        groups: Mapping[str, Sequence[str]],
        *,
        representatives: Mapping[str, str] | None = None,
        accept: Accept | None = None,
    ) -> None:
        members = [a for g in groups.values() for a in g]
        if len(members) != len(set(members)):
            raise ValidationError("an agent can belong to only one group")
        if any(not g for g in groups.values()):
            raise ValidationError("every group needs at least one member")
        super().__init__(members, accept=accept)
        reps = dict(representatives or {})
        self.groups = {name: tuple(g) for name, g in groups.items()}
        self.representatives = {}
        self._group_of: dict[str, str] = {}
        for name, g in self.groups.items():
            rep = reps.get(name, g[0])
            if rep not in g:
                raise ValidationError(f"representative {rep!r} is not a member of group {name!r}")
            self.representatives[name] = rep
            for a in g:
                self._group_of[a] = name
        self._reps = frozenset(self.representatives.values())

    @classmethod
    def balanced(cls, agents: Sequence[str], *, group_size: int | None = None, accept: Accept | None = None) -> Hierarchical:
        """Split agents into groups of about sqrt(N) (which minimises the busiest agent's degree)."""
        agents = list(dict.fromkeys(agents))
        size = group_size or max(2, round(math.sqrt(len(agents))))
        if size < 1:
            raise ValidationError("group_size must be at least 1")
        groups = {f"g{i // size}": agents[i : i + size] for i in range(0, len(agents), size)}
        return cls(groups, accept=accept)

    def group_of(self, agent: str) -> str:
        self._known(agent)
        return self._group_of[agent]

    def _next(self, at: str, prev: str | None, origin: str) -> set[str]:
        group = self._group_of[at]
        rep = self.representatives[group]
        mates = set(self.groups[group]) - {at, origin}
        if at != rep:
            return {rep} if prev is None else set()
        if prev is None or self._group_of.get(prev) == group:
            # own or a member's capsule: to the group and across to the other representatives
            return (mates - ({prev} if prev else set())) | (set(self._reps) - {rep, origin})
        return mates  # from another representative: down to this group's members


@dataclass(frozen=True, slots=True)
class Load:
    """Traffic when every agent sends one capsule (one round), and who carries it.

    Any topology that reaches everyone costs N-1 messages per capsule; they differ in
    ``peers_max`` (connections per agent) and ``sent_per_agent_max`` (relay load).
    """

    topology: str
    agents: int
    messages_per_capsule: float
    reach: float  # mean recipients per capsule
    sent_per_agent_mean: float
    sent_per_agent_max: int
    received_per_agent_mean: float
    received_per_agent_max: int
    peers_max: int  # most distinct agents any one agent sends to (its connections)

    def to_dict(self) -> dict[str, float | int | str]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


def messages_per_capsule(topology: Topology, *, senders: Iterable[str] | None = None) -> float:
    """Mean number of bus messages one capsule costs, over ``senders`` (default: everyone)."""
    senders = list(senders) if senders is not None else list(topology.agents)
    if not senders:
        raise ValidationError("messages_per_capsule needs at least one sender")
    return sum(topology.route(s).messages for s in senders) / len(senders)


def load(topology: Topology) -> Load:
    """Who carries the traffic when each agent sends one capsule."""
    sent: Counter[str] = Counter()
    received: Counter[str] = Counter()
    peers: dict[str, set[str]] = {}
    total = reach = 0
    agents = list(topology.agents)
    for s in agents:
        r = topology.route(s)
        total += r.messages
        reach += len(r.recipients)
        for a, b in r.edges:
            sent[a] += 1
            received[b] += 1
            peers.setdefault(a, set()).add(b)
    n = len(agents)
    return Load(
        topology=getattr(topology, "name", type(topology).__name__),
        agents=n,
        messages_per_capsule=total / n,
        reach=reach / n,
        sent_per_agent_mean=sum(sent.values()) / n,
        sent_per_agent_max=max(sent.values(), default=0),
        received_per_agent_mean=sum(received.values()) / n,
        received_per_agent_max=max(received.values(), default=0),
        peers_max=max((len(p) for p in peers.values()), default=0),
    )


def open_topology(
    kind: str,
    *,
    agents: Sequence[str],
    k: int = 2,
    profiles: Mapping[str, Sequence[float] | np.ndarray] | None = None,
    group_size: int | None = None,
    accept: Accept | None = None,
) -> Topology:
    """A topology by name: ``full``, ``star``, ``ring``, ``similarity`` or ``hierarchical``."""
    if kind == "full":
        return FullMesh(agents)
    if kind == "star":
        return Star(agents, accept=accept)
    if kind == "ring":
        return Ring(agents, k=k)
    if kind == "similarity":
        if profiles is None:
            raise ValidationError("a similarity topology needs profiles (agent -> vector)")
        return Similarity({a: profiles[a] for a in agents}, k=k)
    if kind == "hierarchical":
        return Hierarchical.balanced(agents, group_size=group_size, accept=accept)
    raise ConfigError(f"unknown topology {kind!r}; expected full, star, ring, similarity or hierarchical")
