"""Text adapters over the real gymnasium toy-text environments.

Each adapter drives the genuine ``gymnasium.make(...)`` environment and only translates: the
discrete state becomes a self-contained paragraph (position, map, neighbours, what the last step
did), action strings become action ids, and rewards are shaped so that a real mistake scores
below the env's ``tau`` while an ordinary step does not. That last property is what FORGE needs:
an attempt is aborted on the first step below ``tau`` and the failure is reflected on.

Thresholds per family (return = sum of step rewards):

============================  =====  ======  =======  =============  ==================
env                           tau    theta   success  major failure  max_steps
============================  =====  ======  =======  =============  ==================
frozenlake-4x4[-slippery]     -0.5   1.0     >= 1.0   <= -1.0        20 (slippery 40)
frozenlake-8x8[-slippery]     -0.5   1.0     >= 1.0   <= -1.0        60 (slippery 120)
frozenlake-random-NxN[-sl.]   -0.5   1.0     >= 1.0   <= -1.0        5N (slippery 10N)
cliffwalking                  -50    -20     >= -30   <= -100        60
taxi                          -5     3       >= 0     <= -10         60
============================  =====  ======  =======  =============  ==================

Seeding: ``reset(seed=s)`` passes ``s`` to the gymnasium env, which reseeds its ``np_random``;
slippery transitions and Taxi's start state therefore replay exactly for the same seed and
actions.

Random maps (``frozenlake-random-4x4``, ``-5x5``, ``-6x6``, each also ``-slippery``): the map of
an episode is gymnasium's ``generate_random_map(size, p=0.8, seed=s)`` for its seed ``s`` and
nothing else, so ``reset(seed=s)`` plays the same solvable map on every machine, and another
seed is another map: a task the agent never saw, to test whether what it learned transfers.
Learning runs train on :func:`train_seeds` and are judged on :func:`held_out_seeds`, whose
maps are none of the training maps (on 4x4, 30 of seeds 10,000-10,099 draw a map that one of
seeds 0-99 also draws, so plain seed ranges would leak training maps into the test).

What a FrozenLake rule's "when" names (``spec.situation``): what lies in each direction, where
the goal lies relative to the agent and how far, and whether it is on the start tile, e.g.
``on a frozen tile; left: frozen; down: hole; right: frozen; up: edge; goal: down-right at
distance 4``. Never a row or column: a rule learned at "row 1, col 0" of one map means nothing
on the next, while "down: hole" means the same everywhere. The distance (steps, ignoring holes)
makes every move change the situation, so a bump into an edge still reads as one. The
observation itself keeps its coordinates and map for the model.
"""

from __future__ import annotations

import functools
import re
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any

from forge.envs.base import EnvSpec, StepResult, check_action
from forge.envs.situation import summarize_observation
from forge.errors import ConfigError, UserError

__all__ = [
    "HELD_OUT_FIRST_SEED",
    "RANDOM_SIZES",
    "TRAIN_FIRST_SEED",
    "CliffWalkingEnv",
    "FrozenLakeEnv",
    "TaxiEnv",
    "frozenlake_abstract",
    "frozenlake_instance_terms",
    "frozenlake_place",
    "frozenlake_situation",
    "held_out_seeds",
    "oracle_action",
    "random_map",
    "train_seeds",
]

_MOVES = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}


def _make(gym_id: str, *, max_steps: int, **kwargs: Any) -> Any:
    try:
        import gymnasium
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(
            "gymnasium is not installed; install it with: pip install 'forge-memory[envs]'"
        ) from exc
    # The passive checker only warns about API misuse we do not commit; it would also turn
    # into errors under filterwarnings=error.
    return gymnasium.make(gym_id, max_episode_steps=max_steps, disable_env_checker=True, **kwargs)


def _rc(row: int, col: int) -> str:
    return f"row {row}, col {col}"


# -- random maps and their seed splits ----------------------------------------------------------

#: Map sizes with a registered ``frozenlake-random-NxN`` env.
RANDOM_SIZES = (4, 5, 6)
#: Where the training seeds and the held-out seeds of random maps start.
TRAIN_FIRST_SEED = 0
HELD_OUT_FIRST_SEED = 10_000
_FROZEN_P = 0.8  # gymnasium's default share of frozen tiles


