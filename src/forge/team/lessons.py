"""What a finished task taught, written in the goal's and the situations' terms.

The next task is another map or another generated game: its names and its walk are new, so
a lesson that lists the moves that won one game ("go west; go north; take coin") misleads
the team on the next (see "What makes memory transfer" in the design). A lesson is derived
instead from what the env's :class:`~forge.envs.base.EnvSpec` says of each decision: its
situation (``spec.situation``, instance-free by contract), the action in kinds
(``spec.abstract``), and how the two relate:

- a step that scored (earned more than the episode's usual step, or won it) becomes
  "when <the clause of its situation that names what it acted on>, <action>", with ", as the
  goal says" when the goal names it too: "when in a room with a coin, take coin, as the goal
  says";
- the other moves are summed up, never listed: which way they went against the goal (its
  clause, or the observation's ``Goal:`` line), what their keyed clauses led to, and what was
  on offer and never taken: "other moves: the way the goal names, in its order, none to the
  way back".

Every part is then held to ``spec.instance_terms``: one that still names something of this
task only is dropped, and why is kept (:func:`general`). Consolidation composes procedures
from these parts (:func:`compose`) and refuses text that lists moves (:func:`move_list`).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from forge.envs.base import EnvSpec
from forge.envs.situation import situation_of
from forge.learn.rules import clauses, focus, instance_reason, keyed, normalize

__all__ = [
    "Decision",
    "check_procedure",
    "compose",
    "decisions",
    "failure_parts",
    "general",
    "move_list",
    "scored",
    "success_parts",
]

#: Words that say nothing of what an action acts on.
_FILLER = frozenset({"a", "an", "the", "some", "from", "to", "on", "in", "into", "with", "of", "at", "by"})
_GOAL_LINE = re.compile(r"^\s*Goal:\s*(.+)$", re.IGNORECASE | re.MULTILINE)
_WORDS = re.compile(r"[a-z]+")
#: Most scored steps a lesson names: a long game's every subgoal would bury the gist.
MAX_SCORED = 3
#: A procedure naming this many actions in a row lists a walk.
WALK = 3


@dataclass(frozen=True, slots=True)
class Decision:
    """One step as a lesson sees it: the situation, the action as played and in kinds, its
    reward, and the goal's words (the situation's goal clause and the observation's goal)."""

    situation: str
    action: str
    act: str
    reward: float
    goal: str


def decisions(observations: Sequence[str], actions: Sequence[str], rewards: Sequence[float], spec: EnvSpec | None) -> list[Decision]:
    """The steps of a trajectory through ``spec``'s eyes (observation ``i`` is before action ``i``)."""
    out = []
    for obs, action, reward in zip(observations, actions, rewards, strict=False):
        situation = situation_of(obs, spec)
        act = spec.abstract(action) if spec is not None and spec.abstract is not None else action
        line = _GOAL_LINE.search(obs)
        goal = " ".join([keyed(situation).get("goal", ""), line.group(1) if line else ""])
        out.append(Decision(situation, action, " ".join(act.split()), float(reward), goal))
    return out


def _content(act: str) -> list[str]:
    """The words of an action that name what it acts on or where it goes: "take a coin" ->
    ["coin"], "go south" -> ["south"], "down" -> ["down"]."""
    words = _WORDS.findall(act.lower())
    return [w for w in (words[1:] if len(words) > 1 else words) if w not in _FILLER]


def _names(goal: str, act: str) -> bool:
    content = _content(act)
    return bool(content) and set(content) <= set(_WORDS.findall(goal.lower()))


def scored(steps: Sequence[Decision], *, success: bool) -> list[int]:
    """The steps that earned more than the episode's most usual reward, and a success's last
    step (what won it): what a lesson names as done in its situation."""
    if not steps:
        return []
    usual = Counter(s.reward for s in steps).most_common(1)[0][0]
    out = [i for i, s in enumerate(steps) if s.reward > usual]
    if success and len(steps) - 1 not in out:
        out.append(len(steps) - 1)
    return out


