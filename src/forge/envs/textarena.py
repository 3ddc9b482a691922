"""Adapters over real single-player TextArena games with a small, enumerable action set.

TextArena games read free text and pick out a bracketed move (``[A C]``, ``[7]``); here the
agent picks one short string from :meth:`valid_actions` and the adapter writes the bracketed
move, so a small model can be constrained to a legal-looking choice. Observations are rebuilt
from the game state each step (TextArena's own are an append-only chat log).

Shaping, the same for every game here (tau = -0.5, theta = 1.0, success >= 1.0, major
failure <= -1.0):

* a move the game rejects (TextArena's invalid move) -> -1 and the episode ends; TextArena
  would grant one retry, but FORGE aborts below tau anyway, so the episode says so;
* GuessTheNumber only: a guess the earlier hints already rule out -> -1 and the end (a real
  reasoning mistake that TextArena does not flag);
* solving the game -> +1; any other move -> 0; at the turn limit TextArena's partial credit
  (0..1, e.g. the share of disks already in place) is the last step's reward.

Seeding: TextArena seeds Python's global ``random`` in ``reset(seed=...)``; GuessTheNumber draws
its secret from it, so the same seed gives the same number.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from forge.envs.base import EnvSpec, StepResult, check_action
from forge.errors import ConfigError, UserError

__all__ = ["GuessTheNumberEnv", "TowerOfHanoiEnv", "make_textarena", "textarena_games"]

_TAU, _THETA, _SUCCESS, _MAJOR = -0.5, 1.0, 1.0, -1.0


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ConfigError(
            "textarena is not installed; install it with: pip install 'forge-memory[envs]'"
        ) from exc
    return textarena


def _make(game_id: str) -> Any:
    # "-raw": no TextArena wrappers; this adapter renders its own observation.
    return _textarena().make(f"{game_id}-raw")


class _TextArenaGame:
    """Reset/step bookkeeping shared by the games; subclasses render state and moves."""

    spec: EnvSpec

    def __init__(self, *, game_id: str, spec: EnvSpec) -> None:
        self.game_id = game_id
        self.spec = spec
        self._env = _make(game_id)
        self._started = False
        self._done = False
        self._steps = 0
        self._last = "The game has just started."

    @property
    def unwrapped(self) -> Any:
        """The TextArena env (for oracles and tests, not for agents)."""
        return self._env

    def reset(self, *, seed: int) -> str:
        self._env.reset(num_players=1, seed=seed)
        self._env.get_observation()  # drain the prompt; our description replaces it
        self._started, self._done, self._steps = True, False, 0
        self._last = "The game has just started."
        return self._observe()

    def valid_actions(self) -> Sequence[str]:
        return self._actions()

    def step(self, action: str) -> StepResult:
        if not self._started:
            raise UserError(f"{self.spec.name}: call reset(seed=...) before step()")
        if self._done:
            raise UserError(f"{self.spec.name}: the episode is over; call reset(seed=...) first")
        name = check_action(action, valid=self._actions(), env=self.spec.name)
        self._steps += 1
        mistake = self._mistake(name)
        why_invalid = self._rule_broken(name)
        state = self._env.state
        self._env.step(self._move(name))
        _, messages = self._env.get_observation()
        said = [m for _, m, kind in messages if kind.name not in ("PLAYER_ACTION", "GAME_BOARD")]
        game = state.game_info[0]
        invalid = state.error_count > 0 or bool(game.get("invalid_move"))
        if invalid:
            reward, done, event = -1.0, True, "invalid_move"
            said = [f"Invalid move: {why_invalid or ' '.join(said)} The game is over (reward -1)."]
        elif mistake:
            reward, done, event = -1.0, True, "mistake"
            said.append(mistake)
        elif state.done:
            reward = float((state.rewards or {}).get(0, 0.0))
            done, event = True, "solved" if reward >= _SUCCESS else "turn_limit"
            if game.get("reason"):
                said.append(str(game["reason"]))
        else:
            reward, done, event = 0.0, False, "move"
        self._done = done
        self._last = f"you chose {name}. " + " ".join(s.strip() for s in said if s.strip())
        info = {"event": event, "step": self._steps, "game_id": self.game_id}
        return StepResult(self._observe(), reward, done, info)

    def close(self) -> None:
        if self._started:  # TextArena's close() reads the state that only reset() creates
            self._env.close()

    def _observe(self) -> str:
        head = f"Move {self._steps} of {self.spec.max_steps}."
        if self._done:
            head += " The game is over."
        return f"{head}\n{self._describe()}\nLast step: {self._last}"

    # subclass hooks
    def _actions(self) -> Sequence[str]:
        raise NotImplementedError

    def _move(self, action: str) -> str:
        raise NotImplementedError

    def _describe(self) -> str:
        raise NotImplementedError

    def _mistake(self, action: str) -> str | None:
        """A reason when ``action`` is a mistake the game itself would not reject."""
        return None

    def _rule_broken(self, action: str) -> str | None:
        """Why the game will reject ``action``, in words; the game's verdict still decides."""
        return None