@functools.lru_cache(maxsize=4096)
def _random_map(size: int, seed: int, p: float) -> tuple[str, ...]:
    try:
        from gymnasium.envs.toy_text.frozen_lake import generate_random_map
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(
            "gymnasium is not installed; install it with: pip install 'forge-memory[envs]'"
        ) from exc
    return tuple(generate_random_map(size=size, p=p, seed=seed))


def random_map(size: int, seed: int, *, p: float = _FROZEN_P) -> list[str]:
    """The map episode ``seed`` plays on a random ``size`` x ``size`` lake (rows of S/F/H/G).

    gymnasium's generator: S top-left, G bottom-right, each other tile frozen with probability
    ``p``, redrawn until a path joins them. A function of its arguments only.
    """
    if not 3 <= size <= 12:
        raise ConfigError(f"a random FrozenLake map is 3x3 to 12x12, got {size}x{size}")
    return list(_random_map(size, int(seed), float(p)))


def _first_map(size: int) -> list[str]:
    """The map a random-map env holds before its first reset (it plays none)."""
    return random_map(size, TRAIN_FIRST_SEED)


def _distinct_seeds(size: int, start: int, n: int, taken: frozenset[tuple[str, ...]]) -> tuple[int, ...]:
    out: list[int] = []
    seen = set(taken)
    seed = start
    while len(out) < n:
        board = _random_map(size, seed, _FROZEN_P)
        if board not in seen:
            seen.add(board)
            out.append(seed)
        seed += 1
    return tuple(out)


@functools.cache
def train_seeds(size: int, n: int = 100) -> tuple[int, ...]:
    """The seeds a learning run on ``frozenlake-random-NxN`` may train on: the first ``n``
    seeds from :data:`TRAIN_FIRST_SEED` that draw a map no earlier one drew."""
    random_map(size, TRAIN_FIRST_SEED)  # checks the size
    return _distinct_seeds(size, TRAIN_FIRST_SEED, n, frozenset())


@functools.cache
def held_out_seeds(size: int, n: int = 100) -> tuple[int, ...]:
    """The seeds learning is judged on: the first ``n`` from :data:`HELD_OUT_FIRST_SEED` whose
    maps are new, and none of the maps of ``train_seeds(size)`` (100 of them, whatever ``n``)."""
    trained = frozenset(_random_map(size, s, _FROZEN_P) for s in train_seeds(size))
    return _distinct_seeds(size, HELD_OUT_FIRST_SEED, n, trained)


# -- what a FrozenLake rule names ---------------------------------------------------------------

_AT = re.compile(r"You are at row (\d+), col (\d+)")
_GOAL_AT = re.compile(r"The goal is at row (\d+), col (\d+)")
_ON_TILE = re.compile(r"You are at [^\n]*?, on an? (start|frozen|HOLE|GOAL)\b")
_NEXT_TO = re.compile(r"^Next to you: (.*?)\.?\s*$", re.M)
_NEAR_WORDS = {"start": "frozen", "frozen": "frozen", "hole": "hole", "goal": "goal", "edge": "edge"}
_HERE = {
    "start": "on the start tile",
    "frozen": "on a frozen tile",
    "HOLE": "in a hole",
    "GOAL": "on the goal",
}

# Absolute coordinates as an agent or a model writes them: "row 2, col 0", "(2, 0)",
# "at 2,0", "row 2", "column 3", "state 14", and a seed.
_PAIR = r"rows?\s+\d+\s*(?:,|and)?\s*(?:col(?:umn)?s?)\s+\d+"
_COORD = re.compile(
    rf"\b{_PAIR}\b|\(\s*\d+\s*,\s*\d+\s*\)|\bat\s+\d+\s*,\s*\d+\b"
    r"|\b(?:row|col|column)\s+\d+\b|\b(?:state|tile|cell|square|position)\s+#?\d+\b"
    r"|\bseed\s*[=:]?\s*\d+\b",
    re.IGNORECASE,
)
_LEAD_IN = re.compile(
    r"\s*\b(?:at|in|on|from|to|into|of|near)\s+(?:the\s+)?(?:tile|square|cell|position)?\s*(?=\(|row|col|\d)",
    re.IGNORECASE,
)
_RANGES = re.compile(r"\s*\((?:[^()]*\b(?:rows?|cols?)\s+\d+\s*-\s*\d+[^()]*)\)", re.IGNORECASE)


