"""One definition of each shared concept: the representations, the id scheme, the success rule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import forge.learn.reflect
import forge.protocols
import forge.protocols.config
from forge.curate import ConsolidationPolicy, consolidate, import_seed_pack
from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.learn.rules import write as write_rule
from forge.model import Scope, Unit, Viewer, derived_id
from forge.store import Filter, SQLiteStore
from forge.team import Action, Outcome, TaskLesson, TeamMemory
from forge.team import consolidate as team_consolidate


def test_the_representations_are_defined_once_in_learn() -> None:
    assert forge.protocols.config.REPRESENTATIONS is forge.learn.reflect.REPRESENTATIONS
    assert forge.protocols.REPRESENTATIONS is forge.learn.reflect.REPRESENTATIONS


# -- one id scheme -------------------------------------------------------------------------
# The ids below were written by the four schemes FORGE had before forge.model.derived_id
# (team, consolidation, seeds, LangGraph). They are persisted (a resumed team run, a rerun
# consolidation, a re-imported seed pack, a LangGraph key all find their unit by its id),
# so the one scheme must give exactly these.


def test_derived_id_is_deterministic_prefixed_and_total() -> None:
    a = derived_id("x", "one", 2, Scope.parse("group:ops"))
    assert a == derived_id("x", "one", 2, "group:ops") and a.startswith("x:") and len(a) == 22
    assert a != derived_id("x", "one", 3, "group:ops") and a[2:] != derived_id("y", "one", 2, "group:ops")[2:][::-1]
    assert derived_id("y", "one", 2, "group:ops") == "y:" + a[2:]  # the prefix names, the parts identify
    assert derived_id("x", "bad \udc80 text").startswith("x:")  # any text gets an id
    lg = derived_id("lg", "k", algorithm="sha256", digits=32, sep="-")
    assert lg.startswith("lg-") and len(lg) == 35


def test_team_ids_are_the_ones_written_before(tmp_path: Path) -> None:
    with Memory.open(tmp_path / "t.db", embedder="hash") as m:
        tm = TeamMemory(m, team="red", agents=["dba"], layout="shared")
        rule = write_rule("You are at row 1, col 0", "down", ["right"])
        rec = tm.record_task(
            task="orders updates hang", outcome=Outcome(success=True, score=1.0), actions=[Action("dba", "SELECT 1")],
            team=["dba"], task_type="locks", lesson=TaskLesson(("Check pg_locks first.",), None, "test"), rules=[rule],
        )
        assert rec.episode_units == ("episode:1b06a589f7e430abe161",)
        assert rec.rule_units == ("rule:ab6fc69f18e89303cd18",)
        tm.record_task(
            task="users updates hang", outcome=Outcome(success=True, score=1.0), actions=[Action("dba", "SELECT 1")],
            team=["dba"], task_type="locks", lesson=TaskLesson(("Check pg_locks first.",), None, "test"),
        )
        [c] = team_consolidate(tm).generalised
        assert c.procedure == "procedure:0432d2107034b1c40b0f"


def test_consolidation_seed_and_langgraph_ids_are_the_ones_written_before(tmp_path: Path) -> None:
    with Memory(SQLiteStore(tmp_path / "c.db"), HashingEmbedder(256)) as m:
        disk = "When the disk is full, then rotate the logs and compress them"
        m.add([Unit(f"{disk}{end}", id=f"r{i}", kind="rule", created_at=1.0 + i) for i, end in enumerate([".", " quickly.", " today."])])
        [c] = consolidate(m, policy=ConsolidationPolicy(subsume_at=1.0), now=10.0).generalised
        assert c.unit_id == "gen:ee6cfbae166ac3b54426"
        pack = tmp_path / "pack.jsonl"
        pack.write_text(json.dumps({"content": "When the tile ahead is a hole, then step around it."}) + "\n")
        import_seed_pack(m, pack, scope="group:ops")
        [seed] = [u.id for u in m.list(viewer=Viewer.admin(), filter=Filter.make(kinds=["rule"])) if u.id.startswith("seed:")]
        assert seed == "seed:c6f04b315adc3010d4c3"
    pytest.importorskip("langgraph")
    from forge.integrations.langgraph import ForgeStore

    with Memory(SQLiteStore(tmp_path / "lg.db"), HashingEmbedder(128)) as m:
        ForgeStore(m, agent="planner").put(("users", "ann"), "prefs", {"content": "likes short answers"})
        [u] = m.list(viewer=Viewer.admin())
        assert u.id == "lg-f9b98e46ccd782533170636f9d3785d2"
