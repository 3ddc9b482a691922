"""CybORG CAGE-2 as text: defend a 13-host network (blue) against the B_line red agent.

CybORG installs only from git (see ``_HINT``; install it editable, since a plain install
misses its data files), so it is imported when the env is built, never at import time, and a missing install is a
ConfigError with that hint. No CybORG code lives in this project.

Setup as in the FORGE paper: ``Scenario2.yaml`` in simulation mode, ``B_lineAgent`` as red,
30 steps, one blue agent. Observations are CybORG's ``BlueTableWrapper`` table (per host:
subnet, IP, activity seen, compromise level) written out as lines, plus what the last action
was and whether it succeeded. Actions are ``"sleep"``, ``"monitor"`` and ``"<verb> <host>"`` for
analyse / remove / restore / the eight decoys, enumerated from CybORG's own action space.

Rewards are CybORG's, unchanged: each step's reward is minus the damage red holds that step
(about -0.1 per compromised user host, -1 per privileged server, -10 for impact on the
operational server) and -1 for a blue Restore. tau = -1.1 (the paper's value: a step worse than
one restore means red holds a server or is disrupting operations). theta, success and
major-failure returns are ours (defaults -15, -10, -100) and can be passed in: measured here,
a blue that only sleeps returns -171.7 over 30 steps; published PPO blues reach about -5.

Seeding: CybORG draws from Python's ``random`` and numpy's global generator, so ``reset(seed=s)``
seeds both: reproducible, at the cost of touching global state.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from forge.envs.base import EnvSpec, StepResult, check_action
from forge.errors import ConfigError, UserError

__all__ = ["CybORGCage2Env"]

_HINT = (
    "CybORG is not installed; clone https://github.com/cage-challenge/cage-challenge-2 "
    "and run: pip install -e cage-challenge-2/CybORG"
)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).lower()


class CybORGCage2Env:
    """Blue agent in CAGE-2 Scenario2 against B_line; see the module docstring for shaping."""

    def __init__(
        self,
        *,
        max_steps: int = 30,
        red: str = "b_line",
        theta: float = -15.0,
        success_return: float = -10.0,
        major_failure_return: float = -100.0,
    ) -> None:
        try:
            from CybORG import CybORG
            from CybORG.Agents import B_lineAgent, RedMeanderAgent, SleepAgent
            from CybORG.Agents.Wrappers import BlueTableWrapper
        except (ImportError, OSError) as exc:  # OSError: a non-editable install lacks data files
            raise ConfigError(f"{_HINT} ({exc})") from exc
        reds = {"b_line": B_lineAgent, "meander": RedMeanderAgent, "sleep": SleepAgent}
        if red not in reds:
            raise ConfigError(f"unknown CybORG red agent {red!r}; choose one of: {', '.join(reds)}")
        scenario = Path(inspect.getfile(CybORG)).parent / "Shared" / "Scenarios" / "Scenario2.yaml"
        self._cyborg = CybORG(str(scenario), "sim", agents={"Red": reds[red]})
        self._env = BlueTableWrapper(env=self._cyborg, agent="Blue", output_mode="table")
        self.spec = EnvSpec(
            name="cyborg-cage2",
            description=(
                "You are the blue (defender) agent of a 13-host network: User0-4, "
                "Enterprise0-2, Op_Host0-2, Op_Server0 and Defender. A red attacker works its "
                "way from the user hosts towards the operational server. Each step choose one "
                "action: sleep; monitor; analyse <host> (look for malware); remove <host> "
                "(kill red's user-level access); restore <host> (reimage it: removes any "
                "access, costs -1); or a decoy_* <host> to bait red. Each step you lose reward "
                "for every host red holds (more for servers, -10 if it disrupts Op_Server0)."
            ),
            max_steps=max_steps,
            tau=-1.1,
            theta=theta,
            success_return=success_return,
            major_failure_return=major_failure_return,
        )
        self._actions: dict[str, Any] = {}
        self._started = False
        self._done = False
        self._steps = 0
        self._table = ""
        self._last = "The episode has just started."

    def _enumerate_actions(self) -> dict[str, Any]:
        """Every blue action CybORG offers, keyed by a short readable name."""
        space = self._cyborg.get_action_space("Blue")
        hosts = sorted(h for h, ok in space.get("hostname", {}).items() if ok)
        session = next(iter(space.get("session", {0: True})))
        actions: dict[str, Any] = {}
        for cls, ok in space["action"].items():
            if not ok:
                continue
            params = inspect.signature(cls).parameters
            verb = _snake(cls.__name__)
            base = {k: v for k, v in (("session", session), ("agent", "Blue")) if k in params}
            if "hostname" in params:
                for host in hosts:
                    actions[f"{verb} {host}"] = (cls, {**base, "hostname": host})
            else:
                actions[verb] = (cls, base)
        return actions

    def reset(self, *, seed: int) -> str:
        import random

        import numpy as np

        random.seed(seed)
        np.random.seed(seed % 2**32)
        result = self._env.reset(agent="Blue")
        self._actions = self._enumerate_actions()
        self._started, self._done, self._steps = True, False, 0
        self._table = self._render(result.observation)
        self._last = "The episode has just started."
        return self._observe()

    def valid_actions(self) -> Sequence[str]:
        if not self._started:
            raise UserError("cyborg-cage2: call reset(seed=...) before asking for actions")
        return list(self._actions)

    def step(self, action: str) -> StepResult:
        if not self._started:
            raise UserError("cyborg-cage2: call reset(seed=...) before step()")
        if self._done:
            raise UserError("cyborg-cage2: the episode is over; call reset(seed=...) first")
        name = check_action(action, valid=list(self._actions), env=self.spec.name)
        cls, kwargs = self._actions[name]
        result = self._env.step(agent="Blue", action=cls(**kwargs))
        self._steps += 1
        reward = float(result.reward)
        truncated = self._steps >= self.spec.max_steps
        self._done = bool(result.done) or truncated
        self._table = self._render(result.observation)
        success = getattr(result.observation, "success", None)
        outcome = f" (succeeded: {success.name if hasattr(success, 'name') else success})"
        self._last = f"you chose {name}{outcome}; reward this step {reward:.1f}."
        info = {"step": self._steps, "truncated": truncated, "action_success": str(success)}
        return StepResult(self._observe(), reward, self._done, info)

    def close(self) -> None:
        shutdown = getattr(self._cyborg, "shutdown", None)
        if shutdown is not None:
            shutdown(teardown=True)

    def _render(self, table: Any) -> str:
        info = getattr(self._env, "info", None)
        if not isinstance(info, dict):
            return str(table)
        lines = []
        for host in sorted(info):
            subnet, ip, name, activity, compromised = info[host][:5]
            lines.append(
                f"  {name}: ip {ip}, subnet {subnet}, activity {activity}, compromised {compromised}"
            )
        return "\n".join(lines)

    def _observe(self) -> str:
        head = f"Step {self._steps} of {self.spec.max_steps}."
        if self._done:
            head += " The episode is over."
        return (
            f"{head}\nHosts (activity seen last step; compromise level as far as you know):\n"
            f"{self._table}\nLast step: {self._last}"
        )
