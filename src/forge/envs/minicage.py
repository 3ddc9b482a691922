"""A stand-in with CAGE-2's shape that needs no CybORG: ``make_env("minicage")``.

CybORG installs only from git, so CI never has it, and what breaks only with CAGE-2's shape
went unseen there: its actions exist only after a reset (asking before one is an error), its
action set is large and written in the description, its host names must not reach a rule.
This game has that shape and plays in microseconds, deterministically for a seed.

The network: User0-2, Enterprise0-1 and Op_Server0. Red starts on User0 (its foothold, which
blue cannot take away) and walks a path the seed chooses, one User host, one Enterprise host,
then Op_Server0: on each host it scans, exploits (user access; an exploit fails 1 time in 5
and lands as root 1 time in 4) and escalates (root), always from the deepest host it still
holds; once root on Op_Server0 it disrupts operations. Each step blue acts first, then red.

Blue's actions, as in CAGE-2: ``sleep``; ``monitor`` (red's scans this step are seen for sure,
otherwise 3 in 4 are); ``analyse HOST`` (shows what red holds there: privileged for root);
``remove HOST`` (ends red's user access, not its root; the host then reads unknown);
``restore HOST`` (reimages it: red loses everything there and must scan it again; costs 1).

Observations are CybORG adapter's two lines (:mod:`forge.envs.cyborg`): ``Step 4 of 20.
Activity: exploit User1, scan User2; compromised: User1 user.`` and ``Last step: sleep
succeeded, reward -0.1.`` Activity is what blue saw red do last step; compromised is what blue
believes (user on a seen exploit, privileged after an analyse, unknown after a remove).
``spec.situation``, ``abstract`` and ``instance_terms`` are CAGE-2's: hosts by role.

Rewards like CAGE-2's: each step -0.1 per User host where red has root, -1 per Enterprise host
or Op_Server0 where it has root, -10 while it disrupts Op_Server0, and -1 per restore. tau =
-1.1 as in the paper. theta, success and major-failure returns are -15, -10 and -100 per 30
steps, pro rata (as :mod:`forge.envs.cyborg`). Measured over seeds 0-99 at 20 steps (mean
return; successes, major failures of 100): sleep -138.8 (0, 100), a uniformly random blue
-105.1 (0, 84), the scripted blue (:meth:`MiniCageEnv.oracle_action`) -5.6 (65, 0).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from forge.envs.base import EnvSpec, StepResult, check_action
from forge.envs.cyborg import (
    _grammar,
    cage2_abstract,
    cage2_instance_terms,
    cage2_situation,
    host_role,
)
from forge.errors import ConfigError, UserError

__all__ = ["HOSTS", "MiniCageEnv"]

#: The network, in the order observations list hosts (CybORG's adapter sorts them too).
HOSTS = ("Enterprise0", "Enterprise1", "Op_Server0", "User0", "User1", "User2")
_FOOTHOLD = "User0"
_AT_30 = (-15.0, -10.0, -100.0)  # theta, success, major failure over 30 steps
_EXPLOIT_FAILS = 0.2
_EXPLOIT_ROOTS = 0.25  # an exploit that lands as root: blue sees "user" and a remove fails
_SCAN_SEEN = 0.75
_ACTIVITY = ("exploit", "scan")
_COST = {"User": 0.1, "Enterprise": 1.0, "Op_Server": 1.0}
_IMPACT = 10.0
_RESTORE = 1.0


class MiniCageEnv:
    """Blue against a scripted red on a six-host network; see the module docstring."""

    def __init__(
        self,
        *,
        max_steps: int = 20,
        theta: float | None = None,
        success_return: float | None = None,
        major_failure_return: float | None = None,
    ) -> None:
        if max_steps < 1:
            raise ConfigError(f"minicage: max_steps must be at least 1, got {max_steps}")
        self._actions = ["sleep", "monitor"] + [f"{verb} {h}" for verb in ("analyse", "remove", "restore") for h in HOSTS]
        scaled = [value * max_steps / 30 for value in _AT_30]
        self.spec = EnvSpec(
            name="minicage",
            description=self._describe(),
            max_steps=max_steps,
            tau=-1.1,
            theta=scaled[0] if theta is None else theta,
            success_return=scaled[1] if success_return is None else success_return,
            major_failure_return=scaled[2] if major_failure_return is None else major_failure_return,
            situation=cage2_situation,
            actions_in_description=True,
            abstract=cage2_abstract,
            instance_terms=cage2_instance_terms,
        )
        self._started = False
        self._done = False
        self._steps = 0
        self._rng = random.Random(0)
        self._path: tuple[str, ...] = ()
        self._access: dict[str, str | None] = {}
        self._scanned: set[str] = set()
        self._view: dict[str, str] = {}
        self._seen: dict[str, str] = {}
        self._last = "the episode has just started."

    @property
    def path(self) -> tuple[str, ...]:
        """Red's path this episode, foothold first (for tests; an agent reads only the text)."""
        return self._path

    def _describe(self) -> str:
        return (
            "You are blue, the defender of a 6-host network: User0-2, Enterprise0-1 and "
            "Op_Server0. Red starts on User0 and works towards Op_Server0: it scans and "
            "exploits a User host, gets root there, then does the same to an Enterprise host, "
            "then to Op_Server0, where it disrupts operations.\n"
            "Each observation lists hosts where red was seen last step (scan: probed; exploit: "
            "red tried to get in) and hosts you believe compromised (user: red has user access; "
            "privileged: red has root, found by analyse; unknown: you removed red's user access "
            "but it may have had more). Other hosts: nothing seen, not known compromised.\n"
            "Verbs: analyse (shows what red holds: privileged for root), remove (end red's user "
            "access; not root), restore (reimage: ends all access, costs 1), monitor (watch: "
            "see every scan this step), sleep (nothing). Red's foothold on User0 stays.\n"
            "Each step costs 0.1 per User host where red has root, 1 per Enterprise host or "
            "Op_Server0, 10 while red disrupts Op_Server0.\n" + _grammar(self._actions)
        )

    # -- the port ---------------------------------------------------------------------------

    def reset(self, *, seed: int) -> str:
        self._rng = random.Random(f"minicage:{int(seed)}")
        users = [h for h in HOSTS if host_role(h) == "User" and h != _FOOTHOLD]
        enterprises = [h for h in HOSTS if host_role(h) == "Enterprise"]
        self._path = (_FOOTHOLD, self._rng.choice(users), self._rng.choice(enterprises), "Op_Server0")
        self._access = {h: None for h in HOSTS}
        self._access[_FOOTHOLD] = "user"
        self._scanned = set()
        self._view = {h: "no" for h in HOSTS}
        self._seen = {}
        self._started, self._done, self._steps = True, False, 0
        self._last = "the episode has just started."
        return self._observe()

    def valid_actions(self) -> Sequence[str]:
        if not self._started:
            raise UserError("minicage: call reset(seed=...) before asking for actions")
        return list(self._actions)

    def step(self, action: str) -> StepResult:
        if not self._started:
            raise UserError("minicage: call reset(seed=...) before step()")
        if self._done:
            raise UserError("minicage: the episode is over; call reset(seed=...) first")
        name = check_action(action, valid=self._actions, env=self.spec.name)
        ok, cost = self._blue(name)
        impact = self._red(monitored=name == "monitor")
        reward = -cost - (_IMPACT if impact else 0.0) - sum(
            _COST.get(host_role(h), 0.0) for h, level in self._access.items() if level == "root"
        )
        reward = round(reward, 4) + 0.0  # never -0.0
        self._steps += 1
        truncated = self._steps >= self.spec.max_steps
        self._done = truncated
        self._last = f"{name} {'succeeded' if ok else 'failed'}, reward {reward:.1f}."
        info = {"step": self._steps, "truncated": truncated, "action_success": str(ok).upper(), "impact": impact}
        return StepResult(self._observe(), reward, self._done, info)

    def close(self) -> None:
        return None

    def oracle_action(self) -> str:
        """A scripted blue that reads only what blue knows, most valuable host first: restore
        a server or Enterprise host it believes red holds at all (a remove would miss root),
        on a User host remove red's user access, analyse where a remove left it unknown, and
        restore where analyse found root; else monitor. For tests and seeded demonstrations."""
        if not self._started or self._done:
            raise UserError("minicage: no action to take; call reset(seed=...) first")
        value = {"Op_Server": 0, "Enterprise": 1, "User": 2}
        for h in sorted((h for h in HOSTS if h != _FOOTHOLD), key=lambda h: value[host_role(h)]):
            view = self._view[h]
            if view == "no":
                continue
            if host_role(h) != "User" or view == "privileged":
                return f"restore {h}"
            return f"{'remove' if view == 'user' else 'analyse'} {h}"
        return "monitor"

    # -- the game ---------------------------------------------------------------------------

    def _blue(self, name: str) -> tuple[bool, float]:
        """Apply blue's action: (whether it succeeded, what it cost)."""
        verb, _, host = name.partition(" ")
        if verb == "analyse":
            self._view[host] = {"root": "privileged", "user": "user", None: "no"}[self._access[host]]
            return True, 0.0
        if verb == "remove":
            if self._view[host] != "no":
                self._view[host] = "unknown"
            if self._access[host] == "user" and host != _FOOTHOLD:
                self._access[host] = None
                return True, 0.0
            return False, 0.0
        if verb == "restore":
            if host != _FOOTHOLD:
                self._access[host] = None
                self._scanned.discard(host)  # a reimaged host must be found again
            self._view[host] = "no"
            return True, _RESTORE
        return True, 0.0  # sleep, monitor

    def _red(self, *, monitored: bool) -> bool:
        """Red's move from the deepest host it holds; True when it disrupts Op_Server0."""
        self._seen = {}
        deepest = max(i for i, h in enumerate(self._path) if self._access[h] is not None)
        here = self._path[deepest]
        if deepest > 0 and self._access[here] == "user":
            self._access[here] = "root"  # escalation: not seen by blue
            return False
        if deepest == len(self._path) - 1:
            return True  # root on Op_Server0: operations disrupted
        target = self._path[deepest + 1]
        if target not in self._scanned:
            self._scanned.add(target)
            if monitored or self._rng.random() < _SCAN_SEEN:
                self._seen[target] = "scan"
            return False
        self._seen[target] = "exploit"
        if self._rng.random() >= _EXPLOIT_FAILS:
            self._access[target] = "root" if self._rng.random() < _EXPLOIT_ROOTS else "user"
            if self._view[target] in ("no", "unknown"):
                self._view[target] = "user"
        return False

    def _observe(self) -> str:
        seen = [f"{kind} {h}" for kind in _ACTIVITY for h in HOSTS if self._seen.get(h) == kind]
        held = [f"{h} {self._view[h]}" for h in HOSTS if self._view[h] != "no"]
        state = f"Activity: {', '.join(seen) or 'none'}; compromised: {', '.join(held) or 'none'}"
        head = f"Step {self._steps} of {self.spec.max_steps}."
        if self._done:
            head += " The episode is over."
        return f"{head} {state}.\nLast step: {self._last}"
