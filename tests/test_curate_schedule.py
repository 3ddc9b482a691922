"""Curation on a schedule: one pass on demand, a background thread, and the service's switch."""

from __future__ import annotations

from pathlib import Path

import pytest

from forge.curate import CurationSchedule
from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.errors import ValidationError
from forge.model import Status, Unit, Viewer
from forge.store import SQLiteStore

T0 = 1_767_225_600.0
DAY = 86_400.0


def memory(tmp_path: Path) -> Memory:
    return Memory(SQLiteStore(tmp_path / "s.db"), HashingEmbedder(64))


def test_run_once_is_a_recorded_pass(tmp_path: Path) -> None:
    mem = memory(tmp_path)
    try:
        u = Unit("The old gate code is 1234.", created_at=T0)
        mem.add(u)
        sched = CurationSchedule(mem, every_s=60)
        plan = sched.run_once(now=T0 + 400 * DAY)
        assert plan is not None and plan.applied and sched.runs == 1 and sched.last is plan
        assert mem.get(u.id, viewer=Viewer.admin()).status is Status.ARCHIVED
        [ev] = mem.store.events(viewer=Viewer.admin(), ops=["curate"])
        assert ev.actor == "curate:schedule"
    finally:
        mem.close()


def test_a_failed_pass_is_kept_not_raised(tmp_path: Path) -> None:
    mem = memory(tmp_path)
    mem.add(Unit("x", created_at=T0))
    mem.close()  # every store call now fails
    sched = CurationSchedule(mem, every_s=60)
    assert sched.run_once(now=T0) is None
    assert sched.runs == 0 and len(sched.errors) == 1 and "\n" not in sched.errors[0]


def test_start_and_stop_without_waiting_for_a_pass(tmp_path: Path) -> None:
    mem = memory(tmp_path)
    try:
        with CurationSchedule(mem, every_s=3600) as sched:
            assert sched.running
        assert not sched.running and sched.runs == 0
    finally:
        mem.close()
    for bad in (0, -5, True, "1"):
        with pytest.raises(ValidationError):
            CurationSchedule(mem, every_s=bad)


def test_the_service_runs_it_while_it_serves(tmp_path: Path) -> None:
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from forge.server.app import create_app

    mem = memory(tmp_path)
    app = create_app(mem, curate_every=3600, close_memory=True)
    with TestClient(app):
        assert app.state.curation.running
    assert not app.state.curation.running
    (tmp_path / "plain").mkdir()
    plain = memory(tmp_path / "plain")
    try:
        assert create_app(plain).state.curation is None  # off unless asked for
    finally:
        plain.close()
