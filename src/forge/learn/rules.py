"""Rules as text: "when <situation>, do not <action>; <safe> was safe there".

One module writes, parses and checks rules, and every part of FORGE that reads them
(reflection, the prompt builder, the rule guard, test LLMs) imports it. A rule is only
useful to an agent that can recognise its situation and act on it, so :func:`check` rejects
or repairs rules that recommend the action that failed, or name no situation the agent met.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from forge.envs.situation import goal_ways
from forge.errors import ValidationError
from forge.model import Rule

__all__ = [
    "MAX_SAFE",
    "ParsedRule",
    "applies",
    "bind",
    "check",
    "clauses",
    "contradicts",
    "focus",
    "forbidden_in",
    "instance_reason",
    "keyed",
    "normalize",
    "parse",
    "render",
    "to_rule",
    "write",
]

MAX_SAFE = 3
"""How many safe alternatives a rule names, best first. CAGE-2 has 145 actions: a rule that
listed the ~130 safe ones ran to 2,500 characters and said nothing a model could use."""

_WHEN = re.compile(r"^\s*(?:if|when(?:ever)?)\s+(?P<body>.+?)\s*\.?\s*$", re.IGNORECASE | re.DOTALL)
_THEN = re.compile(r",?\s+then\s+", re.IGNORECASE)
# what an instruction starts with: where a situation (which may hold commas) ends
_DIRECTIVE = re.compile(
    r"(?:do\b|don't|dont|never|avoid|always|go\b|move\b|take\b|choose\b|pick\b|use\b|try\b|prefer\b|"
    r"press\b|step\b|turn\b|keep\b|stay\b|call\b|wait\b|instead\b|you should|it is safe|safe\b)",
    re.IGNORECASE,
)
# a negation, then the action, perhaps after a verb of its own ("never move left")
_NEGATION = re.compile(r"\b(?:do not|don't|dont|never|avoid|instead of|rather than|not)\s+(?:to\s+)?", re.IGNORECASE)
_VERB = re.compile(r"(?:move|go|going|moving|take|taking|choose|choosing|pick|use)\s+", re.IGNORECASE)
_WORD = re.compile(r"[\w-]+")
# without valid actions: what a negation forbids runs to the end of its clause
_PHRASE = re.compile(r"[^;,.]+")
_SAFE_TAIL_WORDS = re.compile(r"\s+(?:was|were)\s+safe there$")


@dataclass(frozen=True, slots=True)
class ParsedRule:
    """A rule's parts: the situation it names, the actions it forbids and the ones it advises."""

    when: str
    avoid: tuple[str, ...] = ()
    prefer: tuple[str, ...] = ()


RuleLike = ParsedRule | Rule
"""What the functions below read: a rule's parts, typed (:class:`forge.model.Rule`) or as
just parsed from a model's output (:class:`ParsedRule`, which may still be incomplete)."""


def to_rule(parsed: RuleLike | None, *, why: str = "") -> Rule | None:
    """The typed record of a parsed rule, or None for one that names no action: the one
    place where text a model wrote becomes a :class:`~forge.model.Rule`."""
    if parsed is None:
        return None
    if isinstance(parsed, Rule):
        return parsed
    try:
        return Rule(when=parsed.when, avoid=parsed.avoid, prefer=parsed.prefer, why=why)
    except ValidationError:
        return None


def normalize(text: str) -> str:
    """Lower-case, single-spaced, without trailing punctuation: how situations are compared."""
    return " ".join(str(text).lower().split()).strip(" .;:!")


def _mentioned(text: str, actions: Iterable[str]) -> list[str]:
    low = text.lower()
    found = []
    for a in actions:
        m = re.search(r"(?<![\w-])" + re.escape(a.lower()) + r"(?![\w-])", low)
        if m:
            found.append((m.start(), a))
    return [a for _, a in sorted(found)]


