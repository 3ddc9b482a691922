"""Microsoft TextWorld games, generated from a seed, as FORGE environments.

``make_env("textworld:coin-1")`` plays TextWorld's own challenge generators (what ``tw-make``
runs): ``reset(seed=s)`` generates the game of seed ``s`` on first use, with TextWorld's bundled
Inform 7 compiler, offline, into ``<cache>/<family>-<level>/<seed>.z8`` (plus TextWorld's
``.json`` beside it), and replays that file afterwards. The same seed is the same game on every
machine (TextWorld seeds every generator from it; the files come out byte-identical). The cache
is ``cache_dir=`` when given, else ``$FORGE_CACHE/textworld``, else
``$XDG_CACHE_HOME/forge/textworld`` (``~/.cache/forge/textworld``). A game is written into a
temporary folder beside its final place and moved there with ``os.replace``, the ``.z8`` last,
so a reader never sees half a game.

Families and levels (TextWorld's settings in brackets; "walk" is the length of the game's own
walkthrough):

==========  ===================================================================  =====  =========
env         the game                                                             walk   max_steps
==========  ===================================================================  =====  =========
coin-1      coin collector: a chain of 3 rooms, the coin at the far end [lvl 3]  3      30
coin-2      5-room chain with dead-end rooms off it, 10 rooms [lvl 105]          5      40
coin-3      10-room chain, 30 rooms, dead ends anywhere [lvl 210]                10     60
treasure-1  treasure hunter: fetch the named object, 5 rooms [lvl 5]             3      30
treasure-2  10 rooms, closed doors and containers [lvl 15]                       6      40
treasure-3  20 rooms, locked doors and containers [lvl 25]                       11     60
simple-1    the fixed house: fetch a food, put it on the stove [dense, detailed] 8-12   40
simple-2    the same, points at fewer subgoals, a one-line goal [balanced, brief] 8-12  40
simple-3    points only for winning, no goal given (read the note) [sparse, none] 8-12  50
cooking-1   cooking: one ingredient, the kitchen only [recipe 1, take 1, go 1]   5      30
cooking-2   2 ingredients, 6 rooms, open/cook/cut [recipe 2, take 1, go 6]       14-19  60
cooking-3   3 ingredients, 9 rooms, open/cook/cut, small inventory [+drop]       34-40  80
==========  ===================================================================  =====  =========

Shaping, the same for every family (tau = -0.5, theta = 1.0, success >= 1.0, major failure
<= -1.0), chosen so that only a lost game falls below tau and only a won game reaches success:

* every step costs -0.01, so a stall shows in the return (80 steps cost 0.8 at most);
* the game's score rising adds ``points / max_score``: a whole game's points sum to 1;
* winning adds +1 (a win returns 2 - 0.01 per step >= 1.2; any other end stays below 1);
* losing (treasure: taking the wrong object; simple: eating the food; cooking: burning or
  mis-preparing an ingredient) gives -1 minus the progress earned so far, and ends the game:
  a lost game returns -1 - 0.01 per step.

Observations are compact: the goal (TextWorld's objective without its welcome and sign-off
lines), what the last command did, the room's description, the exit the agent came in through
(once it has moved), the goal's way from here (when the goal spells out a route, as coin games
do: the route's next leg, or the way back to it after a detour), the goal's object (the command
that takes the thing the goal names, when it lies in reach) and the inventory, each on its
own labelled line, whitespace collapsed, no ASCII banner and no status line.

Transfer (see :class:`~forge.envs.base.EnvSpec`): TextWorld names its rooms and things from a
grammar ("the spare room", "an American latchkey"), so ``spec.situation`` describes a state in
kinds ("in a room with a closed container, a supporter; exits north, east (a locked door),
west; go north: the goal's way; go west: the way back; carrying a key; goal: take an
object"), ``spec.abstract`` rewrites
names into kinds and ``spec.instance_terms`` lists the names a text still holds. They read a per-env lexicon: every
entity of every game the env has played plus TextWorld's own vocabulary for the family (its
name grammar; the cooking game's food, furniture and room lists; the simple game's fixed house).
Words a family's every game shares in the same role (the coin; the kitchen, cookbook, knife,
oven, stove, BBQ and meal of the cooking game) stay as they are.

Held-out split: :data:`TRAIN_SEEDS` (0-99) to learn on, :data:`HELD_OUT_SEEDS` (1000-1099) to
judge on; :func:`train_seeds` / :func:`held_out_seeds` give them per family.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import warnings
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge.envs.base import EnvSpec, StepResult, check_action
from forge.envs.situation import GOAL_OBJECT, GOAL_WAY, summarize_observation
from forge.errors import ConfigError, EnvError, UserError, ValidationError

__all__ = [
    "HELD_OUT_SEEDS",
    "TRAIN_SEEDS",
    "TextWorldEnv",
    "game_file",
    "held_out_seeds",
    "make_textworld",
    "textworld_cache_dir",
    "textworld_games",
    "textworld_place",
    "train_seeds",
]

_TAU, _THETA, _SUCCESS, _MAJOR = -0.5, 1.0, 1.0, -1.0
_STEP_COST, _WIN, _LOSS = -0.01, 1.0, -1.0

#: Seeds a learning run may train on (every family).
TRAIN_SEEDS = range(0, 100)
#: Seeds learning is judged on; no training run plays them.
HELD_OUT_SEEDS = range(1000, 1100)

_INSTALL = "textworld is not installed; install it with: pip install 'forge-memory[textworld]'"


@dataclass(frozen=True, slots=True)
class _Level:
    challenge: str
    settings: Mapping[str, Any]
    max_steps: int


def _cooking(recipe: int, take: int, go: int, *, open_: bool = False, cook: bool = False,
             cut: bool = False, drop: bool = False) -> dict[str, Any]:
    return {"recipe": recipe, "take": take, "go": go, "open": open_, "cook": cook, "cut": cut,
            "drop": drop, "recipe_seed": 0, "split": None}


_LEVELS: dict[str, dict[int, _Level]] = {
    "coin": {
        1: _Level("tw-coin_collector", {"level": 3}, 30),
        2: _Level("tw-coin_collector", {"level": 105}, 40),
        3: _Level("tw-coin_collector", {"level": 210}, 60),
    },
    "treasure": {
        1: _Level("tw-treasure_hunter", {"level": 5}, 30),
        2: _Level("tw-treasure_hunter", {"level": 15}, 40),
        3: _Level("tw-treasure_hunter", {"level": 25}, 60),
    },
    "simple": {
        1: _Level("tw-simple", {"rewards": "dense", "goal": "detailed", "test": False}, 40),
        2: _Level("tw-simple", {"rewards": "balanced", "goal": "brief", "test": False}, 40),
        3: _Level("tw-simple", {"rewards": "sparse", "goal": "none", "test": False}, 50),
    },
    "cooking": {
        1: _Level("tw-cooking", _cooking(1, 1, 1), 30),
        2: _Level("tw-cooking", _cooking(2, 1, 6, open_=True, cook=True, cut=True), 60),
        3: _Level("tw-cooking", _cooking(3, 2, 9, open_=True, cook=True, cut=True, drop=True), 80),
    },
}

_ABOUT = {
    "coin": "Find the coin somewhere along a chain of rooms and take it; from level 2 dead-end "
            "rooms branch off the way.",
    "treasure": "Find the object the goal names and take it. Taking any other object loses the "
                "game. From level 2 doors and containers may be closed, from level 3 locked (their "
                "keys lie somewhere in the house).",
    "simple": "A small house: fetch the food the goal names and put it on the stove in the "
              "kitchen; the key to the bedroom door is in a drawer or a trunk. Eating the food "
              "loses the game. From level 2 the goal is one line, at level 3 it is only written "
              "on a note somewhere.",
    "cooking": "Read the cookbook in the kitchen, gather the ingredients of its recipe, prepare "
               "each one as it says (slice, dice or chop it with the knife; roast it in the oven, "
               "fry it on the stove, grill it on the BBQ), then 'prepare meal' and 'eat meal'. "
               "Burning an ingredient, preparing it in a way the recipe does not ask, or eating "
               "one the recipe needs loses the game.",
}

# Commands about the game program rather than the world; TextWorld rarely lists them, and an
# agent must never spend a step on them.
_META = frozenset({"help", "quit", "restart", "restore", "save", "undo", "score", "verbose",
                   "brief", "superbrief", "about", "hint", "hints", "notify", "version", "wait"})


def textworld_games() -> list[str]:
    """Every ``<family>-<level>`` this module plays, in registry order."""
    return [f"{family}-{level}" for family, levels in _LEVELS.items() for level in levels]


def _check_family(family: str) -> None:
    if family not in _LEVELS:
        raise ConfigError(f"unknown TextWorld family {family!r}; known: {', '.join(_LEVELS)}")


def train_seeds(family: str) -> range:
    """The seeds a learning run on any level of ``family`` may train on (:data:`TRAIN_SEEDS`)."""
    _check_family(family)
    return TRAIN_SEEDS


def held_out_seeds(family: str) -> range:
    """The seeds learning on ``family`` is judged on (:data:`HELD_OUT_SEEDS`); no training seed
    is among them, so every judged game is one no run trained on."""
    _check_family(family)
    return HELD_OUT_SEEDS


def textworld_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """Where generated games live: ``cache_dir``, else ``$FORGE_CACHE/textworld``, else
    ``$XDG_CACHE_HOME/forge/textworld`` (``~/.cache/forge/textworld``)."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    forge_cache = os.environ.get("FORGE_CACHE")
    if forge_cache:
        return Path(forge_cache).expanduser() / "textworld"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "forge" / "textworld"


