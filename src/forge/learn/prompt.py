"""One path from memory to a prompt: units the engine recalls, written into sections.

Every prompt in every loop (the evolution protocols, :class:`~forge.population.agent.Agent` and the
swarm, the team runner) gets its memory from :func:`recollect`: the engine's hybrid recall
for the situation, as the agent's viewer, scored by relevance *and* by what the memory has
earned (validation from outcomes and corroboration, importance, recency), then packed into a
token budget by section (rules, procedures, examples, facts).

Two things make a small local model use its memory:

- the block is written once per episode and kept byte-identical across its steps (sections in
  a fixed order, units in creation order), so llama.cpp reuses the KV cache of the prompt
  prefix instead of re-reading the memory at every step;
- at each step, :meth:`Recollection.now` picks the rules whose situation is the current one,
  and the policy repeats them right before the question ("Memory for this situation: ...").
  A 1.5B model follows a rule next to the question far more often than one in a list.

A :class:`Recollection` also says which units were shown, so every decision records the
memories that drove it and outcomes flow back to them (:meth:`forge.engine.memory.Memory.record_use`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from forge.engine.port import Recalling
from forge.engine.recall import Packed, Recalled, Weights, approx_tokens, pack
from forge.envs.situation import goal_ways
from forge.learn import rules as rulebook
from forge.model import Kind, Unit, Viewer
from forge.store.base import Filter

__all__ = [
    "PROMPT_SECTIONS",
    "PROMPT_WEIGHTS",
    "Recollection",
    "empty",
    "recollect",
    "render_unit",
    "used_ids",
]

#: Prompt sections in the order they are written, and the kinds each one holds.
PROMPT_SECTIONS: dict[str, frozenset[Kind]] = {
    "rules": frozenset({Kind.RULE, Kind.LESSON, Kind.PREFERENCE}),
    "procedures": frozenset({Kind.PROCEDURE}),
    "examples": frozenset({Kind.EXAMPLE}),
    "facts": frozenset({Kind.FACT, Kind.EPISODE, Kind.PROFILE}),
}

#: Relevance plus what a unit has earned: validation (outcomes, corroboration, procedure
#: success rate), importance and recency all move what an agent sees.
PROMPT_WEIGHTS = Weights(validation=1.0, importance=0.5, recency=0.25)


def render_unit(unit: Unit) -> str:
    """One unit as a prompt line; examples and procedures show their steps."""
    meta = unit.meta if isinstance(unit.meta, Mapping) else {}
    if unit.kind is Kind.EXAMPLE and meta.get("steps"):
        lines = [f"- Example {meta.get('name') or 'demo'}: {meta.get('description') or ''}".rstrip()]
        for s in meta["steps"]:
            thought = f" ({s['thought']})" if s.get("thought") else ""
            lines.append(f"  {s.get('observation', '')}{thought} -> {s.get('answer', '')}")
        return "\n".join(lines)
    body = " ".join(unit.content.split()) if unit.kind is not Kind.PROCEDURE else unit.content.strip()
    if unit.kind is Kind.PROCEDURE:
        s, f = int(meta.get("successes", 0)), int(meta.get("failures", 0))
        if s + f:
            body += f" (worked {s} of {s + f} times)"
    title = meta.get("name") if unit.kind is not Kind.EXAMPLE else None
    return f"- {title}: {body}" if title else f"- {body}"


@dataclass(frozen=True, slots=True)
class Recollection:
    """What one role of one agent remembers for one episode.

    ``block`` is the prompt text (stable for the episode); ``shown`` the units in it, in
    order; ``candidates`` every recalled unit, shown or not, which :meth:`now` searches, so a
    rule for the current situation reaches the prompt even when the block is full.
    """

    role: str
    block: str = ""
    shown: tuple[Unit, ...] = ()
    candidates: tuple[Recalled, ...] = ()
    valid_actions: tuple[str, ...] = ()
    _parsed: tuple[tuple[Unit, rulebook.RuleLike], ...] = field(default=(), repr=False)
    #: The engine's recall for a situation met mid-episode (set by the loop's Recaller): brings
    #: rules the episode's first recall did not hold, by meaning, as the same viewer.
    lookup: Callable[[str], Sequence[Recalled]] | None = field(default=None, compare=False, repr=False)
    #: The env's ``abstract``: a rule may name an action's kind ("restore a User host"), which
    #: stands for every valid action of that kind here.
    kind_of: Callable[[str], str] | None = field(default=None, compare=False, repr=False)
    _found: dict[str, tuple[tuple[Unit, rulebook.RuleLike], ...]] = field(default_factory=dict, compare=False, repr=False)
    _views: dict[tuple[str, ...], Recollection] = field(default_factory=dict, compare=False, repr=False)
    #: :meth:`_applying` per situation: a step asks it for the text, the offer, the verdict
    #: (not an init field, so every copy, a view or one with a lookup, starts its own)
    _hits: dict[str, list[tuple[Unit, rulebook.RuleLike, bool]]] = field(default_factory=dict, init=False, compare=False, repr=False)

    @property
    def ids(self) -> list[str]:
        return [u.id for u in self.shown]

    def here(self, valid_actions: Sequence[str]) -> Recollection:
        """This recollection read against the actions valid at this step: the same block and
        units, its rules parsed anew when the actions changed. TextWorld's commands change
        from room to room; read against the first room's, a rule about an exit that room
        lacked forbade nothing, and "Choose one of" offered commands of another room."""
        actions = tuple(valid_actions)
        if not actions or actions == self.valid_actions or (not self.candidates and self.lookup is None):
            return self
        view = self._views.get(actions)
        if view is None:
            if len(self._views) >= 64:  # an episode visits few action sets; bound it anyway
                self._views.clear()
            vocabulary = _vocabulary(actions, self.kind_of)
            view = self._views[actions] = dataclasses.replace(
                self, valid_actions=actions, _parsed=tuple(_rules_in(self.candidates, vocabulary)), _found={}, _views={},
            )
        return view

    def now(self, situation: str) -> list[Unit]:
        """The rules that name this situation, best recalled first."""
        if not situation:
            return []
        return [u for u, _, _ in self._applying(situation)]

    def _applying(self, situation: str) -> list[tuple[Unit, rulebook.RuleLike, bool]]:
        """The rules for ``situation`` as they read here (:func:`forge.learn.rules.bind`), and
        whether each was bound to it with its actions swapped."""
        if (hits := self._hits.get(situation)) is not None:
            return hits
        if len(self._hits) >= 256:  # an episode meets few situations; bound it anyway
            self._hits.clear()
        pairs = list(self._parsed)
        if self.lookup is not None and situation:
            if situation not in self._found:
                known = {u.id for u, _ in self._parsed}
                self._found[situation] = tuple(_rules_in(self.lookup(situation), _vocabulary(self.valid_actions, self.kind_of), skip=known))
            pairs += self._found[situation]
        out = []
        for u, p in pairs:
            if (bound := rulebook.bind(p, situation)) is not None:
                out.append((u, bound, bound is not p))
        # a rule that names this situation as it is comes before one bound to it
        hits = self._hits[situation] = [hit for hit in out if not hit[2]] + [hit for hit in out if hit[2]]
        return hits

    def now_text(self, situation: str, *, limit: int = 3, tried: Sequence[str] = ()) -> tuple[str, list[str]]:
        """``("Memory for this situation: ...", ids)``, or ``("", [])`` when no rule applies.
        A rule bound to this situation is written as it reads here. ``tried``: what this
        episode already did where the agent now stands again (:meth:`offered`)."""
        hits = self._applying(situation)[:limit]
        if not hits:
            return "", []
        lines = "\n".join(f"- {rulebook.render(p) if rebound else ' '.join(u.content.split())}" for u, p, rebound in hits)
        text = f"Memory for this situation:\n{lines}"
        offer = self.offered(situation, tried=tried)
        if offer != list(self.valid_actions):
            # Small models follow "choose one of X" far better than "do not A" (a 1.5B model
            # kept taking the forbidden action when only told not to): say both.
            failed = ", ".join(a for a in self.valid_actions if a in self.forbidden(situation))
            again = ", ".join(a for a in self.valid_actions if a in self._stale(situation, tried) and a not in offer)
            text += f"\nFailed here before: {failed}." + (f" Already done here this time: {again}." if again else "")
            text += f" Choose one of: {', '.join(offer)}."
        return text, [u.id for u, _, _ in hits]

    def offered(self, situation: str, actions: Sequence[str] | None = None, *, tried: Sequence[str] = ()) -> list[str]:
        """The actions to choose among here (``actions`` defaults to the valid ones).

        When the situation's rules forbid some, the rest; and when they also name what was
        safe, only those: offered every other action at row 2, col 0, the 1.5B model avoided
        the hole and then bumped the edge (left) for the rest of the episode instead of
        taking the "right" its rule named. All of ``actions`` when no rule forbids any, or
        when the rules would forbid them all. The prompt's "Choose one of" line and the
        rule guard both use this.

        ``tried`` is what this episode already did where the agent stands again (the
        policy's :class:`~forge.learn.policy.Visits`). Advice that was taken here and led
        back gives way to the untried actions that the situation says the same of ("right:
        frozen" was safe, so is "up: frozen"): bound to two tiles of a held-out FrozenLake
        map, "right was safe there" and its mirror "left was safe there" offered one move
        each, and the 1.5B walked between them to the step limit on 3 of 8 episodes, never
        offered the "up" that led on. Widened to every untried action instead, the offer at
        the second tile was two holes. A move the situation keys as the goal's way stays
        offered however often it was taken.
        """
        actions = list(self.valid_actions if actions is None else actions)
        banned = self.forbidden(situation)
        left = [a for a in actions if a not in banned]
        if not left or len(left) == len(actions):
            return actions
        advised = self.advised(situation)
        stale = self._stale(situation, tried)
        named = [a for a in left if a in advised]
        if fresh := [a for a in named if a not in stale]:
            return fresh
        if named:
            said = rulebook.keyed(situation)
            like = {said[k] for a in named if (k := rulebook.normalize(a)) in said}
            return [a for a in left if a not in stale and said.get(rulebook.normalize(a)) in like] or named
        return [a for a in left if a not in stale] or left

    def _stale(self, situation: str, tried: Sequence[str]) -> set[str]:
        """The actions of ``tried`` that are not the goal's way here."""
        ahead = goal_ways(situation)
        return {a for a in tried if rulebook.normalize(a) not in ahead}

    def verdict(self, situation: str, action: str) -> bool | None:
        """Whether ``action`` follows the rules for ``situation``: None when none applies, else
        True when it is not one they forbid and, if they name safe actions, is one of those."""
        if not self._applying(situation):
            return None
        banned = self.forbidden(situation)
        advised = self.advised(situation) - banned
        return action not in banned and (not advised or action in advised)

    def advised(self, situation: str) -> set[str]:
        """Actions that rules for this situation name as safe or recommended."""
        return self._concrete({a for _, p, _ in self._applying(situation) for a in p.prefer})

    def forbidden(self, situation: str) -> set[str]:
        """Actions that rules for this situation forbid (for the optional rule guard)."""
        return self._concrete({a for _, p, _ in self._applying(situation) for a in p.avoid})

    def _concrete(self, named: set[str]) -> set[str]:
        """The valid actions a rule's words name: each itself, or by its kind."""
        if not self.valid_actions or self.kind_of is None:
            return named
        return {a for a in self.valid_actions if a in named or self.kind_of(a) in named}


def recollect(
    memory: Recalling,
    *,
    viewer: Viewer,
    query: str,
    role: str = "",
    budget: int = 600,
    k: int = 40,
    filter: Filter = Filter(),
    valid_actions: Sequence[str] = (),
    weights: Weights = PROMPT_WEIGHTS,
    sections: Mapping[str, frozenset[Kind]] = PROMPT_SECTIONS,
    count_tokens: Callable[[str], int] = approx_tokens,
    touch: bool = False,
    abstract: Callable[[str], str] | None = None,
) -> Recollection:
    """Recall for ``query`` as ``viewer`` and write the memory block for ``role``.

    ``memory`` is a :class:`~forge.engine.memory.Memory` (or anything with its ``recall``). Units
    whose context names another role are left out; units with no role serve every role.
    ``abstract`` (the env's) lets a rule name an action by its kind.
    """
    recalled = memory.recall(query, viewer=viewer, k=k, filter=filter, weights=weights, touch=touch) if query.strip() else []
    mine = [r for r in recalled if not r.unit.context.role or not role or r.unit.context.role == role]
    packed: Packed = pack(mine, budget=budget, count_tokens=lambda t: count_tokens(t), sections=dict(sections))
    parts: list[str] = []
    shown: list[Unit] = []
    for name in sections:
        # creation order inside a section: the same units give the same bytes whatever
        # their scores, which keeps llama.cpp's prefix cache warm across episodes too
        units = sorted((r.unit for r in packed.sections.get(name, ())), key=lambda u: (u.created_at, u.id))
        if units:
            parts.append(f"## {name.capitalize()}\n" + "\n".join(render_unit(u) for u in units))
            shown += units
    parsed = _rules_in(mine, _vocabulary(valid_actions, abstract))
    return Recollection(
        role=role,
        block="\n\n".join(parts),
        shown=tuple(shown),
        candidates=tuple(mine),
        valid_actions=tuple(valid_actions),
        _parsed=tuple(parsed),
        kind_of=_memo(abstract) if abstract is not None else None,
    )


def _vocabulary(valid_actions: Sequence[str], abstract: Callable[[str], str] | None) -> list[str]:
    """What a rule may name as an action: the valid ones, and their kinds."""
    if abstract is None:
        return list(valid_actions)
    return list(dict.fromkeys([*valid_actions, *(abstract(a) for a in valid_actions)]))


def _memo(fn: Callable[[str], str]) -> Callable[[str], str]:
    cache: dict[str, str] = {}

    def kind(text: str) -> str:
        if text not in cache:
            cache[text] = fn(text)
        return cache[text]

    return kind


def _rules_in(recalled: Iterable[Recalled], valid_actions: Sequence[str], *, skip: Iterable[str] = ()) -> list[tuple[Unit, rulebook.RuleLike]]:
    """The recalled rules and lessons with their parts: each one's typed record
    (:attr:`forge.model.Unit.rule`). A unit written before rules were typed, or by a user
    as prose, has none: it is read once here (:func:`_legacy`) so it still guides."""
    skip = set(skip)
    out: list[tuple[Unit, rulebook.RuleLike]] = []
    for r in recalled:
        if r.unit.kind in (Kind.RULE, Kind.LESSON) and r.unit.id not in skip:
            p = r.unit.rule or _legacy(r.unit.content, valid_actions)
            if p is not None:
                out.append((r.unit, p))
                skip.add(r.unit.id)
    return out


def _legacy(content: str, valid_actions: Sequence[str]) -> rulebook.ParsedRule | None:
    """The parts of a rule that carries no typed record (stored before rules were typed, or
    written as prose through a door), read against the actions valid here."""
    p = rulebook.parse(content, valid_actions)
    if p is not None and (own := _keyed_elsewhere(p, valid_actions)):
        # the actions its "when" keys, read even where they are not valid, so the rule can be
        # bound here (TextWorld: "go south: the way back" read in a room whose way back is
        # north, where "go south" is no command)
        p = rulebook.parse(content, [*valid_actions, *own]) or p
    return p


def _keyed_elsewhere(rule: rulebook.RuleLike, valid_actions: Sequence[str]) -> list[str]:
    """The keys of ``rule``'s clauses that are actions of a kind valid here ("go south" where
    "go north" is valid) but not valid here themselves."""
    verbs = {a.split()[0] for a in valid_actions if a.split()}
    return [k for k in rulebook.keyed(rule.when) if k not in valid_actions and k.split()[0] in verbs]


def empty(role: str = "") -> Recollection:
    """No memory (zero-shot, or an agent that has learned nothing yet)."""
    return Recollection(role=role)


def used_ids(recollections: Iterable[Recollection]) -> list[str]:
    """Every unit shown by these recollections, once, in order."""
    return list(dict.fromkeys(i for r in recollections for i in r.ids))
