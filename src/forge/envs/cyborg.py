"""CybORG CAGE-2 as text: defend a 13-host network (blue) against the B_line red agent.

CybORG installs only from git (see ``_HINT``; install it editable, since a plain install
misses its data files), so it is imported when the env is built, never at import time, and a
missing install is a ConfigError with that hint. No CybORG code lives in this project.

Setup as in the FORGE paper: ``Scenario2.yaml`` in simulation mode, ``B_lineAgent`` as red,
30 steps, one blue agent, the full 145-action blue set.

Text, built for small models on slow CPUs:

- ``spec.description`` is the same at every step: the task, what the words of an observation
  mean, and every action, written as a grammar (``sleep | monitor | VERB HOST`` with the verbs
  and hosts listed once: ~110 tokens instead of a 145-line listing of ~1,300). A prompt can put
  it before the observation so the model's prefix cache reuses it across steps.
- An observation is two lines. The first is the situation: the state of CybORG's
  ``BlueTableWrapper`` table (activity seen last step, compromise level as far as blue knows)
  for the hosts where it is not "None"/"No", hosts in a fixed order, e.g. ``Step 4 of 30.
  Activity: exploit User1, scan User2; compromised: User1 user.`` The table's subnet and IP
  columns (~70% of its tokens) are dropped: actions name hosts, never addresses, and the
  host-to-subnet map never changes within a scenario. The second line is the last action,
  whether CybORG says it succeeded, and the step's reward.
- ``spec.situation`` is that first line without the step counter and with hosts named by
  their role, the "when" of a rule: ``Activity: exploit on a User host, scan on a User host;
  compromised: a User host (user)``. A rule about "User1" means nothing in a network whose
  User1 is another machine; one about "a User host" red exploits means the same in every
  CAGE-2 network (and in :mod:`forge.envs.minicage`). ``spec.abstract`` rewrites host names
  into those roles and ``spec.instance_terms`` finds the ones a text still names. The
  observation keeps the names: actions need them.

Rewards are CybORG's, unchanged: each step's reward is minus the damage red holds that step
(-0.1 per user host or Op_Host where red has root, -1 per Enterprise host or Op_Server0, -10
while red disrupts Op_Server0) and -1 for each blue restore. tau = -1.1 (the paper's value: a
step worse than one restore means red holds a server or is disrupting operations). theta,
success and major-failure returns are ours and scale with ``max_steps``: -15, -10 and -100
over 30 steps, pro rata otherwise (a fixed -15 let a passive -10.3 graduate at 15 steps);
each can be passed explicitly. Measured over seeds 0-29 at 30 steps (``bench/cage2.py``):
sleep -214.0, CybORG's BlueReactRestoreAgent -35.3, :func:`rule_based_action` (text only) -10.8.
Below ~15 steps B_line has not reached the servers, so no threshold tells a passive blue from a
good one (sleep reaches the scaled theta in 26/30 episodes at 10 steps, 2/30 at 15, 0/30 at 20):
use 20 steps or more.

Seeding: CybORG draws from Python's ``random`` and numpy's global generator, so ``reset(seed=s)``
seeds both: reproducible, at the cost of touching global state.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

from forge.envs.base import EnvSpec, StepResult, check_action
from forge.errors import ConfigError, UserError

__all__ = [
    "CybORGCage2Env",
    "cage2_abstract",
    "cage2_instance_terms",
    "cage2_situation",
    "host_role",
    "parse_cage2_situation",
    "rule_based_action",
]

_HINT = (
    "CybORG is not installed; clone https://github.com/cage-challenge/cage-challenge-2 "
    "and run: pip install -e cage-challenge-2/CybORG"
)

#: theta, success return and major-failure return over 30 steps; other horizons pro rata.
_AT_30 = (-15.0, -10.0, -100.0)

_STEP_HEAD = re.compile(r"^Step \d+ of \d+\.(?: The episode is over\.)?\s*")
_ACTIVITY = ("exploit", "scan")  # the table's non-"None" activity values, most serious first

# The scripted blue: hosts by what red's holding them costs, and where B_line goes next.
_PRIORITY = (
    "Op_Server0", "Enterprise0", "Enterprise1", "Enterprise2", "Op_Host0", "Op_Host1",
    "Op_Host2", "Defender", "User1", "User2", "User3", "User4", "User0",
)
_DECOY_HOSTS = ("Enterprise1", "Enterprise2", "Op_Server0", "Enterprise0")
_DECOYS = (
    "decoy_apache", "decoy_femitter", "decoy_haraka_smpt", "decoy_smss", "decoy_sshd",
    "decoy_svchost", "decoy_tomcat", "decoy_vsftpd",
)


def _snake(name: str) -> str:
    return re.sub(r"(?<=[a-z])(?=[A-Z])", "_", name).lower()


def _state_line(observation: str) -> str:
    """The first line of an observation without "Step N of M.": the host states, by name."""
    first = observation.strip().split("\n", 1)[0]
    return _STEP_HEAD.sub("", first).rstrip(". ")


# -- hosts by role: what a rule may name -------------------------------------------------------

_ROLES = ("Op_Server", "Enterprise", "Op_Host", "Defender", "User")  # most valuable first
_ONE = {
    "Op_Server": "the Op_Server", "Enterprise": "an Enterprise host", "Op_Host": "an Op_Host",
    "Defender": "the Defender", "User": "a User host",
}
_MANY = {
    "Op_Server": "Op_Servers", "Enterprise": "Enterprise hosts", "Op_Host": "Op_Hosts",
    "Defender": "Defenders", "User": "User hosts",
}
_CANON = {r.lower(): r for r in _ROLES}
# A host name is a role and a number: the number is what holds in one network only.
_HOST = re.compile(r"\b(user|enterprise|op_server|op_host)(\d+)\b", re.IGNORECASE)
_SEED = re.compile(r"\bseed\s*[=:]?\s*\d+\b", re.IGNORECASE)
_LEVELS = ("privileged", "user", "unknown")
_STATE = re.compile(
    r"Activity: (?P<act>none|[a-z]+ \w+(?:, [a-z]+ \w+)*); compromised: "
    r"(?P<held>none|\w+ (?:user|privileged|unknown)(?:, \w+ (?:user|privileged|unknown))*)",
    re.IGNORECASE,
)


def host_role(host: str) -> str:
    """A host's role: ``"Enterprise1"`` -> ``"Enterprise"``, ``"Defender"`` -> ``"Defender"``;
    a name of no known role is ``"host"``."""
    m = re.fullmatch(r"(user|enterprise|op_server|op_host|defender)\d*", host.strip(), re.IGNORECASE)
    return _CANON[m.group(1).lower()] if m else "host"


def _hosts(role: str, n: int) -> str:
    if role == "host":
        return "a host" if n == 1 else f"{n} hosts"
    return _ONE[role] if n == 1 else f"{n} {_MANY[role]}"


def _by_role(state: Mapping[str, tuple[str, str]]) -> str:
    order = {r: i for i, r in enumerate((*_ROLES, "host"))}
    roles = sorted({host_role(h) for h in state}, key=order.__getitem__)
    kinds = [*_ACTIVITY, *sorted({a for a, _ in state.values()} - {*_ACTIVITY, "none"})]
    levels = [*_LEVELS, *sorted({c for _, c in state.values()} - {*_LEVELS, "no"})]

    def count(role: str, index: int, value: str) -> int:  # hosts of ``role`` whose (activity, level)[index] is ``value``
        return sum(1 for h, v in state.items() if host_role(h) == role and v[index] == value)

    seen = [
        f"{kind} on {_hosts(role, n)}"
        for kind in kinds for role in roles if (n := count(role, 0, kind))
    ]
    held = [
        f"{_hosts(role, n)} ({level})"
        for role in roles for level in levels if (n := count(role, 1, level))
    ]
    return f"Activity: {', '.join(seen) or 'none'}; compromised: {', '.join(held) or 'none'}"


def cage2_situation(observation: str) -> str:
    """The host states of a CAGE-2 observation by role, without "Step N of M.": the "when" of
    a rule, which must hold in another network too.

    E.g. ``"Activity: exploit on a User host, scan on a User host; compromised: an Enterprise
    host (user)"``, counted where a role repeats ("scan on 2 User hosts"), roles in a fixed
    order (Op_Server, Enterprise, Op_Host, Defender, User). A pure function of the text, so it
    also serves recorded observations; ``spec.situation`` points here.
    """
    return _by_role(parse_cage2_situation(observation))


def cage2_instance_terms(text: str) -> list[str]:
    """The host names (a role and a number: "User2", "Op_Server0") and seeds a text names."""
    found = [m.group(0) for m in _HOST.finditer(text)] + [m.group(0) for m in _SEED.finditer(text)]
    return list(dict.fromkeys(found))


def cage2_abstract(text: str) -> str:
    """``text`` with host names rewritten into their roles: a host-state list ("Activity:
    exploit User1; compromised: User1 user") as :func:`cage2_situation` writes it, any other
    name as its role ("remove User2" -> "remove a User host", "Op_Server0" -> "the
    Op_Server"). What is left names no host (:func:`cage2_instance_terms` finds nothing)."""
    text = _STATE.sub(lambda m: _by_role(parse_cage2_situation(m.group(0))), text)
    text = _HOST.sub(lambda m: _ONE[_CANON[m.group(1).lower()]], text)
    text = re.sub(r"\s*\(\s*\)", "", _SEED.sub("", text))
    return re.sub(r"[ \t]{2,}", " ", text).strip()


def parse_cage2_situation(situation: str) -> dict[str, tuple[str, str]]:
    """Host -> (activity, compromise) for the hosts an observation's first line names, in
    CybORG's words lower-cased (``scan``/``exploit``; ``user``/``privileged``/``unknown``).
    Hosts left out are ("none", "no"). Takes a whole observation or its first line; for
    policies that read the text (the role-based :func:`cage2_situation` names no host)."""
    situation = _state_line(situation)
    state: dict[str, list[str]] = {}
    activity, _, compromised = situation.partition("; compromised: ")
    # A rule's "when" starts lower-case ("when activity: none; ..."): read the prefix in any
    # case, or "activity:" became a host and every such rule read "activity: on a host".
    for item in re.sub(r"^activity:\s*", "", activity, flags=re.IGNORECASE).split(", "):
        if " " in item:
            kind, host = item.split(" ", 1)
            state.setdefault(host, ["none", "no"])[0] = kind
    for item in compromised.split(", "):
        if " " in item:
            host, level = item.rsplit(" ", 1)
            state.setdefault(host, ["none", "no"])[1] = level
    return {host: (a, c) for host, (a, c) in state.items()}


def rule_based_action(observation: str, *, taken: Collection[str] = ()) -> str:
    """A scripted blue that reads only the observation text (and the actions it took).

    Restore a server, Enterprise or operational host red holds at any level; remove red's
    user access from a user host; analyse a host whose state is unknown after a remove;
    otherwise plant each decoy once on the hosts B_line heads for (a failed plant costs
    nothing); else sleep. Red's root on a user host costs 0.1 a step and a restore 1, so
    user hosts are never restored, and User0, red's foothold, is left alone. It proves the
    text carries what a policy needs; ``bench/cage2.py`` scores it against CybORG's agents.
    """
    state = parse_cage2_situation(observation)
    hosts = sorted(state, key=lambda h: _PRIORITY.index(h) if h in _PRIORITY else len(_PRIORITY))
    for host in hosts:
        compromise = state[host][1]
        if host == "User0" or compromise == "no":
            continue
        if not host.startswith("User"):
            return f"restore {host}"
        if compromise == "user":
            return f"remove {host}"
    for host in hosts:
        if host != "User0" and state[host][1] == "unknown":
            return f"analyse {host}"
    done = set(taken)
    for host in _DECOY_HOSTS:
        for decoy in _DECOYS:
            if f"{decoy} {host}" not in done:
                return f"{decoy} {host}"
    return "sleep"


def _grammar(actions: Sequence[str]) -> str:
    """Every action in a few lines: bare verbs, then each verb group with the hosts it takes.

    Built from the enumerated actions (not written by hand), so it names exactly them.
    """
    bare = [a for a in actions if " " not in a]
    hosts_of: dict[str, list[str]] = {}
    for action in actions:
        if " " in action:
            verb, host = action.split(" ", 1)
            hosts_of.setdefault(verb, []).append(host)
    groups: dict[tuple[str, ...], list[str]] = {}
    for verb, hosts in hosts_of.items():
        groups.setdefault(tuple(hosts), []).append(verb)
    lines = [f"Actions ({len(actions)}; answer with one, exactly as written): " + " | ".join(
        [*bare, *(["VERB HOST"] if groups else [])]
    )]
    many = len(groups) > 1
    for n, (shared, verbs) in enumerate(groups.items(), 1):
        tag = str(n) if many else ""
        lines.append(f"VERB{tag}: {' '.join(verbs)}")
        lines.append(f"HOST{tag}: {' '.join(shared)}")
    return "\n".join(lines)


class CybORGCage2Env:
    """Blue agent in CAGE-2 Scenario2 against B_line; see the module docstring for shaping."""

    def __init__(
        self,
        *,
        max_steps: int = 30,
        red: str = "b_line",
        theta: float | None = None,
        success_return: float | None = None,
        major_failure_return: float | None = None,
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
        if max_steps < 1:
            raise ConfigError(f"cyborg-cage2: max_steps must be at least 1, got {max_steps}")
        scenario = Path(inspect.getfile(CybORG)).parent / "Shared" / "Scenarios" / "Scenario2.yaml"
        self._cyborg = CybORG(str(scenario), "sim", agents={"Red": reds[red]})
        self._env = BlueTableWrapper(env=self._cyborg, agent="Blue", output_mode="table")
        # The blue action space is fixed by the scenario, so the listing can be stable.
        self._actions = self._enumerate_actions()
        self._hosts = sorted({kw["hostname"] for _, kw in self._actions.values() if "hostname" in kw})
        scaled = [value * max_steps / 30 for value in _AT_30]
        self.spec = EnvSpec(
            name="cyborg-cage2",
            description=self._describe(),
            max_steps=max_steps,
            tau=-1.1,
            theta=scaled[0] if theta is None else theta,
            success_return=scaled[1] if success_return is None else success_return,
            major_failure_return=(
                scaled[2] if major_failure_return is None else major_failure_return
            ),
            situation=cage2_situation,
            actions_in_description=True,
            abstract=cage2_abstract,
            instance_terms=cage2_instance_terms,
        )
        self._started = False
        self._done = False
        self._steps = 0
        self._state = ""
        self._last = "the episode has just started."
        self._taken: list[str] = []

    @property
    def cyborg(self) -> Any:
        """The underlying CybORG instance, for baselines that read its raw observations."""
        return self._cyborg

    def action_name(self, action: Any) -> str:
        """The text name of a CybORG blue action object (e.g. from one of CybORG's agents)."""
        params = action.get_params() if hasattr(action, "get_params") else {}
        verb = _snake(type(action).__name__)
        host = params.get("hostname")
        name = f"{verb} {host}" if host is not None and f"{verb} {host}" in self._actions else verb
        if name not in self._actions:
            raise UserError(f"cyborg-cage2: {action} is not one of the blue actions")
        return name

    def cyborg_action(self, name: str) -> Any:
        """A fresh CybORG action object for one of :meth:`valid_actions` (the inverse of
        :meth:`action_name`), e.g. to replay the same choices on a raw CybORG."""
        cls, kwargs = self._actions[check_action(name, valid=list(self._actions), env=self.spec.name)]
        return cls(**kwargs)

    def _enumerate_actions(self) -> dict[str, tuple[Any, dict[str, Any]]]:
        """Every blue action CybORG offers, keyed by a short readable name."""
        space = self._cyborg.get_action_space("Blue")
        hosts = sorted(h for h, ok in space.get("hostname", {}).items() if ok)
        session = next(iter(space.get("session", {0: True})))
        actions: dict[str, tuple[Any, dict[str, Any]]] = {}
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

    def _describe(self) -> str:
        return (
            "You are blue, the defender of a 13-host network: User0-4, Enterprise0-2, "
            "Defender, Op_Host0-2 and Op_Server0. Red starts on User0 and works towards "
            "Op_Server0: it scans and exploits a user host, gets root there, then does the "
            "same to an Enterprise host, then to Op_Server0, where it disrupts operations.\n"
            "Each observation lists hosts where red was seen last step (scan: probed; "
            "exploit: red got in) and hosts you believe compromised (user: red has user "
            "access; privileged: red has root, found by analyse; unknown: you removed red's "
            "user access but it may have had more). Other hosts: nothing seen, not known "
            "compromised.\n"
            "Verbs: analyse (look for red's malware: shows privileged), remove (end red's user "
            "access; not root), restore (reimage: ends all access, costs 1), decoy_* (a fake "
            "service that makes red's exploits fail), monitor (just watch), sleep (nothing).\n"
            "Each step costs 0.1 per user host or Op_Host where red has root, 1 per "
            "Enterprise host or Op_Server0, 10 while red disrupts Op_Server0.\n"
            + _grammar(list(self._actions))
        )

    def reset(self, *, seed: int) -> str:
        import random

        import numpy as np

        random.seed(seed)
        np.random.seed(seed % 2**32)
        self._env.reset(agent="Blue")
        self._started, self._done, self._steps = True, False, 0
        self._state = self._situation(self._env.info)
        self._last = "the episode has just started."
        self._taken = []
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
        self._taken.append(name)
        result = self._env.step(agent="Blue", action=self.cyborg_action(name))
        self._steps += 1
        reward = float(result.reward)
        truncated = self._steps >= self.spec.max_steps
        self._done = bool(result.done) or truncated
        self._state = self._situation(self._env.info)
        success = getattr(result.observation, "success", None)
        verdict = getattr(success, "name", str(success))
        said = {"TRUE": "succeeded", "FALSE": "failed"}.get(verdict, "result unknown")
        self._last = f"{name} {said}, reward {reward:.1f}."
        info = {"step": self._steps, "truncated": truncated, "action_success": str(success)}
        return StepResult(self._observe(), reward, self._done, info)

    def oracle_action(self) -> str:
        """The scripted blue's next action (:func:`rule_based_action`), for tests and demos."""
        if not self._started or self._done:
            raise UserError("cyborg-cage2: no action to take; call reset(seed=...) first")
        return rule_based_action(self._observe(), taken=self._taken)

    def close(self) -> None:
        shutdown = getattr(self._cyborg, "shutdown", None)
        if shutdown is not None:
            shutdown(teardown=True)

    def _situation(self, info: Mapping[str, Sequence[str]]) -> str:
        """The BlueTableWrapper rows as one line: only non-default cells, hosts in a fixed order."""
        rows = {str(r[2]): (str(r[3]).lower(), str(r[4]).lower()) for r in info.values()}
        hosts = [h for h in self._hosts if h in rows] + sorted(set(rows) - set(self._hosts))
        seen = [
            f"{kind} {h}" for kind in _ACTIVITY for h in hosts if rows[h][0] == kind
        ] + [f"{rows[h][0]} {h}" for h in hosts if rows[h][0] not in (*_ACTIVITY, "none")]
        held = [f"{h} {rows[h][1]}" for h in hosts if rows[h][1] != "no"]
        return (
            f"Activity: {', '.join(seen) or 'none'}; compromised: {', '.join(held) or 'none'}"
        )

    def _observe(self) -> str:
        head = f"Step {self._steps} of {self.spec.max_steps}."
        if self._done:
            head += " The episode is over."
        return f"{head} {self._state}.\nLast step: {self._last}"