def parse(text: str, valid_actions: Sequence[str] = ()) -> ParsedRule | None:
    """The parts of a "when X, (then) Y" rule, or None for text that is not one.

    With ``valid_actions``, ``avoid`` holds the valid actions the rule forbids ("do not A",
    "never A", "avoid A") and ``do`` the other valid actions it names; without them, ``avoid``
    holds the words after each negation.
    """
    m = _WHEN.match(text or "")
    if not m:
        return None
    body = m["body"]
    split = _THEN.search(body)
    if split:
        when, then = body[: split.start()], body[split.end() :]
    else:
        starts = {a.lower() for a in valid_actions}
        cut = None
        for c in re.finditer(r",\s*", body):
            rest = body[c.end() :]
            first = rest.split(" ", 1)[0].strip(";,.").lower()
            if _DIRECTIVE.match(rest) or first in starts:
                cut = c
                break
        if cut is None:
            commas = list(re.finditer(r",\s*", body))
            if not commas:
                return None
            cut = commas[-1]
        when, then = body[: cut.start()], body[cut.end() :]
    # Longest first, so a multi-word action ("A to C", "Restore User1") is read whole, not
    # as its first word.
    longest = sorted(valid_actions, key=len, reverse=True)
    avoid: list[str] = []
    for n in _NEGATION.finditer(then):
        # The action right after the negation first: "do not go north" forbids the TextWorld
        # command "go north"; only then past a verb of the negation's own ("never move left").
        verb = _VERB.match(then, n.end())
        after = [n.end(), *([verb.end()] if verb else [])]
        if valid_actions:
            hit = next((a for at in after for a in longest if re.match(re.escape(a) + r"(?![\w-])", then[at:], re.IGNORECASE)), None)
            if hit is not None and hit not in avoid:
                avoid.append(hit)
        elif (w := _PHRASE.match(then, n.end())) and (phrase := w.group().strip().lower()) and phrase not in avoid:
            avoid.append(phrase)
    do = [a for a in _mentioned(then, valid_actions) if a not in avoid]
    if not valid_actions:
        # no actions to read by: each clause that forbids nothing names what to do ("then up",
        # the template's "X, Y were safe there")
        do = []
        for clause in re.split(r"\s*[;,]\s*", then):
            words = clause.strip(" .").lower()
            if not words or _NEGATION.search(words):
                continue
            words = re.sub(r"^(?:then|instead)\s+", "", _SAFE_TAIL_WORDS.sub("", words)).strip()
            if words and words not in avoid and words not in do:
                do.append(words)
    return ParsedRule(when=" ".join(when.split()), avoid=tuple(avoid), prefer=tuple(do))


def write(situation: str, avoid: str, safe: Sequence[str] = ()) -> str:
    """The canonical rule: what to avoid, and what was safe instead (at most :data:`MAX_SAFE`
    alternatives, in the order given: the caller ranks them best first)."""
    situation = " ".join(situation.split()).rstrip(".")
    return _compose(situation[:1].lower() + situation[1:], [avoid], list(dict.fromkeys(safe)))


def render(rule: RuleLike) -> str:
    """A parsed rule written out again: :func:`write`'s form, or "when <when>, <do>" for one
    that only advises."""
    if not rule.avoid:
        return f"when {rule.when}, {', '.join(rule.prefer)}"
    return _compose(rule.when, rule.avoid, rule.prefer)


def _compose(when: str, avoid: Sequence[str], safe: Sequence[str]) -> str:
    """"when <when>, do not <a>; ...; <s>, <t> were safe there" (at most :data:`MAX_SAFE` safe)."""
    rule = f"when {when}, " + "; ".join(f"do not {a}" for a in avoid)
    safe = list(safe)[:MAX_SAFE]
    if safe:
        rule += f"; {', '.join(safe)} {'was' if len(safe) == 1 else 'were'} safe there"
    return rule