class TowerOfHanoiEnv(_TextArenaGame):
    """TextArena Tower of Hanoi: move every disk from tower A to tower C.

    Actions are ``"A to C"`` and the like (six in all). Moving from an empty tower or putting a
    bigger disk on a smaller one is an invalid move: -1, episode over. Solving gives +1.
    """

    _ACTIONS = tuple(f"{a} to {b}" for a in "ABC" for b in "ABC" if a != b)

    def __init__(self, *, game_id: str = "TowerOfHanoi-v0") -> None:
        env_kwargs = _registered_kwargs(game_id)
        disks, turns = int(env_kwargs["num_disks"]), int(env_kwargs["max_turns"])
        spec = EnvSpec(
            name=f"textarena:{game_id}",
            description=(
                f"Tower of Hanoi with {disks} disks (disk 1 is the smallest). Move all disks "
                "from tower A to tower C, one top disk at a time. Never put a bigger disk on a "
                "smaller one and never move from an empty tower: either is an invalid move "
                "that ends the game (reward -1). Solving it gives +1. Actions look like "
                f"'A to C' (from tower A to tower C). The best solution takes {2**disks - 1} "
                "moves."
            ),
            max_steps=turns,
            tau=_TAU,
            theta=_THETA,
            success_return=_SUCCESS,
            major_failure_return=_MAJOR,
            situation=hanoi_situation,
        )
        super().__init__(game_id=game_id, spec=spec)
        self.num_disks = disks

    def _towers(self) -> dict[str, list[int]]:
        return self._env.state.game_state["towers"]

    def _actions(self) -> Sequence[str]:
        return self._ACTIONS

    def _move(self, action: str) -> str:
        return f"[{action[0]} {action[-1]}]"

    def _rule_broken(self, action: str) -> str | None:
        towers = self._towers()
        src, dst = towers[action[0]], towers[action[-1]]
        if not src:
            return f"tower {action[0]} is empty, there is no disk to move."
        if dst and dst[-1] < src[-1]:
            return f"disk {src[-1]} cannot go on the smaller disk {dst[-1]} on tower {action[-1]}."
        return None

    def _describe(self) -> str:
        towers = self._towers()
        lines = ["Towers, listed bottom to top (a bigger number is a bigger disk):"]
        for name, disks in towers.items():
            top = f" (top disk: {disks[-1]})" if disks else ""
            lines.append(f"  {name}: {' '.join(map(str, disks)) or 'empty'}{top}")
        goal = " ".join(str(d) for d in range(self.num_disks, 0, -1))
        lines.append(f"Goal: C holds {goal}.")
        return "\n".join(lines)

    def oracle_action(self) -> str:
        """First move of a shortest solution from the current towers (breadth-first search)."""
        start = tuple(tuple(d) for d in self._towers().values())
        goal = ((), (), tuple(range(self.num_disks, 0, -1)))
        first: dict[tuple[tuple[int, ...], ...], str | None] = {start: None}
        queue = deque([start])
        while queue:
            towers = queue.popleft()
            if towers == goal:
                break
            for action in self._ACTIONS:
                a, b = "ABC".index(action[0]), "ABC".index(action[-1])
                if not towers[a] or (towers[b] and towers[b][-1] < towers[a][-1]):
                    continue
                nxt = list(towers)
                nxt[b] = towers[b] + (towers[a][-1],)
                nxt[a] = towers[a][:-1]
                key = tuple(nxt)
                if key not in first:
                    first[key] = first[towers] or action
                    queue.append(key)
        move = first.get(goal)
        if move is None:
            raise UserError(f"{self.spec.name}: already solved; nothing to do")
        return move


_TOWER_LINE = re.compile(r"^\s*([A-C]): (.+?)(?: \(top disk: \d+\))?\s*$", re.MULTILINE)
_HINT_RANGE = re.compile(r"Given the hints it is between (\d+) and (\d+)")