def _goal_words(dr: int, dc: int) -> str:
    way = "-".join(w for w in ("down" if dr > 0 else "up" if dr < 0 else "", "right" if dc > 0 else "left" if dc < 0 else "") if w)
    return f"{way} at distance {abs(dr) + abs(dc)}" if way else "here"


def frozenlake_situation(observation: str) -> str:
    """A FrozenLake observation as what transfers to another map: the tile the agent is on
    (start or frozen), what lies in each direction (frozen, hole, goal, edge), and the goal's
    direction and distance, e.g. ``on a frozen tile; left: frozen; down: hole; right: frozen;
    up: edge; goal: down-right at distance 4``. No row or column.

    A pure function of the text (reflection calls it on recorded observations); text that is
    not a FrozenLake observation gets the generic summary, its coordinates taken out.
    """
    at, goal = _AT.search(observation), _GOAL_AT.search(observation)
    tile, near = _ON_TILE.search(observation), _NEXT_TO.search(observation)
    if not (at and goal and tile and near):
        return frozenlake_abstract(summarize_observation(observation))
    parts = [_HERE[tile.group(1)]]
    for item in near.group(1).split("; "):
        way, _, what = item.partition(": ")
        word = what.split(" ", 1)[0].strip("(),").lower()
        parts.append(f"{way}: {_NEAR_WORDS.get(word, word)}")
    (r, c), (gr, gc) = (map(int, at.groups())), (map(int, goal.groups()))
    parts.append(f"goal: {_goal_words(gr - r, gc - c)}")
    return "; ".join(parts)


def frozenlake_place(observation: str) -> str:
    """Where on this map the agent stands ("row 2, col 0"; "" for text that does not say)."""
    at = _AT.search(observation)
    return f"row {at.group(1)}, col {at.group(2)}" if at else ""


def frozenlake_instance_terms(text: str) -> list[str]:
    """The absolute coordinates (and seeds) a text names: what holds on one map only."""
    return list(dict.fromkeys(m.group(0) for m in _COORD.finditer(text)))


def frozenlake_abstract(text: str) -> str:
    """``text`` without its coordinates: nothing true on another map can replace "at row 2,
    col 0", so the phrase goes (with its "at"); where the text also says where the agent is,
    the goal's position becomes its direction and distance ("The goal is down-right at
    distance 4"). What is left names no coordinate (:func:`frozenlake_instance_terms` finds
    none)."""
    at, goal = _AT.search(text), _GOAL_AT.search(text)
    if at and goal:
        (r, c), (gr, gc) = map(int, at.groups()), map(int, goal.groups())
        text = text[: goal.start()] + f"The goal is {_goal_words(gr - r, gc - c)}" + text[goal.end() :]
    text = _RANGES.sub("", text)
    # the coordinate with the preposition that led to it, then any stray coordinate
    text = re.sub(rf"{_LEAD_IN.pattern}(?:{_COORD.pattern})", "", text, flags=re.IGNORECASE)
    text = _COORD.sub("", text)
    text = re.sub(r"\b(are|is|be|was|were)\s*,\s*", r"\1 ", text)
    text = re.sub(r"\s*,\s*(?=[,.;:])|\(\s*\)", "", text)
    text = re.sub(r"[ \t]{2,}", " ", text)
    return re.sub(r"[ \t]+([,.;:])", r"\1", text).strip()


