"""One experiment's settings, and the conditions that differ only by which mechanisms are on.

Every condition runs the same code path (``forge.protocols.forge``); a condition is just a
set of switches, so an ablation can never drift from the method it ablates:

===================  ========  =========  ==========
condition            learning  broadcast  graduation
===================  ========  =========  ==========
zero-shot            no        no         no
reflexion            yes       no         no
forge                yes       yes        yes
forge-no-graduation  yes       yes        no
===================  ========  =========  ==========
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from forge.curate.exposure import Exposure
from forge.curate.seeds import WarmUp
from forge.errors import ConfigError
from forge.learn.reflect import REPRESENTATIONS

__all__ = [
    "CONDITIONS",
    "POLICIES",
    "REPRESENTATIONS",
    "Condition",
    "ForgeConfig",
    "derive_seed",
]

POLICIES = ("flat", "hierarchical")


@dataclass(frozen=True, slots=True)
class Condition:
    learning: bool
    broadcast: bool
    graduation: bool


CONDITIONS: dict[str, Condition] = {
    "zero-shot": Condition(learning=False, broadcast=False, graduation=False),
    "reflexion": Condition(learning=True, broadcast=False, graduation=False),
    "forge": Condition(learning=True, broadcast=True, graduation=True),
    "forge-no-graduation": Condition(learning=True, broadcast=True, graduation=False),
}


def derive_seed(*parts: Any) -> int:
    """A stable 31-bit seed from ``parts`` (run seed, stage, instance...): same inputs, same seed
    on every machine and Python version (unlike ``hash``)."""
    text = ":".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") % (2**31 - 1) + 1


@dataclass(frozen=True, slots=True)
class ForgeConfig:
    """Settings of one evolution run. Defaults follow the paper where it says (N=10, S=6, k=3,
    caps 100 rules / 50 examples); ``tau``/``theta`` default to the environment's spec.

    Beyond the paper: ``reflect_on_stall`` also reflects on an attempt that never fell below
    tau but ended unsuccessful (a small model looping against a wall learns nothing
    otherwise; Reflexion reflects on every failed trial); ``reflect_on_checkpoint`` reflects on
    a failed greedy checkpoint too, after its return is taken (a sampled attempt can win where
    the greedy policy, the one evaluation plays, fails); ``probe_alternatives`` replays the
    seeded episode to tell reflection which other actions were safe at the failing step;
    ``rule_guard`` makes the prompt's "Choose one of" binding: "when X, then do not A" rules
    become hard exclusions, and where they name what was safe the choice is among those (off:
    the paper's memory is prompt-only); ``show_map`` keeps drawn maps in prompts (off: small models).
    ``temperature`` is instance 0's sampling temperature in training and ``diversity`` the
    spread added across instances (instance i gets ``temperature + diversity * i/(N-1)``), so
    a population explores differently and its champion is not an accident of ordering.
    ``graduate_after`` is how many checkpoints at or above theta an instance needs before it
    graduates (1: the paper's rule). On random FrozenLake maps and TextWorld games a small
    model often wins its first training episode by luck and graduated there with an empty
    memory, so nothing was learned to carry to held-out tasks; 2 asks for a second,
    differently seeded win. ``graduate_first_try`` counts a checkpoint toward it only when
    the stage's first training attempt already reached theta: a stage won only after a
    reflection shows the memory was still missing something (coin-2, run seed 1: both
    instances graduated after a stage won on its second attempt and never met the failure that
    held-out games turn on). Off: the paper's count. Checkpoints and final evaluations are always greedy. ``reflection`` is how rules are asked for:
    ``slots`` (the model fills in the failing situation's rule under a grammar; small models
    manage it) or ``free`` (free-text rule edits, the paper's way; see :func:`forge.learn.reflect.reflect`).

    Cold-start switches (issue 12; all off by default, see :mod:`forge.curate.exposure`):
    ``warmup_episodes`` hides received (broadcast) units from an instance's prompts until
    it has played that many episodes, ``warmup_validation`` then shows only received units
    validated at least that well, and ``ramp_episodes`` grows the share of prompt sections
    shown from one to all over that many episodes (gradual enablement). ``isolated`` lists
    the instances cut off from everything but their own memory (an ablation): they read
    only their own units and the champion broadcast skips them; they may still be champion.
    ``seed_pack`` (a JSONL path, :mod:`forge.curate.seeds`) is copied into every instance's
    memory when the run starts (source ``seed``, validation 0.3): the cold-start condition.

    Ceilings on training's work (0: none, the paper's run): ``train_decisions`` (actions
    chosen, one per env step, attempts and checkpoints together) and ``train_reflections``.
    A stage starts only if its worst case (every active instance playing every attempt and
    its checkpoint to the step limit, reflecting after each) fits in what the stages before it
    left, so training never passes either ceiling whatever the trajectories do; the stages it
    skips are said in the run's ``budget`` record. The final evaluation is never cut.

    Held-out evaluation: with ``train_seeds``, every stage's episode seed is drawn from them;
    with ``eval_seeds``, the final evaluation plays exactly those (``eval_episodes`` is then
    their count). The two must not overlap, so a figure measured on ``eval_seeds`` is on
    tasks (maps, games) no instance trained on. Without them, seeds derive from ``seed``.
    """

    condition: str = "forge"
    env: str = "frozenlake-4x4"
    llm: str = "local"
    embedder: str = "hash"
    instances: int = 10
    stages: int = 6
    attempts: int = 3
    tau: float | None = None
    theta: float | None = None
    representation: str = "rules"
    seed: int = 0
    workers: int = 1
    policy: str = "flat"
    rule_cap: int = 100
    example_cap: int = 50
    eval_episodes: int = 3
    memory_tokens: int = 600  # the memory block's budget, per role
    max_steps: int | None = None
    probe_alternatives: bool = True
    rule_guard: bool = False
    graduate_after: int = 1
    graduate_first_try: bool = False
    show_map: bool = False
    reflect_on_stall: bool = True
    reflect_on_checkpoint: bool = True
    temperature: float = 0.0
    diversity: float = 0.6
    reflection: str = "slots"
    warmup_episodes: int = 0
    warmup_validation: float = 0.0
    ramp_episodes: int = 0
    isolated: tuple[int, ...] = ()
    seed_pack: str = ""
    train_seeds: tuple[int, ...] = ()
    eval_seeds: tuple[int, ...] = ()
    train_decisions: int = 0
    train_reflections: int = 0

    def __post_init__(self) -> None:
        if self.condition not in CONDITIONS:
            raise ConfigError(f"unknown condition {self.condition!r}; expected one of: {', '.join(CONDITIONS)}")
        if self.representation not in REPRESENTATIONS:
            raise ConfigError(
                f"unknown representation {self.representation!r}; expected one of: {', '.join(REPRESENTATIONS)}"
            )
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown policy {self.policy!r}; expected one of: {', '.join(POLICIES)}")
        from forge.envs import available_envs

        if self.env not in available_envs():
            raise ConfigError(f"unknown environment {self.env!r}; known: {', '.join(available_envs())}")
        for name in ("instances", "stages", "workers", "eval_episodes", "memory_tokens", "graduate_after"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        for name in ("attempts", "rule_cap", "example_cap", "train_decisions", "train_reflections"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be zero or a positive integer, got {value!r}")
        if self.max_steps is not None and (not isinstance(self.max_steps, int) or self.max_steps < 1):
            raise ConfigError(f"max_steps must be a positive integer, got {self.max_steps!r}")
        for name in ("temperature", "diversity"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 2.0:
                raise ConfigError(f"{name} must be a number between 0 and 2, got {value!r}")
        from forge.learn.reflect import REFLECTION_STYLES

        if self.reflection not in REFLECTION_STYLES:
            raise ConfigError(f"unknown reflection style {self.reflection!r}; expected one of: {', '.join(REFLECTION_STYLES)}")
        if not isinstance(self.graduate_first_try, bool):
            raise ConfigError(f"graduate_first_try must be true or false, got {self.graduate_first_try!r}")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        for name in ("warmup_episodes", "ramp_episodes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name} must be zero or a positive integer, got {value!r}")
        v = self.warmup_validation
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
            raise ConfigError(f"warmup_validation must be a number between 0 and 1, got {v!r}")
        if isinstance(self.isolated, (str, bytes)) or not isinstance(self.isolated, (list, tuple)):
            raise ConfigError(f"isolated must be a list of instance indices, got {self.isolated!r}")
        for i in self.isolated:
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.instances:
                raise ConfigError(f"isolated instance {i!r} is not one of 0..{self.instances - 1}")
        object.__setattr__(self, "isolated", tuple(sorted(set(self.isolated))))  # JSON gives a list
        if not isinstance(self.seed_pack, str):
            raise ConfigError(f"seed_pack must be a file path, got {self.seed_pack!r}")
        for name in ("train_seeds", "eval_seeds"):
            value = getattr(self, name)
            if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                raise ConfigError(f"{name} must be a list of integer seeds, got {value!r}")
            if any(not isinstance(s, int) or isinstance(s, bool) or s < 0 for s in value):
                raise ConfigError(f"{name} must hold non-negative integers, got {list(value)!r}")
            object.__setattr__(self, name, tuple(dict.fromkeys(value)))
        both = set(self.train_seeds) & set(self.eval_seeds)
        if both:
            raise ConfigError(f"train_seeds and eval_seeds overlap ({', '.join(map(str, sorted(both)[:5]))}): evaluation must be on held-out seeds")
        if self.eval_seeds:
            object.__setattr__(self, "eval_episodes", len(self.eval_seeds))

    def stage_seed(self, stage: int, instance: int) -> int:
        """The episode seed of ``instance`` at ``stage``: from ``train_seeds`` when given."""
        derived = derive_seed(self.seed, "stage", stage, "instance", instance)
        return self.train_seeds[derived % len(self.train_seeds)] if self.train_seeds else derived

    def evaluation_seeds(self) -> list[int]:
        """The final evaluation's seeds: ``eval_seeds`` when given, else derived from ``seed``."""
        return list(self.eval_seeds) or [derive_seed(self.seed, "eval", n) for n in range(self.eval_episodes)]

    def exposure(self, instance: int) -> Exposure:
        """What ``instance``'s prompts may show besides its own memory (warm-up, isolation)."""
        warmup = WarmUp(after_episodes=self.warmup_episodes, min_validation=float(self.warmup_validation), ramp_episodes=self.ramp_episodes)
        return Exposure(warmup=warmup, isolated=instance in self.isolated)

    @property
    def flags(self) -> Condition:
        return CONDITIONS[self.condition]

    def replace(self, **changes: Any) -> ForgeConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["isolated"] = list(self.isolated)  # as JSON reads it back: a resumed run's final.json is equal
        d["train_seeds"] = list(self.train_seeds)
        d["eval_seeds"] = list(self.eval_seeds)
        return d

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ForgeConfig:
        if not isinstance(data, Mapping):
            raise ConfigError("a run config must be a JSON object")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ConfigError(f"unknown config field(s): {', '.join(sorted(unknown))}")
        return cls(**dict(data))