def _trigger(step: Decision) -> str:
    """The part of a step's situation that called for its action: the clause keyed by the
    action ("right: goal"), else the clause that names what the action acts on ("in a room
    with a coin"); "" when none does."""
    for action in dict.fromkeys((step.action, step.act)):  # keyed as played, or in kinds ("take a key")
        if (narrow := focus(step.situation, action)) != step.situation:
            return normalize(narrow)
    content = set(_content(step.act))
    best, hits = "", 0
    for clause in clauses(step.situation):
        if clause.startswith("goal:"):
            continue
        n = len(content & set(_WORDS.findall(clause)))
        if n > hits:
            best, hits = clause, n
    return best


def _situated(step: Decision) -> str:
    """"when <trigger>, <action>[, as the goal says]"."""
    trigger = _trigger(step)
    text = f"when {trigger}, {step.act}" if trigger else step.act
    return text + (", as the goal says" if _names(step.goal, step.act) else "")


def _in_order(goal: str, steps: Sequence[Decision]) -> bool:
    """Whether the moves' words come up in the goal in the order they were made."""
    words, at = _WORDS.findall(goal.lower()), 0
    for s in steps:
        content = _content(s.act)
        if not content or content[-1] not in words[at:]:
            return False
        at = words.index(content[-1], at) + 1
    return True


def _moves(steps: Sequence[Decision]) -> str:
    """The moves summed up, never listed: how they went against the goal, what their keyed
    clauses led to (where it was most of the moves it was on offer in) and what was on offer
    and never taken. "" when there is nothing to say."""
    if not steps:
        return ""
    offered: Counter[str] = Counter()
    chose: Counter[str] = Counter()
    for s in steps:
        clause = {k: v for k, v in keyed(s.situation).items() if k != "goal"}
        offered.update(set(clause.values()))
        if (mine := normalize(s.action)) in clause:
            chose[clause[mine]] += 1
    said = []
    named = sum(1 for s in steps if _names(s.goal, s.act))
    if named == len(steps):
        said.append("the way the goal names" + (", in its order" if len(steps) > 1 and _in_order(steps[0].goal, steps) else ""))
    elif 2 * named >= len(steps):
        said.append("mostly the way the goal names")
    # a value taken now and then is no lesson: a meandering win went the way back a few times
    if taken := [v for v, n in chose.most_common() if 2 * n > offered[v]]:
        said.append("to " + " or ".join(taken))
    if avoided := sorted(v for v in offered if not chose[v]):
        said.append("none to " + " or ".join(avoided))
    return "other moves: " + ", ".join(said) if said else ""


def success_parts(steps: Sequence[Decision]) -> list[str]:
    """What a won episode did, in its situations' terms: the scored steps (at most
    :data:`MAX_SCORED`, the winning one always), then the other moves summed up."""
    won = scored(steps, success=True)
    keep = won[: MAX_SCORED - 1] + won[-1:] if len(won) > MAX_SCORED else won
    parts = list(dict.fromkeys(_situated(steps[i]) for i in keep))
    moves = _moves([s for i, s in enumerate(steps) if i not in set(won)])
    return parts + ([moves] if moves else [])


def failure_parts(steps: Sequence[Decision], at: int, *, tau: float | None = None) -> list[str]:
    """What a failed episode did wrong, in its situation's terms: "when <the clause keyed by
    the failing action>, <action> (what came of it)", or, with no such clause, when <the
    clause naming what it acted on; the goal>, <action>, which the goal does not name"."""
    if not steps:
        return []
    s = steps[min(max(at, 0), len(steps) - 1)]
    narrow = focus(s.situation, s.action)
    if narrow != s.situation:
        when = normalize(narrow)
    else:
        goal = [c for c in clauses(s.situation) if c.startswith("goal:")]
        when = "; ".join([c for c in (_trigger(s),) if c] + goal[:1]) or normalize(s.situation)
    act = s.act if _names(s.goal, s.act) or not s.goal.strip() else f"{s.act}, which the goal does not name"
    fell = tau is not None and s.reward < tau
    what = f"reward {s.reward:g}, below tau {tau:g}" if fell else "the task was not solved from there"
    return [f"when {when}, {act} ({what})"]