def _textworld() -> Any:
    try:
        import textworld
        import textworld.challenges
        import textworld.generator
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(_INSTALL) from exc
    return textworld


@contextlib.contextmanager
def _quiet(tw: Any) -> Iterator[None]:
    """Silence the two notices TextWorld's own calls raise, and only those.

    jericho warns on every load that a generated game is not in its list of known games (it
    then leaves score and change detection to TextWorld, which does them itself); TextWorld
    warns when a name grammar runs short and it falls back on an adjective. textworld silences
    both with global filters at import time, which a test runner's per-test filters undo.
    """
    import jericho

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=jericho.UnsupportedGameWarning)
        warnings.filterwarnings("ignore", category=tw.GenerationWarning)
        yield


def _parse_name(name: str) -> tuple[str, int]:
    family, sep, level = name.rpartition("-")
    if not sep:
        family, level = name, ""
    _check_family(family)
    if not level.isdigit():
        known = ", ".join(f"{family}-{n}" for n in _LEVELS[family])
        raise ConfigError(f"unknown TextWorld level {name!r}; known for {family}: {known}")
    _check_level(family, int(level))
    return family, int(level)


def _check_level(family: str, level: int) -> None:
    if level not in _LEVELS[family]:
        known = ", ".join(f"{family}-{n}" for n in _LEVELS[family])
        raise ConfigError(f"unknown TextWorld level {family}-{level}; known for {family}: {known}")


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise ValidationError(f"a TextWorld seed is an integer from 0 to 2**31 - 1, got {seed!r}")
    return seed


