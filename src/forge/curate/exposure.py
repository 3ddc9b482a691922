"""What an agent's prompts may show besides its own memory: the protocols' cold-start switches.

    exposure = Exposure(warmup=WarmUp(after_episodes=5, ramp_episodes=10))
    Recaller(memory, viewer, exposure=exposure, episodes=agent_episodes)

- warm-up (:class:`~forge.curate.seeds.WarmUp`): shared and received units stay out of the
  prompt until the agent has ``after_episodes`` episodes, then only those validated at
  ``min_validation`` or better; the share of prompt sections grows over ``ramp_episodes``;
- isolation: the agent reads nothing but its own memory (an ablation: the same run with
  sharing cut for some agents).

The gate is applied to what the engine recalls, not in the store's :class:`~forge.store.Filter`:
it needs the unit's provenance (received copies are owned by the receiver) and the agent's
experience, which no backend's filter can see, and a new Filter field would have to be
honoured by every backend. Recall is asked for more candidates until ``k`` pass the gate or
the memory runs out, so hidden units never crowd out visible ones.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from forge.curate.seeds import WarmUp, own
from forge.engine.port import MemoryPort
from forge.errors import ValidationError
from forge.model import Unit

__all__ = ["Exposure", "GatedMemory"]

V = TypeVar("V")

#: The most candidates one gated recall asks the engine for (Memory.recall's own limit).
MAX_FETCH = 10_000


@dataclass(frozen=True, slots=True)
class Exposure:
    """Warm-up and isolation for one agent's prompts; the defaults change nothing."""

    warmup: WarmUp = field(default_factory=WarmUp)
    isolated: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.warmup, WarmUp) or not isinstance(self.isolated, bool):
            raise ValidationError("an exposure needs a WarmUp and isolated True or False")

    @property
    def open(self) -> bool:
        """True when nothing is hidden: prompts are written exactly as without exposure."""
        return not self.isolated and self.warmup == WarmUp()

    def shows(self, unit: Unit, *, agent: str, episodes: int) -> bool:
        """Whether ``agent``, with ``episodes`` episodes behind it, reads ``unit`` now."""
        if own(unit, agent):
            return True
        return not self.isolated and self.warmup.shows(unit, agent=agent, episodes=episodes)

    def sections(self, sections: Mapping[str, V], *, episodes: int) -> dict[str, V]:
        """The prompt sections shown now (gradual enablement), in their order of priority."""
        return {name: sections[name] for name in self.warmup.sections(list(sections), episodes=episodes)}

    def view(self, memory: MemoryPort, *, agent: str, episodes: int) -> GatedMemory:
        """``memory`` as ``agent`` may read it now: its ``recall`` leaves out what is hidden."""
        return GatedMemory(memory, exposure=self, agent=agent, episodes=episodes)


class GatedMemory:
    """A memory whose ``recall`` returns only the units an :class:`Exposure` shows."""

    def __init__(self, memory: MemoryPort, *, exposure: Exposure, agent: str, episodes: int) -> None:
        self.memory = memory
        self.exposure = exposure
        self.agent = agent
        self.episodes = episodes

    def recall(self, query: str, *, k: int = 10, touch: bool = True, **kw: Any) -> list[Any]:
        fetch = k
        while True:
            got = self.memory.recall(query, k=fetch, touch=False, **kw)
            kept = [r for r in got if self.exposure.shows(r.unit, agent=self.agent, episodes=self.episodes)][:k]
            if len(kept) >= k or len(got) < fetch or fetch >= MAX_FETCH:
                break
            fetch = min(MAX_FETCH, fetch * 4)
        if touch and kept:
            self.memory.touch([r.unit.id for r in kept])
        return kept