def general(parts: Sequence[str], spec: EnvSpec | None) -> tuple[list[str], list[str]]:
    """``(kept, dropped)``: each part with its names made kinds (``spec.abstract``); a part that
    ``spec.instance_terms`` still finds a name of this task in is dropped, with why."""
    kept, dropped = [], []
    for part in parts:
        text = spec.abstract(part) if spec is not None and spec.abstract is not None else part
        why = instance_reason(text, spec.instance_terms, part) if spec is not None and spec.instance_terms else ""
        if why:
            dropped.append(f"dropped: {why}")
        else:
            kept.append(text)
    return kept, dropped


def compose(lessons: Sequence[Sequence[str]], steps: Sequence[int | None] = ()) -> str:
    """One procedure's knowledge from the parts of several successes' lessons: each distinct
    part once, the most shared first, marked "(k of n)" unless every success had it, after
    how many steps they took. The lessons are already in their situations' terms, so what
    is composed is too."""
    n = len(lessons)
    count: Counter[str] = Counter(p for parts in lessons for p in dict.fromkeys(parts))
    order = {p: i for i, p in enumerate(dict.fromkeys(p for parts in lessons for p in parts))}
    out = []
    took = sorted(s for s in steps if s)
    if took:
        out.append(f"Solved {n} {'time' if n == 1 else 'times'} in {took[0]}{'' if took[0] == took[-1] else f' to {took[-1]}'} steps.")
    for part in sorted(count, key=lambda p: (-count[p], order[p])):
        text = part.strip()
        text = text[:1].upper() + text[1:]
        if count[part] < n:
            text = f"{text.rstrip('.')} ({count[part]} of {n})"
        out.append(text if text.endswith((".", "!", "?")) else text + ".")
    return " ".join(out)


def move_list(text: str, walks: Sequence[Sequence[str]]) -> str:
    """The moves of one of ``walks`` (an episode's actions, in order) that ``text`` lists one
    after another, :data:`WALK` or more of them ("go west; go north; take coin"), or "": a
    procedure that does is one game's walk, not a way to play the next."""
    names = sorted({a.lower() for walk in walks for a in walk if a.strip()}, key=len, reverse=True)
    if not names:
        return ""
    one = r"(?<![\w-])(?:" + "|".join(re.escape(a) for a in names) + r")(?![\w-])"
    sep = r"(?:\s*(?:[;,]|->|\bthen\b|\band\b)\s*)+"
    windows = {tuple(a.lower() for a in walk[i:i + WALK]) for walk in walks for i in range(len(walk) - WALK + 1)}
    for run in re.finditer(rf"{one}(?:{sep}{one}){{{WALK - 1},}}", text, re.IGNORECASE):
        said = [m.group(0).lower() for m in re.finditer(one, run.group(0), re.IGNORECASE)]
        if any(tuple(said[i:i + WALK]) in windows for i in range(len(said) - WALK + 1)):
            return run.group(0)
    return ""


def check_procedure(text: str, specs: Sequence[EnvSpec], walks: Sequence[Sequence[str]]) -> tuple[str | None, str]:
    """Hold a procedure's text to the envs of its episodes: names made kinds by each
    ``spec.abstract``; refused (None, why) when an ``instance_terms`` still finds one, or when
    it lists :data:`WALK` or more moves of one of ``walks`` (its episodes' actions) in a row.
    ``(text, why)``, why "" when the text needed nothing."""
    repaired = text
    for spec in specs:
        if spec.abstract is not None:
            repaired = spec.abstract(repaired)
    for spec in specs:
        if spec.instance_terms is not None and (why := instance_reason(repaired, spec.instance_terms, text)):
            return None, why
    if walk := move_list(repaired, walks):
        return None, f"lists one game's moves ({walk[:60]!r})"
    return repaired, "" if repaired == text else f"repaired: names made general ({text[:60]!r})"