def game_file(family: str, level: int, seed: int, *,
              cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """The compiled game of ``seed``, generated (offline, about a second) on first use."""
    _check_family(family)
    _check_level(family, level)
    seed = _check_seed(seed)
    target = textworld_cache_dir(cache_dir) / f"{family}-{level}" / f"{seed}.z8"
    if not (target.is_file() and target.with_suffix(".json").is_file()):
        _generate(_LEVELS[family][level], seed, target)
    return target


def _generate(spec: _Level, seed: int, target: Path) -> None:
    tw = _textworld()
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{seed}-") as tmp:
        options = tw.GameOptions()
        options.seeds = seed
        options.path = str(Path(tmp) / target.name)
        options.force_recompile = True
        make = tw.challenges.CHALLENGES[spec.challenge][1]
        try:
            with _quiet(tw):
                game = make(settings=dict(spec.settings), options=options)
                built = Path(tw.generator.compile_game(game, options))
        except Exception as exc:  # TextWorld raises plain ValueError/RuntimeError subclasses
            raise EnvError(
                f"TextWorld could not generate {spec.challenge} {dict(spec.settings)} for seed "
                f"{seed}: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}"
            ) from exc
        os.replace(built.with_suffix(".json"), target.with_suffix(".json"))
        os.replace(built, target)


# -- kinds, names and situations -----------------------------------------------------------------

_KIND_OF_TYPE = {"r": "room", "d": "door", "c": "container", "s": "supporter", "k": "key",
                 "f": "food", "o": "object", "oven": "oven", "stove": "stove", "toaster": "bbq",
                 "meal": "meal"}
_SKIP_TYPES = frozenset({"P", "I", "t", "RECIPE", "ingredient", "slot"})
_DIRECTIONS = ("north", "south", "east", "west")
# A thing literally named for its kind ("a key", "a door") is matched as itself, never taken for
# an instance name; these words are never names at all.
_SELF_KINDS = frozenset({*_KIND_OF_TYPE.values(), "coin"} - {"room"})
_NOT_NAMES = frozenset({"room", "thing", "floor", "ground", "exit", "nothing", "inventory", *_DIRECTIONS})
# Bare vocabulary nouns that are everyday English: taken for names only once a played game
# really had such a thing, so "in that case" or "a safe move" in a rule is not a name.
_COMMON_NOUNS = frozenset({"bar", "board", "case", "display", "safe", "stand", "study", "iron",
                           "mat", "mouse", "plant", "glass", "pan", "plate", "rack", "set"})
_ROLES = {
    "coin": ("coin",),
    "treasure": (),
    "simple": (),
    "cooking": ("kitchen", "cookbook", "recipe book", "knife", "oven", "stove", "bbq", "meal"),
}
_ARTICLES = frozenset({"a", "an", "the", "some"})
_STATES = frozenset({"closed", "locked", "open", "opened", "unlocked", "raw", "sliced", "diced",
                     "chopped", "fried", "roasted", "grilled", "burned", "uncut"})
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")
_SENTENCE = re.compile(r"(?<=[.!?])\s+")
_VERBS = {"take": "take", "lift": "take", "retrieve": "take", "recover": "take", "grab": "take",
          "get": "take", "fetch": "take", "put": "put", "place": "put", "sit": "put",
          "rest": "put", "set": "put", "insert": "put", "deposit": "put", "eat": "eat",
          "open": "open", "unlock": "unlock", "drop": "drop", "cook": "cook", "find": "find"}
_IN_A_ROOM = re.compile(
    r",?\s+\b(?:(?:that's|that is|which is)\s+)?(?:from|in|inside|within|on|of|at)\s+"
    r"(?:the floor of\s+)?an?\s+room\b", re.IGNORECASE)


@dataclass(slots=True)
class _Match:
    start: int  # of the article or state words in front of the name, when there are any
    end: int
    name: str  # as the text writes it
    kind: str
    states: tuple[str, ...]
    article: str


def _a(phrase: str) -> str:
    return f"{'an' if phrase[:1].lower() in 'aeiou' else 'a'} {phrase}"


def _plural(kind: str) -> str:
    return kind if kind.endswith("s") else f"{kind}s"


@dataclass
class _Lexicon:
    """name -> kind for one family: TextWorld's vocabulary plus every entity of played games.

    The vocabulary loads on first use (a second or so of grammar expansion); names a game
    really had override the vocabulary's guess at their kind.
    """

    family: str
    _kinds: dict[str, str] = field(default_factory=dict)
    _max_words: int = 1
    _loaded: bool = False
    _rooms: set[str] = field(default_factory=set)  # names of rooms, the kitchen among them

    def __post_init__(self) -> None:
        for word in (*_ROLES[self.family], *_SELF_KINDS):
            self._put(word, word, override=True)

    def _put(self, name: str, kind: str, *, override: bool) -> None:
        key = " ".join(name.lower().split())
        if not key or key in _NOT_NAMES:
            return
        if kind == "room":
            self._rooms.add(key)
        if key in _ROLES[self.family] or key in _SELF_KINDS:
            kind = key
        if override or key not in self._kinds:
            self._kinds[key] = kind
            self._max_words = max(self._max_words, len(key.split()))

    def add_game(self, entities: Iterable[tuple[str, str]]) -> None:
        for name, type_ in entities:
            if name and type_ not in _SKIP_TYPES:
                self._put(name, _KIND_OF_TYPE.get(type_, "object"), override=True)

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True
        try:
            vocabulary = _vocabulary(self.family)
        except ConfigError:  # textworld absent: the names of played games still work
            return
        for name, kind in vocabulary:
            if name.lower() in _COMMON_NOUNS:
                continue
            self._put(name, kind, override=False)

    def matches(self, text: str) -> list[_Match]:
        self._load()
        tokens = list(_WORD.finditer(text))
        lows = [t.group().lower() for t in tokens]
        out: list[_Match] = []
        i = 0
        while i < len(tokens):
            for n in range(min(self._max_words, len(tokens) - i), 0, -1):
                if any(not text[tokens[j].end():tokens[j + 1].start()].isspace() for j in range(i, i + n - 1)):
                    continue
                kind = self._kinds.get(" ".join(lows[i:i + n]))
                if kind is None:
                    continue
                out.append(self._match(text, tokens, lows, i, i + n, kind))
                i += n
                break
            else:
                i += 1
        return out

    @staticmethod
    def _match(text: str, tokens: list[re.Match[str]], lows: list[str], i: int, j: int, kind: str) -> _Match:
        """The name tokens[i:j] with its article and state words: "a closed (conventional
        looking) fridge" is taken whole; state words count only after an article, so the verb in
        "open chest drawer" stays a verb."""
        def joined(a: int) -> bool:  # tokens a and a + 1 are separated by whitespace only
            return text[tokens[a].end():tokens[a + 1].start()].isspace()

        k = i - 1
        while k >= 0 and i - k <= 5 and joined(k) and lows[k] not in _ARTICLES:
            k -= 1
        start, article = i, ""
        states: tuple[str, ...] = ()
        if k >= 0 and i - k <= 5 and lows[k] in _ARTICLES and joined(k):
            middle = lows[k + 1:i]
            lead = 0
            while lead < len(middle) and middle[lead] in _STATES:
                lead += 1
            rest = middle[lead:]
            if not middle or (lead and len(rest) <= 2 and not any(w in _STATES for w in rest)):
                start, article = k, tokens[k].group()
                states = tuple("open" if w == "opened" else w for w in middle[:lead])
        name = text[tokens[i].start():tokens[j - 1].end()]
        return _Match(tokens[start].start(), tokens[j - 1].end(), name, kind, states, article)

    def instance_terms(self, text: str) -> list[str]:
        seen: dict[str, str] = {}
        for m in self.matches(text):
            if m.kind != m.name.lower():
                seen.setdefault(m.name.lower(), m.name)
        return list(seen.values())

    def abstract(self, text: str) -> str:
        out, last = [], 0
        for m in self.matches(text):
            if m.kind == m.name.lower():
                continue
            phrase = _a(" ".join([*m.states, m.kind]))
            if m.article[:1].isupper():
                phrase = phrase[0].upper() + phrase[1:]
            out.append(text[last:max(m.start, last)])
            out.append(phrase)
            last = m.end
        out.append(text[last:])
        return "".join(out)

    def _things(self, text: str) -> tuple[dict[str, str], dict[str, str], set[str]]:
        """Per name, its kind phrase ("a closed container"); doors by direction; exits seen."""
        things: dict[str, str] = {}
        doors: dict[str, str] = {}
        exits: set[str] = set()
        for sentence in _SENTENCE.split(text):
            words = {w.lower() for w in _WORD.findall(sentence)}
            ways = [d for d in _DIRECTIONS if d in words]
            exits.update(ways)
            for m in self.matches(sentence):
                if m.kind == "room" or m.name.lower() in self._rooms:
                    continue
                phrase = " ".join([*m.states, m.kind])
                if m.kind == "door" and ways:
                    doors[ways[0]] = phrase
                key = m.name.lower()
                if key not in things or m.states:
                    things[key] = phrase
        return things, doors, exits

    def situation(self, observation: str) -> str:
        room, carrying, goal = (_section(observation, label) for label in ("Room", "Carrying", "Goal"))
        parts: list[str] = []
        if room:
            header = room.split(".", 1)[0].strip().lower()
            where = f"in the {header}" if header in _ROLES[self.family] else "in a room"
            things, doors, exits = self._things(room)
            kinds = Counter(p for p in things.values() if not p.endswith("door"))
            listed = [_a(p) if n == 1 else f"{n} {_plural(p)}" for p, n in sorted(kinds.items())]
            parts.append(f"{where} with {', '.join(listed)}" if listed else where)
            ways = [f"{d} ({_a(doors[d])})" if d in doors else d for d in _DIRECTIONS if d in exits]
            parts.append(f"exits {', '.join(ways)}" if ways else "no exits")
            back = _section(observation, "Came in from").lower()
            ahead = _section(observation, "Goal's way from here").lower()
            if ahead in exits:
                # keyed by its move like the way back, so "when go west: the goal's way, go
                # west" is a rule for every game; worded so the way-back clause is not a
                # substring of it when the two coincide (walking a detour back)
                parts.append(f"go {ahead}: {GOAL_WAY}" + (", back" if ahead == back else ""))
            if take := _section(observation, "Goal's object here"):
                # keyed by its command in kinds ("take a key: the goal's object"), as the goal's
                # way: a team with moves in its memory walked out of the room holding the
                # goal's object, where the team without memory took it
                parts.append(f"{self.abstract(take)}: {GOAL_OBJECT}")
            if back in exits and back != ahead:
                # keyed by its move, so a rule against walking back narrows to this clause
                # (forge.learn.rules.focus) and holds in any room of any game entered that
                # way. Plain exits are not keyed: "go south: an exit" says nothing of why
                # south failed, and a TextWorld stream's rule "when go south: an exit, do not
                # go south" forbade south in every room
                parts.append(f"go {back}: the way back")
        if carrying:
            things, _, _ = self._things(carrying)
            kinds = Counter(things.values())
            held = [_a(p) if n == 1 else f"{n} {_plural(p)}" for p, n in sorted(kinds.items())]
            parts.append(f"carrying {', '.join(held)}" if held else "carrying nothing")
        aim = self.goal(goal)
        if aim:
            parts.append(f"goal: {aim}")
        if not parts:  # not an observation of this env (a rule, a note): its gist, in kinds
            return self.abstract(summarize_observation(observation))
        return "; ".join(parts)

    def goal(self, goal: str) -> str:
        """The goal's last instruction in kinds: "take an object", "put a food on a supporter"."""
        if not goal:
            return ""
        if self.family == "cooking":
            return "cook the recipe in the cookbook and eat the meal"
        sentences = [s for s in _SENTENCE.split(goal) if self.matches(s)]
        if not sentences:
            return ""
        text = _IN_A_ROOM.sub("", self.abstract(sentences[-1]))
        text = re.sub(r"\bpick(?:-|\s+)up\b", "take", text, flags=re.IGNORECASE)
        words = text.split()
        # the verb that takes a thing ("retrieve a coin"), not one that starts the sentence's
        # lead-in ("Once you get through with that, retrieve a coin"); else the first verb
        verbs = [i for i, w in enumerate(words) if w.lower().strip(",;:") in _VERBS]
        governing = [i for i in verbs if i + 1 < len(words) and words[i + 1].lower() in _ARTICLES]
        if verbs:
            i = (governing or verbs)[0]
            words = [_VERBS[words[i].lower().strip(",;:")], *words[i + 1:]]
        text = " ".join(words).rstrip(".!?,; ").lower()
        # "the key" of one game is "an American latchkey" of the next: one article for both
        return re.sub(r"\bthe (\w+)\b", lambda m: _a(m.group(1)) if m.group(1) in _SELF_KINDS else m.group(0), text)


_VOCABULARY: dict[str, list[tuple[str, str]]] = {}


def _vocabulary(family: str) -> list[tuple[str, str]]:
    """TextWorld's own names for a family's things, with their kinds (cached per process)."""
    if family in _VOCABULARY:
        return _VOCABULARY[family]
    tw = _textworld()
    names: list[tuple[str, str]] = []
    with _quiet(tw):
        if family in ("coin", "treasure"):
            from textworld.generator.text_grammar import Grammar

            # Both challenges ship copies of TextWorld's default "house" grammar, so the default
            # one serves (and skips parsing their logic files, a second of work).
            grammar = Grammar({"theme": "house"})
            for type_ in "r" if family == "coin" else "rdcskfo":
                for adj in (True, False):
                    names += [(n, _KIND_OF_TYPE[type_]) for n in grammar.get_all_names_for_type(type_, include_adj=adj)]
        elif family == "cooking":
            from textworld.challenges.tw_cooking import cooking

            names += [(n, "food") for n in cooking.FOODS]
            names += [(n, "room") for group in cooking.ROOMS for n in group]
            names += [(n, "door") for door in cooking.DOORS for n in door["names"]]
            for entity in cooking.ENTITIES.values():
                kind = _KIND_OF_TYPE.get(entity["type"], "object")
                names += [(n, kind) for n in entity["names"]]
        else:  # simple: one fixed house, whatever the seed; build it (in memory) to read it
            options = tw.GameOptions()
            options.seeds = 0
            game = tw.challenges.CHALLENGES["tw-simple"][1](settings=dict(_LEVELS["simple"][1].settings), options=options)
            names += [(info.name, _KIND_OF_TYPE.get(info.type, "object")) for info in game.infos.values()
                      if info.name and info.type not in _SKIP_TYPES]
    _VOCABULARY[family] = names
    return names


def textworld_place(observation: str) -> str:
    """Where the agent stands and what it holds: the room as described (open or closed things
    included) and the inventory. An examine, or a command that changes nothing, leaves it as it
    was; a move or a take does not ("" for text that names no room)."""
    room = _section(observation, "Room")
    return f"{room} | {_section(observation, 'Carrying')}" if room else ""


def _section(observation: str, label: str) -> str:
    m = re.search(rf"^{label}: (.*)$", observation, re.MULTILINE)
    return m.group(1).strip() if m else ""


# -- text clean-up --------------------------------------------------------------------------------

_HEADER = re.compile(r"^\s*-=\s*(.*?)\s*=-\s*")
_PROMPT = re.compile(r"\n>.*\Z", re.DOTALL)
_END_BANNER = re.compile(r"\*{3}\s*(.*?)\s*\*{3}")
_REPLAY = re.compile(r"Would you like to RESTART.*\Z", re.DOTALL)
_EPILOGUES = ("Once that's all handled, you can stop!", "And once you've done that, you win!",
              "And if you do that, you're the winner!", "That's it!", "Got that? Good!",
              "Alright, thanks!")
_PROLOGUE_TAILS = ("You do!", "Here is your task for today.", "Here is how to play!")


def _squash(text: str) -> str:
    return " ".join(text.split())


def _compact_goal(objective: str) -> str:
    """TextWorld's objective without its welcome and sign-off: only the instructions."""
    text = _squash(objective)
    at = text.rfind("TextWorld")
    if at >= 0:
        end = re.search(r"[.!?](?:\s|$)", text[at:])
        if end:
            text = text[at + end.end():].strip()
    changed = True
    while changed:
        changed = False
        for head in _PROLOGUE_TAILS:
            if text.startswith(head):
                text, changed = text[len(head):].strip(), True
        for tail in _EPILOGUES:
            if text.endswith(tail):
                text, changed = text[: -len(tail)].strip(), True
    return text


def _compact_feedback(feedback: str) -> str:
    text = _PROMPT.sub("", feedback or "")
    text = _REPLAY.sub("", text)
    text = _END_BANNER.sub(r"\1.", text)
    return _squash(text)


_OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}