class _ToyTextEnv:
    """Shared machinery: seeding, action checking, step counting, truncation, narration.

    Subclasses map action names to gymnasium ids (``_ACTION_IDS``, in presentation order) and
    implement :meth:`_shape` (raw reward -> FORGE reward, done, event) and :meth:`_describe`.
    """

    _ACTION_IDS: Mapping[str, int] = {}
    spec: EnvSpec

    def __init__(self, *, spec: EnvSpec, gym_id: str, gym_kwargs: Mapping[str, Any]) -> None:
        self.spec = spec
        self._env = _make(gym_id, max_steps=spec.max_steps, **gym_kwargs)
        self._actions = tuple(self._ACTION_IDS)
        self._state: int | None = None
        self._steps = 0
        self._done = False
        self._last = "The episode has just started."
        self._event = "start"

    @property
    def unwrapped(self) -> Any:
        """The underlying gymnasium env (for oracles and tests, not for agents)."""
        return self._env.unwrapped

    @property
    def state(self) -> int:
        if self._state is None:
            raise UserError(f"{self.spec.name}: call reset(seed=...) before using the env")
        return self._state

    def reset(self, *, seed: int) -> str:
        state, _ = self._env.reset(seed=seed)
        self._state = int(state)
        self._steps = 0
        self._done = False
        self._last = "The episode has just started."
        self._event = "start"
        return self._observe()

    def valid_actions(self) -> Sequence[str]:
        return self._actions

    def step(self, action: str) -> StepResult:
        prev = self.state
        if self._done:
            raise UserError(f"{self.spec.name}: the episode is over; call reset(seed=...) first")
        name = check_action(action, valid=self._actions, env=self.spec.name)
        state, raw, terminated, truncated, _ = self._env.step(self._ACTION_IDS[name])
        self._state = int(state)
        self._steps += 1
        reward, done, event = self._shape(prev, name, self._state, float(raw), bool(terminated))
        truncated = not done and (bool(truncated) or self._steps >= self.spec.max_steps)
        self._done = done or truncated
        self._event = event
        self._last = self._narrate(prev, name, self._state, event)
        if truncated:
            self._last += f" The step limit ({self.spec.max_steps}) is reached: episode over."
        info = {
            "event": event,
            "raw_reward": float(raw),
            "truncated": truncated,
            "step": self._steps,
            "state": self._state,
        }
        return StepResult(self._observe(), reward, self._done, info)

    def close(self) -> None:
        self._env.close()

    def oracle_action(self) -> str:
        """Next action of a shortest safe path to success (deterministic envs only)."""
        return oracle_action(self)

    def _observe(self) -> str:
        head = f"Step {self._steps} of {self.spec.max_steps}."
        if self._done:
            head += " The episode is over."
        return f"{head}\n{self._describe(self.state)}\nLast step: {self._last}"

    # subclass hooks
    def _shape(
        self, prev: int, action: str, state: int, raw: float, terminated: bool
    ) -> tuple[float, bool, str]:
        raise NotImplementedError

    def _describe(self, state: int) -> str:
        raise NotImplementedError

    def _narrate(self, prev: int, action: str, state: int, event: str) -> str:
        raise NotImplementedError


class _GridEnv(_ToyTextEnv):
    """A single walker on a rectangular grid (FrozenLake, CliffWalking)."""

    _TILE_NAMES: Mapping[str, str] = {}

    def _grid(self) -> list[str]:
        raise NotImplementedError

    def _pos(self, state: int) -> tuple[int, int]:
        ncol = len(self._grid()[0])
        return divmod(state, ncol)

    def _neighbours(self, row: int, col: int) -> str:
        grid = self._grid()
        parts = []
        for name, (dr, dc) in _MOVES.items():
            r, c = row + dr, col + dc
            if 0 <= r < len(grid) and 0 <= c < len(grid[0]):
                parts.append(f"{name}: {self._TILE_NAMES[grid[r][c]]}")
            else:
                parts.append(f"{name}: edge (you would stay where you are)")
        return "; ".join(parts)

    def _map(self, state: int) -> str:
        row, col = self._pos(state)
        lines = []
        for r, line in enumerate(self._grid()):
            cells = ["Y" if (r, c) == (row, col) else ch for c, ch in enumerate(line)]
            lines.append(" ".join(cells))
        return "\n".join(lines)

    def _moved(self, prev: int, action: str, state: int) -> str:
        (pr, pc), here = self._pos(prev), self._pos(state)
        dr, dc = _MOVES[action]
        grid = self._grid()
        target = (min(max(pr + dr, 0), len(grid) - 1), min(max(pc + dc, 0), len(grid[0]) - 1))
        if here != target:
            return (
                f"you chose {action} but slipped on the ice and went from {_rc(pr, pc)} "
                f"to {_rc(*here)}."
            )
        if here == (pr, pc):
            return f"you chose {action} and stayed at {_rc(pr, pc)}: the edge blocks that way."
        return f"you chose {action} and moved from {_rc(pr, pc)} to {_rc(*here)}."