def clauses(situation: str) -> list[str]:
    """A situation's parts, split at ";": "left: hole; down: frozen" -> two clauses."""
    return [c for c in (normalize(part) for part in str(situation).split(";")) if c]


def _key(clause: str) -> str:
    return clause.split(":", 1)[0].strip() if ":" in clause else ""


def keyed(situation: str) -> dict[str, str]:
    """A situation's keyed clauses as key -> what it says: "down: hole; goal: down-right at
    distance 4" -> {"down": "hole", "goal": "down-right at distance 4"}. A key is the action
    whose outcome the clause names (or "goal"), so a clause can be read per action."""
    return {_key(c): c.split(":", 1)[1].strip() for c in clauses(situation) if _key(c)}


def instance_reason(text: str, instance_terms: Callable[[str], Sequence[str]], original: str = "") -> str:
    """Why ``text`` cannot leave its task: the instance-only names ``instance_terms`` still
    finds in it (a coordinate, a generated name), quoting ``original`` (else ``text``);
    "" when it names none. One wording for rules, lessons and procedures alike."""
    left = list(dict.fromkeys(instance_terms(text)))
    if not left:
        return ""
    return f"names what holds in this task only ({', '.join(left[:4])}): {(original or text)[:80]!r}"


def focus(situation: str, action: str, safe: Sequence[str] = ()) -> str:
    """The part of ``situation`` a rule about ``action`` needs, so that it applies wherever
    that part recurs, not only in the one state it was learned in.

    With clauses keyed by action ("left: hole; down: frozen; ..."), the clauses of the failing
    action and of the safe ones: "when down: hole; right: frozen, do not down; right was safe
    there" holds on every map where those two tiles lie so. Where the failing action has no
    clause of its own (a detour through a plain exit, examining a thing) but a safe one is
    what the env names as the goal's way or object, that clause is why it was safe: "when go
    north: the goal's way, do not go west; go north was safe there". TextWorld level 2 lost
    to detours and to a keycard examined in reach, and a rule naming the whole room never
    applied elsewhere. Otherwise the whole situation.
    """
    parts = [p.strip() for p in str(situation).split(";") if p.strip()]
    wanted = {normalize(action), *(normalize(a) for a in list(safe)[:MAX_SAFE])}
    keyed = [p for p in parts if _key(normalize(p)) in wanted]
    if not any(_key(normalize(p)) == normalize(action) for p in keyed):
        ways = goal_ways(situation)
        goal = [p for p in keyed if _key(normalize(p)) in ways]
        return "; ".join(goal) if goal and normalize(action) not in ways else str(situation)
    return "; ".join(keyed)


def applies(rule: RuleLike, situation: str) -> bool:
    """Whether a rule's situation is this one: equal, contained in it (at least 8 chars), or
    made of clauses that are all among this situation's clauses (in any order)."""
    when, now = normalize(rule.when), normalize(situation)
    if not when or not now:
        return False
    if when == now or (len(when) >= 8 and when in now):
        return True
    parts = clauses(when)
    return len(parts) > 1 and set(parts) <= set(clauses(now))