def hanoi_situation(observation: str) -> str:
    """The towers, e.g. "towers A: 3 2, B: empty, C: 1": what a Hanoi rule's "when" names.

    The generic summary named the move counter ("when move 2 of 14"), so rules learned from
    different positions at the same move overwrote each other.
    """
    towers = _TOWER_LINE.findall(observation)
    return "towers " + ", ".join(f"{name}: {disks}" for name, disks in towers) if towers else ""


def guess_situation(observation: str) -> str:
    """What the hints still allow, e.g. "the number is between 6 and 12"."""
    m = _HINT_RANGE.search(observation)
    return f"the number is between {m.group(1)} and {m.group(2)}" if m else ""


class GuessTheNumberEnv(_TextArenaGame):
    """TextArena Guess The Number: find the secret number from higher/lower hints.

    Actions are the numbers in range as strings. Guessing a number twice (TextArena rejects it)
    or guessing a number the hints already rule out is a mistake: -1, episode over.
    """

    def __init__(self, *, game_id: str = "GuessTheNumber-v0") -> None:
        kw = _registered_kwargs(game_id)
        self.low, self.high = int(kw["min_number"]), int(kw["max_number"])
        spec = EnvSpec(
            name=f"textarena:{game_id}",
            description=(
                f"Guess the secret number between {self.low} and {self.high}. After each wrong "
                "guess you are told whether the number is higher or lower. Guessing a number "
                "twice, or a number the hints already rule out, ends the game (reward -1); "
                "guessing right gives +1. Halve the remaining range each time. Actions are the "
                "numbers themselves, e.g. '7'."
            ),
            max_steps=int(kw["max_turns"]),
            tau=_TAU,
            theta=_THETA,
            success_return=_SUCCESS,
            major_failure_return=_MAJOR,
            situation=guess_situation,
        )
        super().__init__(game_id=game_id, spec=spec)
        self._numbers = tuple(str(n) for n in range(self.low, self.high + 1))

    def _history(self) -> list[tuple[int, str]]:
        return list(self._env.state.game_state["guess_history"])

    def _bounds(self) -> tuple[int, int]:
        low, high = self.low, self.high
        for guess, hint in self._history():
            if hint == "higher":
                low = max(low, guess + 1)
            else:
                high = min(high, guess - 1)
        return low, high

    def _actions(self) -> Sequence[str]:
        return self._numbers

    def _move(self, action: str) -> str:
        return f"[{action}]"

    def _mistake(self, action: str) -> str | None:
        low, high = self._bounds()
        guess = int(action)
        if guess in {g for g, _ in self._history()}:
            return None  # TextArena rejects repeats itself
        if not low <= guess <= high:
            return f"Mistake: the hints already said the number is between {low} and {high}."
        return None

    def _rule_broken(self, action: str) -> str | None:
        if int(action) in {g for g, _ in self._history()}:
            return f"{action} was already guessed."
        return None

    def _describe(self) -> str:
        history = self._history()
        low, high = self._bounds()
        left = self.spec.max_steps - self._steps
        said = ", ".join(f"{g} ({'higher' if h == 'higher' else 'lower'})" for g, h in history)
        return (
            f"The secret number is between {self.low} and {self.high}. "
            f"Guesses so far: {said or 'none'}. "
            f"Given the hints it is between {low} and {high}. Guesses left: {left}."
        )

    def oracle_action(self) -> str:
        """Bisect what the hints still allow (at most log2(range) + 1 guesses)."""
        low, high = self._bounds()
        return str((low + high) // 2)


_GAMES: dict[str, Callable[..., _TextArenaGame]] = {
    "TowerOfHanoi-v0": TowerOfHanoiEnv,
    "TowerOfHanoi-v0-medium": TowerOfHanoiEnv,
    "TowerOfHanoi-v0-hard": TowerOfHanoiEnv,
    "GuessTheNumber-v0": GuessTheNumberEnv,
    "GuessTheNumber-v0-hardcore": GuessTheNumberEnv,
}


def textarena_games() -> list[str]:
    """The TextArena game ids this module adapts (each has a finite action set)."""
    return list(_GAMES)


def _registered_kwargs(game_id: str) -> dict[str, Any]:
    registry = _textarena().envs.registration.ENV_REGISTRY
    if game_id not in registry:
        raise ConfigError(f"TextArena has no game {game_id!r}")
    return dict(registry[game_id].kwargs)


def make_textarena(game_id: str) -> _TextArenaGame:
    """Build the adapter for ``game_id``; unknown or unsupported ids raise ConfigError."""
    try:
        cls = _GAMES[game_id]
    except KeyError:
        raise ConfigError(
            f"unsupported TextArena game {game_id!r}; supported: {', '.join(_GAMES)}"
        ) from None
    return cls(game_id=game_id)