class FrozenLakeEnv(_GridEnv):
    """FrozenLake-v1 (the fixed 4x4 or 8x8 map, or a random map per seed) as text.

    Rewards come from the real env with ``reward_schedule=(1, -1, 0)``: +1 on reaching the
    goal, -1 on falling into a hole (ends the episode), 0 for any other step. With tau = -0.5
    only a hole is below tau. Return 1.0 is a success, -1.0 a major failure; running out of
    steps returns 0 (neither). When slippery the ice moves you in the chosen direction only
    1/3 of the time and to one of the two perpendicular directions otherwise.

    ``random_map=True`` plays :func:`random_map` of the episode's seed (any size 3-12): the
    real gymnasium env is rebuilt on that map at each reset whose seed draws another one.
    """

    _ACTION_IDS = {"left": 0, "down": 1, "right": 2, "up": 3}
    _TILE_NAMES = {
        "S": "start (frozen, safe)",
        "F": "frozen (safe)",
        "H": "HOLE (falling in ends the episode)",
        "G": "GOAL",
    }

    def __init__(
        self,
        *,
        size: int = 4,
        slippery: bool = False,
        max_steps: int | None = None,
        random_map: bool = False,
    ) -> None:
        if random_map:
            board = _first_map(size)
            name = f"frozenlake-random-{size}x{size}"
            steps = 5 * size * (2 if slippery else 1)
            where = (
                "The map is new in every episode (drawn from the episode's seed): read what "
                "lies next to you instead of remembering where the holes were. "
            )
        elif size in (4, 8):
            board = None
            name = f"frozenlake-{size}x{size}"
            steps = {(4, False): 20, (4, True): 40, (8, False): 60, (8, True): 120}[(size, slippery)]
            where = ""
        else:
            raise ConfigError(f"FrozenLake size must be 4 or 8 (any of 3-12 with a random map), got {size}")
        name += "-slippery" if slippery else ""
        slip = (
            " The ice is slippery: you move in the chosen direction only 1/3 of the time, "
            "otherwise to one of the two perpendicular directions, so keep away from holes."
            if slippery
            else " The ice is not slippery: you always move in the chosen direction."
        )
        spec = EnvSpec(
            name=name,
            description=(
                f"You walk on a {size}x{size} frozen lake from the start S (top-left) to the "
                "goal G (bottom-right). Tiles: F frozen (safe), H hole. Falling into a hole "
                "ends the episode in failure (reward -1); reaching the goal wins (reward +1). "
                + where
                + "Actions: left, down, right, up move one tile; row 0 is the top row and col 0 "
                "the left column; moving into the edge leaves you in place." + slip
            ),
            max_steps=max_steps or steps,
            tau=-0.5,
            theta=1.0,
            success_return=1.0,
            major_failure_return=-1.0,
            situation=frozenlake_situation,
            abstract=frozenlake_abstract,
            instance_terms=frozenlake_instance_terms,
            place=frozenlake_place,
        )
        self.size = size
        self.slippery = slippery
        self.random_map = random_map
        self._gym_kwargs: dict[str, Any] = {"is_slippery": slippery, "reward_schedule": (1, -1, 0)}
        where_kw = {"desc": board} if board is not None else {"map_name": f"{size}x{size}"}
        super().__init__(spec=spec, gym_id="FrozenLake-v1", gym_kwargs={**where_kw, **self._gym_kwargs})
        self._rows = [bytes(r).decode() for r in self.unwrapped.desc]

    def reset(self, *, seed: int) -> str:
        if self.random_map:
            board = random_map(self.size, seed)
            if board != self._rows:
                self._env.close()
                self._env = _make("FrozenLake-v1", max_steps=self.spec.max_steps, desc=board, **self._gym_kwargs)
                self._rows = board
        return super().reset(seed=seed)

    def _grid(self) -> list[str]:
        return self._rows

    def _tile(self, state: int) -> str:
        row, col = self._pos(state)
        return self._rows[row][col]

    def _shape(
        self, prev: int, action: str, state: int, raw: float, terminated: bool
    ) -> tuple[float, bool, str]:
        tile = self._tile(state)
        if tile == "H":
            return raw, True, "hole"
        if tile == "G":
            return raw, True, "goal"
        return raw, terminated, "move" if prev != state else "bump"

    def _describe(self, state: int) -> str:
        row, col = self._pos(state)
        n = len(self._rows)
        goal = next(
            (r, c) for r, line in enumerate(self._rows) for c, t in enumerate(line) if t == "G"
        )
        return (
            f"You are at {_rc(row, col)} (rows 0-{n - 1} top to bottom, cols 0-{n - 1} left "
            f"to right), on a {self._TILE_NAMES[self._rows[row][col]]} tile. "
            f"The goal is at {_rc(*goal)}.\n"
            f"Next to you: {self._neighbours(row, col)}.\n"
            f"Map (Y = you, S start, F frozen, H hole, G goal):\n{self._map(state)}"
        )

    def _narrate(self, prev: int, action: str, state: int, event: str) -> str:
        text = self._moved(prev, action, state)
        if event == "hole":
            text += " You fell into a hole: episode over (reward -1)."
        elif event == "goal":
            text += " You reached the goal: success (reward +1)."
        return text