def bind(rule: RuleLike, situation: str) -> RuleLike | None:
    """``rule`` as it reads in ``situation``: itself where it :func:`applies`; else, where each
    of its clauses recurs here either as it is or keyed by another action that the rule itself
    names, the rule with those actions swapped, one for one, throughout; None otherwise.

    Situations key a clause by the action whose outcome it names, so a rule learned on one
    map names directions: "when go east: the goal's way; go south: the way back, do not go
    south; go east was safe there" held on no TextWorld game whose goal went north, where the
    same walk back (south to north here) lost the game. Bound there it reads "... do not go
    east; go north was safe there". A clause whose words match two of this situation's (two
    holes) binds to neither, and only keys the rule acts on are swapped, so a state keyed by
    something else never moves a rule to where it does not hold.
    """
    if applies(rule, situation):
        return rule
    mine, here = clauses(rule.when), clauses(situation)
    if not mine:
        return None
    named = {normalize(a) for a in (*rule.avoid, *rule.prefer)}
    swap: dict[str, str] = {}
    for clause in mine:
        if clause in here:
            continue
        key, said = _key(clause), clause.split(":", 1)[-1].strip()
        if not key or key not in named:
            return None
        others = [c for c in here if _key(c) and c.split(":", 1)[1].strip() == said]
        if len(others) != 1 or swap.get(key, _key(others[0])) != _key(others[0]):
            return None
        swap[key] = _key(others[0])
    if not swap or len(set(swap.values())) != len(swap):
        return None
    taken = set(swap.values()) - set(swap)

    def moved(actions: Sequence[str]) -> tuple[str, ...]:
        # an action the rule names unswapped that a swap now lands on would say two things
        out = [swap.get(normalize(a), a) for a in actions if normalize(a) in swap or normalize(a) not in taken]
        return tuple(dict.fromkeys(out))

    avoid = moved(rule.avoid)
    if rule.avoid and not avoid:
        return None
    when = "; ".join(f"{swap[_key(c)]}:{c.split(':', 1)[1]}" if _key(c) in swap else c for c in mine)
    return ParsedRule(when=when, avoid=avoid, prefer=tuple(a for a in moved(rule.prefer) if a not in avoid))


def contradicts(a: RuleLike, b: RuleLike) -> bool:
    """Two rules for the same situation where one advises what the other forbids:
    "do not monitor; sleep was safe" against "do not sleep; monitor was safe"."""
    if normalize(a.when) != normalize(b.when) and set(clauses(a.when)) != set(clauses(b.when)):
        return False
    return bool(set(a.avoid) & set(b.prefer)) or bool(set(b.avoid) & set(a.prefer))


def forbidden_in(texts: Iterable[str], situation: str, valid_actions: Sequence[str]) -> set[str]:
    """Actions that rules written anywhere in ``texts`` (one per line, list markers allowed)
    forbid in ``situation``: how a rule-obeying stand-in model reads its prompt."""
    out: set[str] = set()
    for text in texts:
        for line in text.splitlines():
            parsed = parse(line.lstrip("-*0123456789[]. ").strip(), valid_actions)
            if parsed is not None and applies(parsed, situation):
                out.update(parsed.avoid)
    return out