def _room_name(description: str | None) -> str:
    m = _HEADER.match(description or "")
    return m.group(1).strip().lower() if m else ""


def _compact_room(description: str) -> str:
    text = (description or "").strip()
    return _squash(_HEADER.sub(lambda m: f"{m.group(1)}. ", text, count=1))


def _compact_inventory(inventory: str) -> str:
    text = _squash(inventory or "")
    text = re.sub(r"^You are carrying:?\s*", "", text)
    return text or "nothing."


_WAY = re.compile(r"\b(north|south|east|west)\b", re.IGNORECASE)


def goal_route(goal: str) -> tuple[str, ...]:
    """The directions a goal spells out, in its order: coin games write their whole route
    ("head west, then take a trip south, then ... lift the coin"); () when it names none."""
    return tuple(m.group(1).lower() for m in _WAY.finditer(goal))


def goal_object(goal: str, actions: Sequence[str]) -> str:
    """The command among ``actions`` that takes the thing ``goal`` names ("take keycard" for
    "... lift the keycard from the floor"); "" when none does. The longest name wins, so a
    "key" in reach is not taken for the goal's "keycard" (names match as whole words)."""
    named = []
    for command in actions:
        m = re.fullmatch(r"take (.+?)(?: from .+)?", command)
        if m and re.search(rf"(?<![\w-]){re.escape(m.group(1))}(?![\w-])", goal, re.IGNORECASE):
            named.append((len(m.group(1)), command))
    return max(named)[1] if named else ""


