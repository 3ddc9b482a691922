"""The dashboard's Learned page (no browser): what agents learned, who received it, how it
fared, why it was retired; rules of evolution runs; and runs nested one level (the quick demo)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.errors import NotFoundError
from forge.model import Provenance, Rule, Unit
from forge.store import SQLiteStore
from server_support import make_setup

TestClient = pytest.importorskip("fastapi.testclient").TestClient


def _rule(when: str, avoid: str, **kw: Any) -> Unit:
    rule = Rule(when=when, avoid=(avoid,))
    meta = {"rule": rule.to_dict(), **kw.pop("meta", {})}
    return Unit(content=rule.text(), kind="rule", meta=meta, **kw)


def _learned(setup: Any) -> dict[str, str]:
    """alice learned two rules from outcomes; bob received a copy of the first; the second kept failing and was retired."""
    helps = _rule("tool refund_api returned rate_limited", "retry at once", owner="alice", scope="private",
                  provenance=Provenance(source="learned:alice", episodes=("ep-support-7",)), validation=0.8,
                  access_count=9, meta={"uses": 5, "successes": 4, "failures": 1, "recall_id": "rc-123"})
    fails = _rule("the customer asks for a refund", "escalate to billing", owner="alice", scope="private",
                  provenance=Provenance(source="learned:alice"), validation=0.2, meta={"uses": 6, "successes": 0, "failures": 6})
    copy = Unit(content=helps.content, kind="rule", owner="bob", scope="private", validation=0.6,
                provenance=Provenance(source="broadcast:alice", episodes=("ep-support-7",)),
                meta={"rule": helps.meta["rule"], "origin": "alice", "sender": "alice", "remote_id": helps.id, "uses": 2, "successes": 2})
    merged = Unit(content=helps.content, kind="rule", owner="carol", scope="private", provenance=Provenance(source="broadcast:alice"),
                  meta={"rule": helps.meta["rule"], "origin": "alice", "sender": "alice", "remote_id": "a-duplicate-merged-away"})
    fact = Unit(content="the refund API is rate limited to 5 calls a minute", kind="fact", owner="alice", scope="private")
    setup.memory.add([helps, fails, copy, merged, fact], actor="alice")
    setup.memory.set_status(fails.id, "archived", reason="credit: failed 6 of 6 uses (retire_failing)", actor="alice")
    return {"helps": helps.id, "fails": fails.id, "copy": copy.id}


def test_learned_page_shows_author_source_receivers_outcomes_and_why_retired(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    ids = _learned(setup)
    with TestClient(setup.app) as c:
        page = c.get("/ui/learned", headers=setup.h(setup.admin))
        assert page.status_code == 200
        html = page.text
        assert 'href="/ui/learned"' in html  # in the navigation
        assert "when tool refund_api returned rate_limited, do not retry at once" in html
        assert "ep-support-7" in html and "rc-123" in html  # from which episode and recall
        assert "4 succeeded, 1 failed" in html and "validation 0.80" in html
        row = html[html.index(f'data-unit="{ids["helps"]}"'):]
        row = row[: row.index("</tr>")]
        assert "bob" in row and "2/2 helped" in row  # who received it, and how it did there
        assert "carol" in row  # a copy of a duplicate the author's memory merged away: matched by author and text
        assert ">9<" in row  # recalled 9 times
        retired = html[html.index(f'data-unit="{ids["fails"]}"'):]
        assert "archived" in retired[: retired.index("</tr>")] and "failed 6 of 6 uses" in retired
        assert "5 calls a minute" not in html  # a fact is not something learned
        assert f'data-unit="{ids["copy"]}"' not in html  # a copy is shown under its original
        assert "2 learned (1 active, 1 retired) by 1 author; 2 copies received" in html

        only_retired = c.get("/ui/learned?status=retired", headers=setup.h(setup.admin)).text
        assert ids["fails"] in only_retired and f'data-unit="{ids["helps"]}"' not in only_retired
        assert ids["fails"] in c.get("/ui/learned?author=alice", headers=setup.h(setup.admin)).text
        assert 'id="no-learned"' in c.get("/ui/learned?author=carol", headers=setup.h(setup.admin)).text

        # bob sees only what he may: his received copy, its author named, not alice's private originals.
        mine = c.get("/ui/learned", headers=setup.h(setup.bob)).text
        assert f'data-unit="{ids["copy"]}"' in mine and ids["fails"] not in mine
        assert "a copy bob received from alice" in mine
        assert c.get("/ui/learned?run=x", headers=setup.h(setup.bob)).status_code == 403
    setup.memory.close()


def _run(root: Path, name: str, *, rules: list[Unit] = ()) -> Path:  # type: ignore[assignment]
    run = root.joinpath(*name.split("/"))
    run.mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"env": "frozenlake-random-4x4", "condition": name.rsplit("/", 1)[-1],
                                                 "representation": "rules", "llm": "test"}))
    if rules:
        mem = Memory(SQLiteStore(run / "memory.db"), HashingEmbedder(64))
        mem.add(list(rules), actor="forge")
        mem.close()
    return run


def test_runs_nested_one_level_are_listed_and_their_rules_shown(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    learned = _rule("down: hole", "move down", owner="inst-1", scope="private", provenance=Provenance(source="reflection", episodes=("e1",)),
                    meta={"uses": 3, "successes": 3})
    demo = _run(runs, "quick-demo-20261208/forge", rules=[learned])
    cfg = {"condition": "forge", "representation": "rules", "env": "frozenlake-random-4x4", "llm": "test", "instances": 2, "stages": 2, "attempts": 1}
    (demo / "final.json").write_text(json.dumps({
        "config": cfg, "evaluation": {"mean_return": 0.5, "success_rate": 0.5, "major_failure_rate": 0.0, "episodes": 2, "returns": [0, 1]},
        "tokens": {"training": {"total_tokens": 10}, "evaluation": {"total_tokens": 5}},
        "stages": [{"mean_checkpoint_return": 0.0, "graduated_total": 0}, {"mean_checkpoint_return": 0.5, "graduated_total": 1}],
        "champion": {"instance": 0, "memory": []}}))
    _run(runs, "quick-demo-20261208/zero-shot")
    _run(runs, "forge-1")
    (runs / "quick-demo-20261208" / "forge" / "checkpoints" / "deep").mkdir(parents=True)
    (runs / "quick-demo-20261208" / "forge" / "checkpoints" / "deep" / "config.json").write_text("{}")  # not a run: inside one
    (runs / "notes").mkdir()
    setup = make_setup(tmp_path, runs_dir=str(runs))
    with TestClient(setup.app) as c:
        names = [r["name"] for r in c.get("/v1/runs", headers=setup.h(setup.alice)).json()]
        assert names == ["forge-1", "quick-demo-20261208/forge", "quick-demo-20261208/zero-shot"]
        page = c.get("/ui/runs", headers=setup.h(setup.admin)).text
        assert "quick-demo-20261208/forge" in page and "No runs" not in page
        assert 'href="/ui/runs/quick-demo-20261208/forge/report"' in page
        service = setup.app.state.service
        assert service._run_dir("quick-demo-20261208/forge") == runs / "quick-demo-20261208" / "forge"
        for bad in ("..", "quick-demo-20261208/..", "quick-demo-20261208", "a/b/c", "quick-demo-20261208/forge/checkpoints", "/etc", ""):
            with pytest.raises(NotFoundError, match="no run named"):
                service._run_dir(bad)

        pytest.importorskip("matplotlib")
        report = c.get("/ui/runs/quick-demo-20261208/forge/report", headers=setup.h(setup.admin))
        assert report.status_code == 200 and "FORGE report" in report.text  # the Runs page's link, for a nested run

        html = c.get("/ui/learned?run=quick-demo-20261208/forge", headers=setup.h(setup.admin)).text
        assert "in run quick-demo-20261208/forge" in html
        assert "when down: hole, do not move down" in html and "inst-1" in html and "3 succeeded" in html
        assert "has no memory.db" in c.get("/ui/learned?run=forge-1", headers=setup.h(setup.admin)).text
        assert "no run named" in c.get("/ui/learned?run=../etc", headers=setup.h(setup.admin)).text
    setup.memory.close()


def test_learned_page_pages_newest_first(tmp_path: Path) -> None:
    setup = make_setup(tmp_path)
    setup.memory.add([_rule(f"situation number {i} of the test", f"action {i}", owner="alice", scope="private",
                            provenance=Provenance(source="learned:alice"), created_at=1_700_000_000 + i) for i in range(30)], actor="alice")
    with TestClient(setup.app) as c:
        first = c.get("/ui/learned", headers=setup.h(setup.admin)).text
        assert first.count("data-unit=") == 25 and "situation number 29" in first and "situation number 4 " not in first
        assert 'href="/ui/learned?page=2"' in first and "30 learned" in first
        second = c.get("/ui/learned?page=2", headers=setup.h(setup.admin)).text
        assert second.count("data-unit=") == 5 and "situation number 0 " in second
    setup.memory.close()