def check(
    text: str,
    *,
    valid_actions: Sequence[str],
    situations: Sequence[str],
    failing_situation: str,
    failing_action: str,
    safe_actions: Sequence[str] = (),
    won_actions: Sequence[str] = (),
    abstract: Callable[[str], str] | None = None,
    instance_terms: Callable[[str], Sequence[str]] | None = None,
) -> tuple[str | None, str]:
    """Hold a reflected rule against the trajectory it came from.

    Returns ``(rule, why)``: the rule to keep (``text`` itself, or a repaired rule) and, when
    it was repaired or rejected (``rule`` is None), the reason, so the caller can record it.

    - a rule must be "when <situation>, ..." and its situation must be one the agent met
      (one of ``situations``), else the agent can never recognise when it applies;
    - in the failing situation, a rule that advises the failing action, or an action that
      replaying the episode showed to be unsafe, is repaired into "do not <failing action>;
      <safe> was safe there";
    - a rule may name only what recurs in other tasks: ``abstract`` (the env's) first rewrites
      instance-only names into their kinds ("User2" -> "a User host"), and a rule that
      ``instance_terms`` still finds names in (a coordinate, a generated name) is refused;
    - a rule that forbids an action its own situation keys as the goal's way or object
      (:func:`forge.envs.situation.goal_ways`) is refused: the env says that action is progress;
      a narrowed rule drops the safe moves its "when" does not name;
    - in the failing situation, ``won_actions`` (safe actions that replaying the episode showed
      to win it outright from there) overrule the reflector: a rule that forbids one is refused,
      and a rule that recommends none of them is repaired to name the first. A 1.5B reflector
      wrote "do not look; go east was safe there" in a coin room where "take coin" won.
    """
    original = text
    if abstract is not None:
        # rules name kinds, also of actions ("restore a User host" for restore User2): the
        # kinds of the valid actions are words a rule may use, matched back to concrete
        # actions when the rule is applied (forge.learn.prompt.Recollection)
        text = _abstracted(text, abstract)
        kinds = list(dict.fromkeys(abstract(a) for a in valid_actions))
        valid_actions = list(dict.fromkeys([*valid_actions, *kinds]))
        failing_action = abstract(failing_action)
        # A kind can stand for both what failed and what was safe ("restore User1" failed,
        # "restore User2" did not: both "restore a User host"). The kind failed here, so the
        # rule keeps forbidding it and stops calling it safe: a CAGE-2 rule read "do not
        # restore a User host; restore a User host was safe there", a text at odds with itself.
        safe_actions = [k for k in dict.fromkeys(abstract(a) for a in safe_actions) if k != failing_action]
        won_actions = [k for k in dict.fromkeys(abstract(a) for a in won_actions) if k != failing_action]
        text = _without_safe_forbidden(text, valid_actions)
    # the template's own "was safe there" is no name, even in a game with a safe in it
    if instance_terms is not None and (why := instance_reason(_SAFE_TAIL.sub("", text), instance_terms, original)):
        return None, why
    rule, why = _checked(text, original, valid_actions, situations, failing_situation, failing_action, safe_actions)
    kept = parse(rule, valid_actions) if rule is not None else None
    if rule is None or kept is None:
        return rule, why
    if against := [a for a in kept.avoid if normalize(a) in goal_ways(kept.when)]:
        return None, f"forbids what the goal names next ({', '.join(against)}): {original[:80]!r}"
    if (lean := _without_unkeyed_safe(kept)) is not None and normalize(lean) != normalize(rule):
        rule, why = lean, f"repaired: drops the safe moves its narrowed 'when' does not name ({original[:60]!r})"
        kept = parse(rule, valid_actions) or kept
    return _with_won(rule, why, kept, won_actions, failing_situation, original)


def _with_won(rule: str, why: str, kept: ParsedRule, won: Sequence[str], failing_situation: str,
              original: str) -> tuple[str | None, str]:
    """``rule`` held against the actions that won the episode from the failing situation:
    refused when it forbids one, repaired to recommend the first when it recommends none."""
    won_here = [normalize(a) for a in won]
    if not won_here or not kept.avoid or not applies(kept, failing_situation):
        return rule, why
    if against := [a for a in kept.avoid if normalize(a) in won_here]:
        return None, f"forbids what won the episode from there ({', '.join(against)}): {original[:80]!r}"
    if any(normalize(a) in won_here for a in kept.prefer):
        return rule, why
    # the win is why the rule holds, so it may narrow the "when" the reflector left whole: on
    # treasure-2 "when <the whole room>, do not examine a door; take a food from a supporter
    # was safe there" applied in no other room, where "when take a food from a supporter: the
    # goal's object, ..." holds wherever the goal's object lies in reach
    when = focus(kept.when, kept.avoid[0], [won[0]]) if len(kept.avoid) == 1 else kept.when
    repaired = _compose(when, kept.avoid, [won[0]])
    return repaired, f"repaired: recommends {won[0]!r}, which won the episode from there ({original[:60]!r})"


_SAFE_TAIL = re.compile(r"\s+(?:was|were)\s+safe there\s*\.?\s*$", re.IGNORECASE)


def _abstracted(text: str, abstract: Callable[[str], str]) -> str:
    """``abstract`` applied to a rule but not to the template's own "was safe there": in a
    TextWorld game that had a safe, "go east was safe there" became "go east was a container
    there"."""
    tail = _SAFE_TAIL.search(text)
    return abstract(text) if tail is None else abstract(text[:tail.start()]) + tail.group(0)