class CliffWalkingEnv(_GridEnv):
    """CliffWalking-v1 as text: a 4x12 grid with a cliff along the bottom row.

    The real env gives -1 per step and -100 for stepping onto the cliff, after which it
    teleports you back to the start without ending the episode. This adapter keeps those
    rewards but ends the episode at the fall (event ``cliff``), since the attempt is over for
    FORGE anyway (-100 < tau = -50). Reaching the goal takes 13 steps at best (return -13),
    17 along the safe top route. Success is a return >= -30 (only a goal can get there:
    a timeout returns -60, a fall <= -100); theta = -20 asks for a near-optimal route.
    Both tighten to -(max_steps - 1) when fewer than 31 steps are allowed, or standing
    still until the step limit (-max_steps) would count as a success and graduate.
    """

    _ACTION_IDS = {"up": 0, "right": 1, "down": 2, "left": 3}
    _TILE_NAMES = {
        "S": "start (safe)",
        ".": "ground (safe)",
        "C": "CLIFF (stepping there is a fall: episode over, reward -100)",
        "G": "GOAL",
    }

    def __init__(self, *, max_steps: int | None = None) -> None:
        steps = max_steps or 60
        spec = EnvSpec(
            name="cliffwalking",
            description=(
                "You walk on a 4x12 grid (row 0 top, row 3 bottom; col 0 left, col 11 right) "
                "from the start S at row 3, col 0 to the goal G at row 3, col 11. The cliff C "
                "fills row 3 between them (cols 1-10): stepping onto it is a fall that ends the "
                "episode with reward -100. Every other step costs -1, so take a short path that "
                "never enters the cliff. Actions: up, right, down, left move one tile; moving "
                "into the edge leaves you in place."
            ),
            max_steps=steps,
            tau=-50.0,
            theta=max(-20.0, -(steps - 1.0)),
            success_return=max(-30.0, -(steps - 1.0)),  # only a goal reached before the limit
            major_failure_return=-100.0,
        )
        super().__init__(spec=spec, gym_id="CliffWalking-v1", gym_kwargs={})
        cliff = self.unwrapped._cliff
        nrow, ncol = cliff.shape
        self._rows = [
            "".join("C" if cliff[r, c] else "." for c in range(ncol)) for r in range(nrow)
        ]
        start, goal = (nrow - 1, 0), (nrow - 1, ncol - 1)
        for (r, c), ch in ((start, "S"), (goal, "G")):
            self._rows[r] = self._rows[r][:c] + ch + self._rows[r][c + 1 :]
        self._fell_at: tuple[int, int] | None = None

    def _grid(self) -> list[str]:
        return self._rows

    def _shape(
        self, prev: int, action: str, state: int, raw: float, terminated: bool
    ) -> tuple[float, bool, str]:
        self._fell_at = None
        if raw <= -100:
            pr, pc = self._pos(prev)
            dr, dc = _MOVES[action]
            self._fell_at = (pr + dr, pc + dc)
            # The real env has already teleported us to the start; report where we fell.
            self._state = prev
            return raw, True, "cliff"
        if terminated:
            return raw, True, "goal"
        return raw, False, "move" if prev != state else "bump"

    def _describe(self, state: int) -> str:
        row, col = self._pos(state)
        return (
            f"You are at {_rc(row, col)} (rows 0-3 top to bottom, cols 0-11 left to right). "
            "The goal is at row 3, col 11; the cliff is row 3, cols 1-10.\n"
            f"Next to you: {self._neighbours(row, col)}.\n"
            f"Map (Y = you, S start, . ground, C cliff, G goal):\n{self._map(state)}"
        )

    def _narrate(self, prev: int, action: str, state: int, event: str) -> str:
        if event == "cliff" and self._fell_at is not None:
            pr, pc = self._pos(prev)
            return (
                f"you chose {action} at {_rc(pr, pc)}, stepped onto the cliff at "
                f"{_rc(*self._fell_at)} and fell: episode over (reward -100)."
            )
        text = self._moved(prev, action, state)
        if event == "goal":
            text += " You reached the goal: success."
        return text


