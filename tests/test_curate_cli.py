"""``forge curate`` (pass, dry run, restore, seed, timeline) and ``forge trace`` end to end."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from test_cli import run

LATER = time.time() + 400 * 86_400  # units are written now; the pass runs long after


@pytest.fixture
def db(tmp_path: Path) -> str:
    return str(tmp_path / "c.db")


def add(capsys, db: str, content: str, *extra: str) -> str:
    code, out, err = run(capsys, "--db", db, "--embedder", "hash", "--json", "add", content, *extra)
    assert code == 0, err
    return json.loads(out)["id"]


def status_of(capsys, db: str, uid: str) -> str:
    code, out, _ = run(capsys, "--db", db, "--json", "show", uid)
    assert code == 0
    return json.loads(out)["status"]


def test_dry_run_then_pass_then_restore(capsys, db: str) -> None:
    uid = add(capsys, db, "The old proxy listens on port 3128.")
    events = json.loads(run(capsys, "--db", db, "--json", "stats")[1])["events"]
    code, out, err = run(capsys, "--db", db, "curate", "--dry-run", "--now", str(LATER))
    assert code == 0, err
    assert f"would archive {uid} (decay)" in out and "nothing was changed" in out
    assert status_of(capsys, db, uid) == "active"
    assert json.loads(run(capsys, "--db", db, "--json", "stats")[1])["events"] == events
    code, out, _ = run(capsys, "--db", db, "--json", "curate", "--now", str(LATER))
    data = json.loads(out)
    assert code == 0 and data["applied"] and data["counts"] == {"decay": 1}
    assert status_of(capsys, db, uid) == "archived"
    code, out, _ = run(capsys, "--db", db, "curate", "restore", uid, "--reason", "still used")
    assert code == 0 and f"restored {uid}" in out and status_of(capsys, db, uid) == "active"
    code, _, err = run(capsys, "--db", db, "curate", "restore", uid)
    assert code == 2 and err.count("\n") == 1 and "not archived" in err


def test_caps_and_ttl_options(capsys, db: str) -> None:
    ids = [add(capsys, db, f"episode {i}: tried door {i}", "--kind", "episode") for i in range(3)]
    code, out, _ = run(capsys, "--db", db, "--json", "curate", "--dry-run", "--no-decay", "--cap-kind", "episode=1")
    plan = json.loads(out)
    assert code == 0 and plan["counts"] == {"cap": 2} and {c["unit_id"] for c in plan["changes"]} < set(ids)
    code, out, _ = run(capsys, "--db", db, "--json", "curate", "--dry-run", "--no-decay", "--ttl", "global=1", "--now", str(LATER))
    assert json.loads(out)["counts"] == {"ttl": 3}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cap-kind", "episode"], "--cap-kind takes KEY=VALUE"),
        (["--cap-kind", "gizmo=3"], "unknown kind 'gizmo'"),
        (["--half-life", "rule=soon"], "--half-life rule: 'soon' is not a float"),
        (["--archive-below", "2"], "archive_below must be in [0, 1)"),
        (["--now", "nan"], "now must be a finite time"),
        (["--consolidate", "--min-cluster", "1"], "min_size >= 2"),
    ],
)
def test_bad_options_are_one_line_errors(capsys, db: str, args: list[str], message: str) -> None:
    add(capsys, db, "anything")
    code, _, err = run(capsys, "--db", db, "curate", *args)
    assert code == 2 and err.count("\n") == 1 and message in err


def test_curate_on_a_missing_database_creates_nothing(capsys, tmp_path: Path) -> None:
    code, _, err = run(capsys, "--db", str(tmp_path / "none.db"), "curate", "--dry-run")
    assert code == 2 and "no such database" in err and not (tmp_path / "none.db").exists()


def test_seed_import_and_a_malformed_pack(capsys, db: str, tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    good.write_text(json.dumps({"content": "When lost, then go back to the last known tile."}) + "\n")
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"content": "fine"}) + "\n{oops\n")
    code, _, err = run(capsys, "--db", db, "--embedder", "hash", "curate", "seed", str(bad))
    assert code == 2 and err.count("\n") == 1 and "bad.jsonl:2: malformed JSON" in err
    assert not Path(db).exists()  # checked before the store is opened: no half-written state
    code, out, err = run(capsys, "--db", db, "--embedder", "hash", "curate", "seed", str(good), "--scope", "group:ops")
    assert code == 0, err
    assert "1 seeds from" in out and "add 1" in out
    code, out, _ = run(capsys, "--db", db, "--json", "recall", "lost tile")
    [hit] = json.loads(out)
    code, out, _ = run(capsys, "--db", db, "--json", "show", hit["id"])
    unit = json.loads(out)
    assert unit["provenance"]["source"] == "seed" and unit["validation"] == 0.3 and unit["scope"] == "group:ops"


def test_timeline_and_trace(capsys, db: str, tmp_path: Path) -> None:
    pack = tmp_path / "p.jsonl"
    pack.write_text(
        json.dumps({"content": "The door code of room 12 is 4411.", "kind": "fact"}) + "\n"
        + json.dumps({"content": "The door code of room 12 is 9032.", "kind": "fact"}) + "\n"
    )
    code, out, err = run(capsys, "--db", db, "--embedder", "hash", "--json", "curate", "seed", str(pack))
    assert code == 0, err
    old, new = (d["unit_id"] for d in json.loads(out)["decisions"])
    assert [d["action"] for d in json.loads(out)["decisions"]] == ["add", "update"]
    code, out, _ = run(capsys, "--db", db, "curate", "timeline", new)
    assert code == 0 and out.index(old) < out.index(new) and "superseded" in out
    code, out, _ = run(capsys, "--db", db, "trace", new)
    assert code == 0 and f"{new} -[supersedes]-> {old}" in out and "made by: source=seed" in out
    code, out, _ = run(capsys, "--db", db, "--json", "trace", old)
    t = json.loads(out)
    assert t["unit"]["status"] == "superseded" and [e["op"] for e in t["history"]][:1] == ["add"]
    code, _, err = run(capsys, "--db", db, "trace", "nope")
    assert code == 2 and "no unit" in err


def test_curate_and_trace_work_on_the_demo_data(capsys, tmp_path: Path) -> None:
    code, _, err = run(capsys, "--embedder", "hash", "demo", "--dir", str(tmp_path / "demo"))
    assert code == 0, err
    db = str(tmp_path / "demo" / "demo.db")
    code, out, err = run(capsys, "--db", db, "--json", "curate", "--dry-run", "--consolidate", "--now", str(LATER))
    plan = json.loads(out)
    assert code == 0, err
    assert plan["scanned"] > 10 and not plan["applied"] and plan["counts"].get("decay", 0) > 0
    code, out, _ = run(capsys, "--db", db, "trace", "r-ice")
    assert code == 0 and out.startswith("r-ice [rule] active") and "made by: source=sample" in out


def test_add_through_admission(capsys, db: str) -> None:
    first = add(capsys, db, "The staging proxy is at 10.0.0.5.", "--admit")
    code, out, err = run(capsys, "--db", db, "--embedder", "hash", "--json", "add", "the staging proxy is at 10.0.0.5.", "--admit")
    data = json.loads(out)
    assert code == 0, err
    assert data["id"] == first and data["admission"]["action"] == "noop" and "same text" in data["admission"]["reason"]
    code, out, err = run(capsys, "--db", db, "add", "The staging proxy is at 10.0.0.9.", "--admit")
    assert code == 0 and f"updated {first}" in err and "it contradicts " + first in err  # the id on stdout, the decision on stderr
    assert status_of(capsys, db, first) == "superseded"