@dataclass(slots=True)
class _Route:
    """Where the agent stands on the goal's route, so the observation can name the next way.

    A goal that lists five moves asks a small model to count them: the 1.5B lost count and
    paced between two rooms on coin-2. Each room-changing move either takes the route's next
    leg or is a detour; a detour is walked back before the route goes on (in these families
    a move and its opposite join the same two rooms).
    """

    legs: tuple[str, ...]
    done: int = 0
    detour: list[str] = field(default_factory=list)

    def moved(self, way: str) -> None:
        if self.detour:
            if way == _OPPOSITE[self.detour[-1]]:
                self.detour.pop()
            else:
                self.detour.append(way)
        elif self.done < len(self.legs) and way == self.legs[self.done]:
            self.done += 1
        else:
            self.detour.append(way)

    def next(self) -> str:
        """The way the goal's route goes on from here; "" with no route or at its end."""
        if self.detour:
            return _OPPOSITE[self.detour[-1]]
        return self.legs[self.done] if self.done < len(self.legs) else ""


# -- the environment ------------------------------------------------------------------------------


class TextWorldEnv:
    """One TextWorld family at one level; ``reset(seed=s)`` plays the game generated from ``s``.

    Actions are TextWorld's admissible commands for the current state (sorted), so a small
    model is never offered a command the parser would reject.
    """

    def __init__(self, *, family: str, level: int = 1,
                 cache_dir: str | os.PathLike[str] | None = None, max_steps: int | None = None) -> None:
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
            raise ConfigError(f"max_steps must be a positive integer, got {max_steps!r}")
        _check_family(family)
        _check_level(family, level)
        _textworld()  # fail here, with the install hint, rather than at the first reset
        self.family, self.level = family, level
        self.cache_dir = textworld_cache_dir(cache_dir)
        self._spec_level = _LEVELS[family][level]
        self._lexicon = _Lexicon(family)
        steps = max_steps or self._spec_level.max_steps
        self.spec = EnvSpec(
            name=f"textworld:{family}-{level}",
            description=(
                f"A TextWorld text adventure ({family}, level {level}), generated from the episode's "
                f"seed. {_ABOUT[family]} Each turn, pick one command from the list offered "
                "(e.g. 'go east', 'open box', 'take key from box'). Rewards: -0.01 a step; the "
                "game's points add up to +1 over a whole game; winning adds +1; losing gives -1 "
                f"and ends the game. At most {steps} steps."
            ),
            max_steps=steps,
            tau=_TAU,
            theta=_THETA,
            success_return=_SUCCESS,
            major_failure_return=_MAJOR,
            situation=self._lexicon.situation,
            abstract=self._lexicon.abstract,
            instance_terms=self._lexicon.instance_terms,
            place=textworld_place,
        )
        self._env: Any = None
        self._state: Any = None
        self._game_path: Path | None = None
        self._walkthrough: tuple[str, ...] = ()
        self._goal = ""
        self._actions: tuple[str, ...] = ()
        self._score = 0
        self._steps = 0
        self._done = False
        self._last = "The game has just started."
        self._room = ""  # the current room's name, to notice a move
        self._back = ""  # the direction of the exit the agent came in through, if known
        self._route = _Route(())  # where the goal's spelled-out route stands

    @property
    def game_path(self) -> Path | None:
        """The ``.z8`` file of the game being played (None before the first reset)."""
        return self._game_path

    @property
    def walkthrough(self) -> tuple[str, ...]:
        """The commands TextWorld's generator wrote down as a solution of this game."""
        return self._walkthrough

    def reset(self, *, seed: int) -> str:
        path = game_file(self.family, self.level, seed, cache_dir=self.cache_dir)
        tw = _textworld()
        with path.with_suffix(".json").open(encoding="utf-8") as f:
            data = json.load(f)
        self._lexicon.add_game((info.get("name"), info.get("type")) for _, info in data.get("infos", []))
        self._walkthrough = tuple(data.get("metadata", {}).get("walkthrough") or ())
        self.close()
        infos = tw.EnvInfos(description=True, inventory=True, objective=True, admissible_commands=True,
                            score=True, max_score=True, won=True, lost=True, policy_commands=True)
        try:
            with _quiet(tw):
                self._env = tw.start(str(path), request_infos=infos)
                self._state = self._env.reset()
        except Exception as exc:
            self.close()
            raise EnvError(f"TextWorld could not start {path}: {type(exc).__name__}: {exc}") from exc
        self._game_path = path
        self._goal = _compact_goal(self._state["objective"] or "")
        self._score, self._steps, self._done = int(self._state["score"] or 0), 0, False
        self._last = "The game has just started."
        self._room, self._back = _room_name(self._state["description"]), ""
        self._route = _Route(goal_route(self._goal))
        self._actions = self._admissible()
        return self._observe()

    def _admissible(self) -> tuple[str, ...]:
        commands = self._state["admissible_commands"] or []
        return tuple(sorted({c for c in commands if c.split()[0] not in _META}))

    def valid_actions(self) -> Sequence[str]:
        if self._env is None:
            raise UserError(f"{self.spec.name}: call reset(seed=...) before valid_actions()")
        return self._actions

    def step(self, action: str) -> StepResult:
        if self._env is None:
            raise UserError(f"{self.spec.name}: call reset(seed=...) before step()")
        if self._done:
            raise UserError(f"{self.spec.name}: the episode is over; call reset(seed=...) first")
        command = check_action(action, valid=self._actions, env=self.spec.name)
        self._steps += 1
        try:
            with _quiet(_textworld()):
                state, score, done = self._env.step(command)
        except Exception as exc:
            raise EnvError(f"TextWorld failed on {command!r}: {type(exc).__name__}: {exc}") from exc
        self._state = state
        max_score = max(int(state["max_score"] or 0), 1)
        won, lost = bool(state["won"]), bool(state["lost"])
        reward = _STEP_COST
        if lost:
            reward += _LOSS - self._score / max_score
            event = "lost"
        else:
            reward += max(0, int(score) - self._score) / max_score
            event = "progress" if score > self._score else "step"
            if won:
                reward += _WIN
                event = "won"
        self._score = int(score)
        done = bool(done or won or lost)
        if not done and self._steps >= self.spec.max_steps:
            done, event = True, "turn_limit"
        self._done = done
        said = _compact_feedback(state.feedback)
        if _HEADER.match(said):  # a move or a look: the feedback is the room's description
            said = "you are in the room described below."
        self._last = f"{command} -> {said or 'nothing happens.'}"
        if event == "turn_limit":
            self._last += f" The step limit ({self.spec.max_steps}) is reached."
        room = _room_name(state["description"])
        if room != self._room:
            # the exit back is the one opposite the move that came in; any other way of
            # arriving (none in these families) leaves it unknown
            way = command.split()[-1] if command.startswith("go ") else ""
            self._room, self._back = room, _OPPOSITE.get(way, "")
            if way in _OPPOSITE:
                self._route.moved(way)
        self._actions = () if done else self._admissible()
        info = {"event": event, "step": self._steps, "score": self._score, "max_score": max_score,
                "won": won, "lost": lost, "game": str(self._game_path)}
        return StepResult(self._observe(), round(reward, 6), done, info)

    def oracle_action(self) -> str:
        """The first command of TextWorld's plan from the current state (for tests and demos)."""
        if self._env is None or self._done:
            raise UserError(f"{self.spec.name}: no game in progress; call reset(seed=...) first")
        plan = self._state["policy_commands"] or []
        for command in plan[:1]:
            if command in self._actions:
                return command
        raise UserError(f"{self.spec.name}: TextWorld has no plan from this state")

    def close(self) -> None:
        if self._env is not None:
            env, self._env = self._env, None
            with _quiet(_textworld()):
                env.close()

    def _observe(self) -> str:
        head = f"Step {self._steps} of {self.spec.max_steps}."
        if self._done:
            head += " The game is over."
        lines = [f"Goal: {self._goal or 'not given; look around for clues.'}", head, f"Last: {self._last}"]
        room = _compact_room(self._state["description"]) if self._state is not None else ""
        if room:
            lines.append(f"Room: {room}")
            if self._back:
                lines.append(f"Came in from: {self._back}")
            if not self._done and (way := self._route.next()):
                lines.append(f"Goal's way from here: {way}")
            if not self._done and (take := goal_object(self._goal, self._actions)):
                lines.append(f"Goal's object here: {take}")
        inventory = self._state["inventory"] if self._state is not None else ""
        if inventory:
            lines.append(f"Carrying: {_compact_inventory(inventory)}")
        return "\n".join(lines)


def make_textworld(name: str, **kwargs: Any) -> TextWorldEnv:
    """Build ``<family>-<level>`` (e.g. ``"coin-1"``); ``cache_dir`` and ``max_steps`` may be passed."""
    family, level = _parse_name(name)
    unknown = set(kwargs) - {"cache_dir", "max_steps"}
    if unknown:
        raise ConfigError(f"textworld:{name} takes only cache_dir and max_steps, got: {', '.join(sorted(unknown))}")
    return TextWorldEnv(family=family, level=level, **kwargs)