class TaxiEnv(_ToyTextEnv):
    """Taxi-v4 as text: drive to the passenger, pick up, drive to the destination, drop off.

    Rewards are the real env's: -1 per step, +20 for delivering the passenger (ends the
    episode), -10 for an illegal pickup or dropoff. With tau = -5 only an illegal pickup or
    dropoff is below tau. A delivery within 21 steps returns >= 0 (success); theta = 3 is
    what the optimal route earns from the hardest start (measured over 300 seeds: 3 to 15). An illegal action or a timeout (-60) is a major failure (<= -10).
    """

    _ACTION_IDS = {"up": 1, "down": 0, "left": 3, "right": 2, "pickup": 4, "dropoff": 5}

    def __init__(self, *, max_steps: int | None = None) -> None:
        spec = EnvSpec(
            name="taxi",
            description=(
                "You drive a taxi on a 5x5 grid (row 0 top, col 0 left) with four stops R, G, "
                "Y, B and some walls (|) you cannot drive through. Drive to the passenger's "
                "stop, pickup, drive to the destination stop, dropoff. Each step costs -1, "
                "delivering the passenger earns +20 and ends the episode, and a pickup where "
                "the passenger is not, or a dropoff without the passenger in the taxi or away "
                "from a stop, costs -10. Actions: up, down, left, right, pickup, dropoff."
            ),
            max_steps=max_steps or 60,
            tau=-5.0,
            theta=3.0,
            success_return=0.0,
            major_failure_return=-10.0,
        )
        super().__init__(spec=spec, gym_id="Taxi-v4", gym_kwargs={})
        env = self.unwrapped
        self._desc = [bytes(r).decode() for r in env.desc]
        self._locs = [tuple(loc) for loc in env.locs]
        self._names = [self._desc[r + 1][2 * c + 1] for r, c in self._locs]

    def decode(self, state: int) -> tuple[int, int, int, int]:
        """(taxi row, taxi col, passenger index (4 = in taxi), destination index)."""
        row, col, pas, dest = self.unwrapped.decode(state)
        return int(row), int(col), int(pas), int(dest)

    def _open_moves(self, row: int, col: int) -> tuple[list[str], list[str]]:
        d = self._desc
        blocked = {
            "up": row == 0,
            "down": row == 4,
            "left": col == 0 or d[row + 1][2 * col] == "|",
            "right": col == 4 or d[row + 1][2 * col + 2] == "|",
        }
        return [m for m, b in blocked.items() if not b], [m for m, b in blocked.items() if b]

    def _stop(self, idx: int) -> str:
        return f"{self._names[idx]} ({_rc(*self._locs[idx])})"

    def _shape(
        self, prev: int, action: str, state: int, raw: float, terminated: bool
    ) -> tuple[float, bool, str]:
        if terminated:
            return raw, True, "delivered"
        if raw <= -10:
            return raw, False, f"illegal_{action}"
        if action == "pickup":
            return raw, False, "pickup"
        if action == "dropoff":
            return raw, False, "dropoff_elsewhere"
        return raw, False, "move" if self.decode(prev)[:2] != self.decode(state)[:2] else "bump"

    def _describe(self, state: int) -> str:
        row, col, pas, dest = self.decode(state)
        here = (row, col)
        lines = [
            f"The taxi is at {_rc(row, col)} (rows 0-4 top to bottom, cols 0-4 left to right)."
        ]
        if self._event == "delivered":
            lines.append("The passenger has been delivered to the destination.")
        elif pas == 4:
            lines.append("The passenger is in the taxi.")
        else:
            at_pas = " You are at the passenger's stop." if self._locs[pas] == here else ""
            lines.append(f"The passenger is waiting at stop {self._stop(pas)}.{at_pas}")
        at_dest = " You are at the destination." if self._locs[dest] == here else ""
        lines.append(f"Destination: stop {self._stop(dest)}.{at_dest}")
        open_moves, walls = self._open_moves(row, col)
        blocked = f"; blocked by a wall or the edge: {', '.join(walls)}" if walls else ""
        lines.append(f"From here you can move: {', '.join(open_moves)}{blocked}.")
        grid = [list(line) for line in self._desc]
        grid[row + 1][2 * col + 1] = "T"
        lines.append("Map (T = taxi, | = wall, R G Y B = stops):")
        lines.extend("".join(line) for line in grid)
        return "\n".join(lines)

    def _narrate(self, prev: int, action: str, state: int, event: str) -> str:
        pr, pc, _, _ = self.decode(prev)
        row, col, pas, _ = self.decode(state)
        if event == "move":
            return f"you drove {action} from {_rc(pr, pc)} to {_rc(row, col)}."
        if event == "bump":
            return f"you chose {action} but a wall or the edge kept you at {_rc(row, col)}."
        if event == "pickup":
            return "you picked the passenger up."
        if event == "illegal_pickup":
            return "pickup failed: the passenger is not at your square (reward -10)."
        if event == "illegal_dropoff":
            return (
                "dropoff failed: the passenger is not in the taxi or you are not at a stop "
                "(reward -10)."
            )
        if event == "dropoff_elsewhere":
            return f"you dropped the passenger at stop {self._stop(pas)}, not the destination."
        return "you dropped the passenger at the destination: success (reward +20)."


def oracle_action(env: _ToyTextEnv) -> str:
    """The first action of a shortest safe path to success from the env's current state.

    Breadth-first search over the real env's transition table ``P``, skipping transitions
    whose reward is below ``tau`` (holes, cliff, illegal pickups). Only defined for
    deterministic envs; it is a scripted demonstrator for tests and seeding memories.
    """
    table = env.unwrapped.P
    start = env.state
    ids = env._ACTION_IDS
    names = {v: k for k, v in ids.items()}
    queue: deque[int] = deque([start])
    first: dict[int, str | None] = {start: None}
    while queue:
        s = queue.popleft()
        for a in sorted(names):
            outcomes = table[s][a]
            if len(outcomes) != 1:
                raise UserError(f"oracle_action needs a deterministic env; {env.spec.name} is not")
            _, nxt, reward, terminated = outcomes[0]
            if reward < env.spec.tau:
                continue
            act = first[s] or names[a]
            if terminated:
                return act
            if nxt not in first:
                first[nxt] = act
                queue.append(nxt)
    raise UserError(f"no safe path to success from the current state of {env.spec.name}")