def _without_unkeyed_safe(rule: ParsedRule) -> str | None:
    """A narrowed rule (its "when" only the clauses keyed by the moves it names) without the
    safe moves none of its clauses name: what made them safe was in the clauses narrowing
    dropped. "when go north: the way back, do not go north; go south was safe there" came
    from one room with a plain exit south, and sent agents south wherever the way back was
    north, also where the goal said west. None when the rule is not narrowed or loses nothing."""
    keys = {_key(c) for c in clauses(rule.when)}
    named = {normalize(a) for a in (*rule.avoid, *rule.prefer)}
    if not rule.avoid or not rule.prefer or not keys <= named | {"goal"}:
        return None
    keep = [a for a in rule.prefer if normalize(a) in keys]
    if len(keep) == len(rule.prefer):
        return None
    return _compose(rule.when, rule.avoid, keep)


def _checked(text: str, original: str, valid_actions: Sequence[str], situations: Sequence[str],
             failing_situation: str, failing_action: str, safe_actions: Sequence[str]) -> tuple[str | None, str]:
    repaired_names = text != original
    parsed = parse(text, valid_actions)
    if parsed is None:
        return None, f"not a 'when <situation>, ...' rule: {text[:80]!r}"
    if not parsed.avoid and not parsed.prefer:
        return None, f"rule names no valid action ({', '.join(valid_actions)}): {text[:80]!r}"
    if not any(applies(parsed, s) for s in situations):
        return None, f"rule names no situation the agent met ({parsed.when[:60]!r})"
    if applies(parsed, failing_situation):
        unsafe = failing_action in parsed.prefer or (safe_actions and any(a not in safe_actions for a in parsed.prefer))
        forgets = failing_action not in parsed.avoid
        if unsafe or forgets:
            repaired = write(focus(failing_situation, failing_action, safe_actions), failing_action, safe_actions)
            what = "recommends the action that failed" if failing_action in parsed.prefer else (
                "recommends an action that was not safe" if unsafe else "does not say what to avoid"
            )
            return repaired, f"repaired: rule {what} ({text[:60]!r})"
    narrowed = _narrowed(text, parsed, failing_situation)
    if narrowed != text:
        return narrowed, f"repaired: 'when' narrowed to the clauses of the actions it names ({original[:60]!r})"
    if repaired_names:
        return text, f"repaired: names made general ({original[:60]!r})"
    return text, ""


def _without_safe_forbidden(text: str, valid_actions: Sequence[str]) -> str:
    """``text`` rewritten without the safe actions that it also forbids; unchanged when none."""
    parsed = parse(text, valid_actions)
    if parsed is None or not parsed.avoid:
        return text
    safe = re.search(r";\s*(.+?)\s+(?:was|were)\s+safe there\s*\.?\s*$", text, re.IGNORECASE)
    if safe is None or not set(_mentioned(safe.group(1), valid_actions)) & set(parsed.avoid):
        return text
    return _compose(parsed.when, parsed.avoid, parsed.prefer)


def _narrowed(text: str, parsed: ParsedRule, situation: str) -> str:
    """A rule whose "when" is the whole failing situation, narrowed by :func:`focus` to the
    clauses of the actions it names: a 1.5B reflector copies the whole situation ("on the
    start tile; left: edge; down: hole; ...; goal: down-right at distance 6"), which recurs
    on few other maps, while "down: hole" recurs on most."""
    if normalize(parsed.when) != normalize(situation) or not (parsed.avoid or parsed.prefer):
        return text
    named = [*parsed.avoid, *parsed.prefer]
    narrow = focus(situation, named[0], named[1:])
    if narrow == situation:
        return text
    at = text.find(parsed.when)
    return text if at < 0 else text[:at] + narrow + text[at + len(parsed.when):]
