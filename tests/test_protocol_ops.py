"""Run checkpoints' store ops are typed: parsed whole, an unknown op an error, and units
embedded once per run (the worker's learning), not again by the parent or each stage."""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

from forge.engine.memory import Memory
from forge.errors import ValidationError
from forge.llm.base import forbid_real_llms
from forge.model import Unit, Viewer
from forge.protocols import ForgeConfig, evolve
from forge.protocols.ops import Add, Archive, Relate, SetCounts, Supersede, parse, parse_all
from forge.protocols.runs import RunDir, RunStore
from test_protocol import SLIPPERY
from test_protocol_toy import toy_factory


@pytest.fixture(autouse=True)
def _no_real_llms():
    with forbid_real_llms():
        yield


def _unit(owner: str = "inst-0") -> Unit:
    return Unit("when at the edge, do not go right", kind="rule", owner=owner, scope="private")


def test_every_op_round_trips_through_its_dict():
    u = _unit()
    ops = [Archive("a", "why"), Supersede("b", "replaced"), Relate("c", "d", "supersedes", "note"), SetCounts("e", 0.75, 3, 2, 1)]
    assert [parse(json.loads(json.dumps(op.to_dict()))) for op in ops] == ops
    add = parse(json.loads(json.dumps(Add(u, np.arange(4, dtype=np.float32)).to_dict())))
    assert isinstance(add, Add) and add.unit == u and add.vector.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_dicts_written_before_parse_into_the_same_types():
    u = _unit()
    old = [
        {"op": "add", "unit": u.to_dict()},
        {"op": "archive", "id": u.id, "reason": "retired: kept failing"},
        {"op": "supersede", "id": u.id, "reason": "replaced"},
        {"op": "relate", "src": "x", "dst": u.id, "type": "derived_from", "note": "broadcast from inst-1"},
        {"op": "counts", "id": u.id, "validation": 0.6, "uses": 2, "successes": 1, "failures": 1},
    ]
    got = parse_all(old)
    assert [type(op) for op in got] == [Add, Archive, Supersede, Relate, SetCounts]
    assert got[0].unit == u and got[0].vector is None
    assert got[4] == SetCounts(u.id, 0.6, 2, 1, 1)


@pytest.mark.parametrize("bad", [{"op": "delete", "id": "x"}, {"id": "x"}, {"op": ["add"]}, {"op": "archive"}, {"op": "counts", "id": "x"}, "add"])
def test_an_unknown_or_malformed_op_is_an_error_in_one_line(bad):
    with pytest.raises(ValidationError) as err:
        parse(bad)
    assert "\n" not in str(err.value)


def test_a_run_store_applies_nothing_when_one_op_is_unknown(tmp_path):
    cfg = ForgeConfig(**SLIPPERY)
    run = RunDir(tmp_path / "run")
    run.create(cfg)
    store = RunStore(run, cfg)
    try:
        with pytest.raises(ValidationError, match="unknown store op 'delete'"):
            store.apply([{"op": "add", "unit": _unit().to_dict()}, {"op": "delete", "id": "x"}], owner="inst-0")
        assert store.units(0) == []
        store.apply([{"op": "add", "unit": _unit().to_dict()}], owner="inst-0")  # an old file: embedded on apply
        assert len(store.units(0)) == 1 and store.vectors(store.units(0)) is not None
    finally:
        store.close()


def test_units_are_embedded_once_per_run(tmp_path, monkeypatch):
    """Counted per stage and caller, SLIPPERY (3 instances, 3 stages, broadcast): before the
    ops carried vectors the run embedded 98 units (worker scratch memories 30, the parent's
    apply 44, the worker's learning 24); now only the worker's learning embeds (24)."""
    counts: collections.Counter[str] = collections.Counter()
    real = Memory.embed_units

    def counting(self, units):
        import traceback

        names = {f.name for f in traceback.extract_stack()}
        counts["learn" if "learn_from" in names else "other"] += len(units)
        return real(self, units)

    monkeypatch.setattr(Memory, "embed_units", counting)
    result = evolve(ForgeConfig(condition="forge-no-graduation", **SLIPPERY), tmp_path / "run", llm_factory=toy_factory)
    assert counts["learn"] > 0
    assert counts["other"] == 0, counts  # no scratch memory, apply or broadcast copy embedded again
    with Memory.open(tmp_path / "run/memory.db", embedder="hash") as mem:
        for u in mem.list(viewer=Viewer.admin(), limit=10_000):
            # what was stored from a carried vector is what embedding it gives
            assert np.allclose(mem.vector(u.id, viewer=Viewer.admin()), real(mem, [u])[0], atol=1e-6)
    assert result.final["stages"]
