"""Curation: memory that keeps itself healthy, off the hot path, every decision explained.

    from forge.curate import admit, curate, restore, CurationPolicy
    admit(memory, units, actor="agent-1")          # ADD / UPDATE / NOOP, never lossy
    plan = curate(memory, dry_run=True)            # what a pass would archive or supersede, and why
    curate(memory, policy=CurationPolicy(cap_per_kind={"episode": 1000}))
    restore(memory, unit_id)                       # archived units come back

- :mod:`forge.curate.admission`: the write-time gate (novelty, importance, ADD/UPDATE/NOOP);
- :mod:`forge.curate.lifecycle`: strength and decay, TTL, caps, conflicts over time, the pass,
  restore, and the bi-temporal timeline of a belief;
- :mod:`forge.curate.consolidate`: the one consolidation (clustering, generalisation, source
  links) with a policy for what clusters: any memory's, or the team's procedures;
- :mod:`forge.curate.schedule`: a pass every N seconds (the service's ``--curate-every``);
- :mod:`forge.curate.seeds`: seed packs and warm-up rules for cold start;
- :mod:`forge.curate.exposure`: warm-up, gradual enablement and isolation applied to an
  agent's prompts (the protocols' and the swarm's switches);
- :mod:`forge.curate.trace`: the provenance chain of one unit.
"""

from __future__ import annotations

from forge.curate.admission import (
    ADD,
    NOOP,
    UPDATE,
    AdmissionPolicy,
    Admitted,
    HeuristicImportance,
    Importance,
    ImportanceScorer,
    LLMImportance,
    ValueChangeDetector,
    admit,
)
from forge.curate.changes import Change
from forge.curate.consolidate import (
    Candidate,
    Cluster,
    ClusterPlan,
    ClusterPolicy,
    Consolidation,
    ConsolidationPolicy,
    cluster_vectors,
    consolidate,
    link_sources,
)
from forge.curate.exposure import Exposure
from forge.curate.lifecycle import (
    DAY,
    EVICTION_ORDER,
    HALF_LIFE_DAYS,
    Belief,
    CurationPolicy,
    Plan,
    apply,
    believed_at,
    curate,
    plan,
    restore,
    strength,
    timeline,
)
from forge.curate.schedule import CurationSchedule
from forge.curate.seeds import (
    SEED_SOURCE,
    WarmUp,
    import_seed_pack,
    load_seed_pack,
    own,
    read_seed_pack,
)

__all__ = [
    "ADD",
    "DAY",
    "EVICTION_ORDER",
    "HALF_LIFE_DAYS",
    "NOOP",
    "SEED_SOURCE",
    "UPDATE",
    "AdmissionPolicy",
    "Admitted",
    "Belief",
    "Candidate",
    "Change",
    "Cluster",
    "ClusterPlan",
    "ClusterPolicy",
    "Consolidation",
    "ConsolidationPolicy",
    "CurationPolicy",
    "CurationSchedule",
    "Exposure",
    "HeuristicImportance",
    "Importance",
    "ImportanceScorer",
    "LLMImportance",
    "Plan",
    "ValueChangeDetector",
    "WarmUp",
    "admit",
    "apply",
    "believed_at",
    "cluster_vectors",
    "consolidate",
    "curate",
    "import_seed_pack",
    "link_sources",
    "load_seed_pack",
    "own",
    "plan",
    "read_seed_pack",
    "restore",
    "strength",
    "timeline",
]
