"""Smoke test for the benchmarks in bench/: they run on tiny inputs and report sane shapes.

Benchmarks print figures and assert nothing; this only checks that the code paths work,
with the hashing embedder so no model is loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import curation  # noqa: E402
import ingest  # noqa: E402
import learning  # noqa: E402
import lifecycle  # noqa: E402
import locomo  # noqa: E402
from _common import Mixture, exact_topk, percentiles_ms, recall_at_k  # noqa: E402


def test_locomo_fixture_is_valid_locomo_format() -> None:
    data = json.loads(locomo.DEFAULT_DATA.read_text())
    assert isinstance(data, list) and len(data) >= 2
    turns = qa = 0
    cats: set[int] = set()
    for sample in data:
        conv = sample["conversation"]
        assert {"speaker_a", "speaker_b"} <= set(conv)
        ids = set()
        for n, date, session in locomo.sessions(conv):
            assert date and locomo._parse_date(date) is not None, f"session {n} has no parsable date"
            for t in session:
                assert {"speaker", "dia_id", "text"} <= set(t)
                assert t["speaker"] in (conv["speaker_a"], conv["speaker_b"])
                ids.add(t["dia_id"])
                turns += 1
        for item in sample["qa"]:
            assert {"question", "answer", "evidence", "category"} <= set(item)
            assert item["evidence"] and set(item["evidence"]) <= ids, item["question"]
            cats.add(item["category"])
            qa += 1
    assert turns >= 150 and qa >= 40
    assert cats == {1, 2, 3, 4, 5}


def test_locomo_bench_runs_with_hashing_embedder() -> None:
    r = locomo.run(embedder="hash")
    assert r["bench"] == "locomo" and r["embedder"] == "hash:256"
    assert r["units"] >= 150 and r["questions"] >= 40 and r["skipped_no_evidence"] == 0
    cats = r["by_category"]
    assert set(cats) == {"multi-hop", "temporal", "open-domain", "single-hop", "adversarial", "overall"}
    assert cats["overall"]["n"] == r["questions"]
    for row in cats.values():
        for mode in locomo.MODES:
            assert 0.0 <= row[f"{mode}@5"] <= row[f"{mode}@10"] <= 1.0
    assert cats["overall"]["hybrid@10"] > 0
    assert "overall" in locomo.render(r)


@pytest.mark.slow
def test_locomo_bench_runs_on_postgres_and_leaves_no_schema_behind(pg_server) -> None:
    r = locomo.run(embedder="hash", db=pg_server.base_url)
    assert r["backend"] == "postgres" and r["questions"] >= 40
    assert 0 < r["by_category"]["overall"]["hybrid@10"] <= 1.0
    with pg_server.admin() as conn:
        left = conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'locomo_%'").fetchall()
    assert left == []


def test_locomo_accepts_other_files(tmp_path: Path) -> None:
    sample = {
        "sample_id": "x",
        "conversation": {
            "speaker_a": "Ann",
            "speaker_b": "Bo",
            "session_1_date_time": "1:00 pm on 2 March, 2024",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "My cat Pixel knocked the vase over."},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "Oh no, was it the blue one?", "blip_caption": "a vase"},
            ],
        },
        "qa": [
            {"question": "What is the name of Ann's cat?", "answer": "Pixel", "evidence": ["D1:1; D1:2"], "category": 4},
            {"question": "Unanswerable?", "adversarial_answer": "x", "evidence": [], "category": 5},
        ],
    }
    path = tmp_path / "one.json"
    path.write_text(json.dumps(sample))
    r = locomo.run(path, embedder="hash:64")
    assert r["samples"] == 1 and r["units"] == 2
    assert r["questions"] == 1 and r["skipped_no_evidence"] == 1
    assert r["per_question"][0]["evidence"] == ["D1:1", "D1:2"]


@pytest.mark.slow
def test_ingest_bench_runs_tiny(tmp_path: Path) -> None:
    r = ingest.run(300, 40, embedder="hash", workdir=tmp_path)
    assert [x["units"] for x in r["precomputed"]] == [300, 300]
    for row in r["precomputed"]:
        assert row["add_units_per_s"] > 0 and row["total_units_per_s"] > 0
    assert r["embedded"]["units"] == 40 and r["embedded"]["memory_add_units_per_s"] > 0
    assert "Memory.add" in ingest.render(r)
    assert not list(tmp_path.iterdir())  # its temporary files are gone


def test_common_helpers() -> None:
    mix = Mixture(n_clusters=20)
    a, _ = mix.corpus(9_995, 10)  # spans two generation blocks
    b, _ = mix.corpus(10_000, 5)
    assert a.shape == (10, 384) and b.tobytes() == a[5:].tobytes()
    assert abs(float(a[0] @ a[0]) - 1.0) < 1e-5
    q, _ = mix.queries(4)
    truth = exact_topk(lambda: iter([(0, a[:5]), (5, a[5:])]), q, 3)
    brute = (q @ a.T).argsort(axis=1)[:, ::-1][:, :3]
    assert truth.tolist() == brute.tolist()
    assert recall_at_k(truth.tolist(), truth, 3) == 1.0
    assert percentiles_ms([0.001, 0.002, 0.003])["p50_ms"] == pytest.approx(2.0)


@pytest.mark.slow
def test_poisoning_bench_runs_and_reports_the_labelled_set() -> None:
    import poisoning

    res = poisoning.screen_set()
    fams = res["families"]
    assert fams["attack:ALL"]["heldout"][1] >= 100 and fams["benign:ALL"]["heldout"][1] >= 100
    out = poisoning.run(n_agents=3, n_rules=3, policy_name="confidence", embedder_spec="hash", seed=1)
    assert out["attacks"]["replay"]["stopped"] == 1.0 and out["attacks"]["tampered"]["stopped"] == 1.0
    assert out["attacks"]["injection"]["stopped"] == 1.0


def _one_per_file(sid: str) -> dict:
    """A conversation in the zip's layout: sessions at the top level, no 'conversation' key."""
    return {
        "speaker_a": "Ann",
        "speaker_b": "Bo",
        "session_1_date_time": "1:00 pm on 2 March, 2024",
        "session_1": [
            {"speaker": "Ann", "dia_id": "D1:1", "text": f"My cat {sid} knocked the vase over."},
            {"speaker": "Bo", "dia_id": "D1:2", "text": "Oh no, was it the blue one?"},
        ],
        "qa": [{"question": f"What is the name of Ann's cat {sid}?", "answer": sid, "evidence": ["D1:1"], "category": 4}],
    }


def test_locomo_reads_both_public_layouts(tmp_path: Path) -> None:
    import zipfile

    folder = tmp_path / "locomo10_v2"
    folder.mkdir()
    for sid in ("26", "30", "41", "42"):
        (folder / f"{sid}.json").write_text(json.dumps(_one_per_file(sid)))
    listed = tmp_path / "locomo10.json"
    listed.write_text(json.dumps([{"sample_id": f"conv-{sid}", "conversation": {k: v for k, v in _one_per_file(sid).items() if k != "qa"},
                                   "qa": _one_per_file(sid)["qa"]} for sid in ("26", "30", "41", "42")]))
    zipped = tmp_path / "locomo10.zip"
    with zipfile.ZipFile(zipped, "w") as z:
        for f in sorted(folder.iterdir()):
            z.write(f, f"data/multimodal_dialog/locomo10_v2/{f.name}")
    from_dir, from_zip, from_list = (locomo.load(p) for p in (folder, zipped, listed))
    assert [s["sample_id"] for s in from_dir] == ["26", "30", "41", "42"] == [s["sample_id"] for s in from_zip]
    assert [s["sample_id"] for s in from_list] == ["conv-26", "conv-30", "conv-41", "conv-42"]
    assert from_dir[0]["conversation"]["session_1"] == from_list[0]["conversation"]["session_1"]
    # held-out split: the tuning half never overlaps the test half
    assert [s["sample_id"] for s in locomo.split(from_zip, "tune")] == ["26", "30"]
    r = locomo.run(zipped, embedder="hash:64")
    assert r["split"] == "test" and r["split_samples"] == ["41", "42"] and r["tune_samples"] == ["26", "30"]
    assert r["questions"] == 2 and r["by_category"]["overall"]["bm25@10"] == 1.0
    parts = [locomo.run(zipped, embedder="hash:64", only=[sid]) for sid in ("42", "41")]
    merged = locomo.merge(parts)
    assert merged["split_samples"] == ["41", "42"] and merged["by_category"] == r["by_category"]
    with pytest.raises(SystemExit, match="appears in two runs"):
        locomo.merge([parts[0], parts[0]])


def test_locomo_context_goes_into_the_index_not_the_content(tmp_path: Path) -> None:
    from forge import Memory
    from forge.engine.embed import HashingEmbedder
    from forge.model import Viewer
    from forge.store import SQLiteStore

    sample = locomo.load(_write(tmp_path, _one_per_file("Pixel")))[0]
    mem = Memory(SQLiteStore(":memory:"), HashingEmbedder(64))
    locomo.ingest(mem, sample, context=("speaker", "date", "prev"))
    second = mem.get("7:D1:2", viewer=Viewer.admin())
    assert second.content == "Bo: Oh no, was it the blue one?"
    assert "Ann: My cat Pixel" in second.meta["search_context"] and "(2 March 2024)" in second.meta["search_context"]
    hits = mem.store.keyword_search("vase", k=5, viewer=Viewer.admin())
    assert {h.id for h in hits} == {"7:D1:1", "7:D1:2"}  # the reply is found through its window
    mem.close()


def _write(tmp_path: Path, obj: dict) -> Path:
    p = tmp_path / "7.json"
    p.write_text(json.dumps(obj))
    return p


def test_locomo_rejects_files_that_are_not_locomo(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"hello": 1}]))
    with pytest.raises(SystemExit, match="not a LoCoMo sample"):
        locomo.load(bad)


@pytest.mark.slow
def test_curation_bench_runs_and_curation_helps_on_its_stream() -> None:
    r = curation.run(writes=300, queries=40, pass_sizes=(200,))
    off, on = r["off"], r["on"]
    assert off["active"] == 300 and on["active"] < off["active"]
    assert on["duplicate_rate"] < off["duplicate_rate"] and on["false_recall_share"] <= off["false_recall_share"]
    assert set(on["actions"]) >= {"add", "noop", "update"} and r["pass"][0]["units"] == 200
    assert "Curation off vs on" in curation.render(r)


@pytest.mark.slow
def test_lifecycle_bench_checks_the_issue_targets_side_by_side() -> None:
    r = lifecycle.run(writes=400, queries=40)
    off, on = r["off"], r["on"]
    assert off["duplicates"] > 0 and on["duplicates"] < off["duplicates"] and on["stored"] < off["stored"]
    assert [t["target"] for t in r["targets"]][0].startswith(">= 90% fewer duplicates")
    cut = r["targets"][0]
    assert cut["value"] == 1 - on["duplicates"] / off["duplicates"] and cut["met"] == (cut["value"] >= 0.9)
    text = lifecycle.render(r)
    assert "Targets with curation on" in text and "ms per write p50 over a bare add" in text


@pytest.mark.slow
def test_learning_bench_has_a_cold_start_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Plumbing only (the scripted model): forge/rules with the seed pack beside forge/rules without."""
    learning.main(["--llm", "test", "--quick", "--env", "frozenlake-4x4", "--condition", "forge", "--seeds", "1",
                   "--seed-pack", str(BENCH / "data/frozenlake_seeds.jsonl"), "--out", str(tmp_path), "--json"])
    cells = json.loads(capsys.readouterr().out)["cells"]
    assert [c["representation"] for c in cells] == ["rules", "rules+seed-pack"]
    assert (tmp_path / "frozenlake-4x4-forge-rules-seeded-seed0/events.jsonl").read_text().count('"seeded"') == 1


def test_learning_bench_states_what_a_cell_can_show() -> None:
    """The success ceiling is the optimal policy's: exact for the deterministic grids, and the
    known value-iteration figure for slippery FrozenLake (4.1% in 10 steps, 74% in 100)."""
    assert learning.success_ceiling("frozenlake-4x4", 10) == 1.0
    assert learning.success_ceiling("cliffwalking", 12) == 0.0  # the shortest path is 13 steps
    assert learning.success_ceiling("cliffwalking", 13) == 1.0
    assert learning.success_ceiling("frozenlake-4x4-slippery", 10) == pytest.approx(0.0414, abs=1e-4)
    assert learning.success_ceiling("frozenlake-4x4-slippery", 100) == pytest.approx(0.744, abs=1e-3)
    assert learning.success_ceiling("textarena:TowerOfHanoi-v0", 10) is None


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads CPU times from /proc")
def test_service_bench_counts_the_cpu_of_a_process_and_its_children() -> None:
    import service

    burn = "import time\nwhile time.process_time() < 0.4: pass\nprint('ready', flush=True)\ntime.sleep(120)"
    with subprocess.Popen([sys.executable, "-c", burn], stdout=subprocess.PIPE, text=True) as child:
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            assert service.cpu_seconds(child.pid) >= 0.38  # CPU time, not wall time: holds on a loaded machine
            own = time.process_time()
            assert service.cpu_seconds(os.getpid()) >= own + 0.38 - 0.05  # this process and its descendants
        finally:
            child.kill()
    assert service.cpu_seconds(child.pid) == 0.0  # gone: nothing to count, no error


@pytest.mark.slow
def test_ann_choice_compares_filtered_exact_search_methods() -> None:
    import importlib.util

    import ann_choice

    libs = () if importlib.util.find_spec("faiss") else ("usearch",)
    r = ann_choice.filtered(3_000, 8, libs=libs)
    got = {row["method"]: row for row in r["rows"]}
    assert {"usearch get_many", "f32 copy", "i8 copy, re-score 40", "store (shipped)"} <= set(got)
    assert got["store (shipped)"]["recall@10"] == 1.0 and got["f32 copy"]["recall@10"] == 1.0
    assert got["i8 copy, re-score 40"]["copy_bytes_per_vector"] == 384
    assert all(0.0 <= row["recall@10"] <= 1.0 and row["cpu_p50_ms"] >= 0 for row in r["rows"])
    assert "filtered exact search" in ann_choice.render_filtered(r)


@pytest.mark.slow
def test_cage2_protocols_keep_their_runs_and_refuse_other_settings(tmp_path: Path) -> None:
    """bench/cage2.py --protocols on the CAGE-2 stand-in: a cell kept in --out is read back,
    not played again (an hour-long cell can be split over calls), and other settings there
    are refused with one line."""
    cmd = [sys.executable, str(BENCH / "cage2.py"), "--protocols", "--env", "minicage", "--llm", "test:walker",
           "--run-seeds", "0", "--steps", "6", "--instances", "2", "--stages", "1", "--attempts", "1",
           "--conditions", "zero-shot", "--out", str(tmp_path), "--json"]
    first = subprocess.run(cmd, capture_output=True, text=True, check=True)
    events = (tmp_path / "zero-shot-seed0" / "events.jsonl").read_text()
    again = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert json.loads(again.stdout)["protocols"] == json.loads(first.stdout)["protocols"]
    assert (tmp_path / "zero-shot-seed0" / "events.jsonl").read_text() == events  # nothing replayed
    assert json.loads(first.stdout)["ordering_met"] is None  # one condition cannot order three
    other = subprocess.run([*cmd[:-3], "--steps", "7", *cmd[-3:]], capture_output=True, text=True)
    assert other.returncode != 0 and other.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "other settings" in other.stderr


@pytest.mark.slow
def test_lifelong_keeps_its_modes_and_refuses_other_settings(tmp_path: Path) -> None:
    """bench/lifelong.py with --out: a finished mode is read back, not played again (a
    TextWorld stream is hours on two cores, so it is split over calls), and a run there
    with other settings is refused with one line instead of being mixed into the table."""
    cmd = [sys.executable, str(BENCH / "lifelong.py"), "--quick", "--llm", "test", "--tasks", "2",
           "--modes", "local", "--sizes", "", "--out", str(tmp_path), "--json"]
    first = subprocess.run(cmd, capture_output=True, text=True, check=True)
    events = {m: (tmp_path / f"mode-{m}" / "events.jsonl").read_text() for m in ("none", "local")}
    again = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "resuming" in again.stderr
    drop = ("seconds",)
    rows = [[{k: v for k, v in r.items() if k not in drop} for r in json.loads(out)["modes"]] for out in (first.stdout, again.stdout)]
    assert rows[0] == rows[1] and [r["memory"] for r in rows[0]] == ["none", "local"]
    assert all(r["task_seconds"] > 0 for r in rows[1])  # the tasks' time, though this call played none
    assert {m: (tmp_path / f"mode-{m}" / "events.jsonl").read_text() for m in ("none", "local")} == events
    other = subprocess.run([*cmd[:-5], "--seed", "1", *cmd[-5:]], capture_output=True, text=True)
    assert other.returncode != 0 and other.stderr.strip().splitlines()[-1].startswith("error: ")
    assert "other settings (seed)" in other.stderr
    (tmp_path / "mode-local" / "config.json").write_text("{not json")
    damaged = subprocess.run(cmd, capture_output=True, text=True)
    assert damaged.returncode != 0 and "Traceback" not in damaged.stderr
    assert damaged.stderr.strip().splitlines()[-1].startswith("error: ") and "config.json" in damaged.stderr
    (tmp_path / "file").write_text("x")
    not_dir = subprocess.run([*cmd[:-2], str(tmp_path / "file"), "--json"], capture_output=True, text=True)
    assert not_dir.returncode != 0 and not_dir.stderr.strip() == f"error: --out {tmp_path / 'file'} is not a directory"


def test_the_probe_states_cache_reads_each_text_once_and_survives_a_restart(tmp_path: Path) -> None:
    """bench/poisoning.py's cache of the 1.5B's hidden states: a text read twice costs one
    forward pass, other questions or texts are other entries, and a new process reads back
    what the last one saved (so --fit and --screen-only --probe share a machine's passes)."""
    import numpy as np

    import poisoning

    class Fake:
        def __init__(self) -> None:
            self.calls = 0

        def __call__(self, text, *, around, spans):
            self.calls += 1
            v = np.full(4, float(len(text) + len(around[0])), dtype=np.float32)
            return v, -v, np.stack([v + i for i in range(len(spans))]) if spans else np.zeros((0, 4), dtype=np.float32)

    path = tmp_path / "states.npz"
    cache = poisoning.CachedStates(path=path)
    cache._reader = fake = Fake()
    a = cache("one text", around=("Q:", "?"))
    b = cache("one text", around=("Q:", "?"))
    cache("one text", around=("Other question:", "?"))
    assert fake.calls == 2 and (cache.passes, cache.hits) == (2, 1)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], -a[0])
    cache.save()
    again = poisoning.CachedStates(path=path)
    again._reader = fresh = Fake()
    mean, last = again("one text", around=("Q:", "?"))
    assert fresh.calls == 0 and again.hits == 1 and np.array_equal(mean, a[0]) and np.array_equal(last, a[1])
    # a text of several clauses keeps one mean per clause, read back after a restart too
    from forge.share.screen import clause_spans

    steps = "Deploy checklist. Run the tests first; then tag the release. Finally notify the team on call."
    spans = clause_spans(steps)
    assert len(spans) == 3
    _, _, rows = again(steps, around=("Q:", "?"), spans=spans)
    again.save()
    _, _, back = poisoning.CachedStates(path=path)(steps, around=("Q:", "?"), spans=spans)
    assert rows.shape == back.shape == (3, 4) and np.array_equal(rows, back)


def test_transfer_evaluates_only_on_held_out_seeds_and_counts_replayed_episodes_once(tmp_path: Path) -> None:
    """bench/transfer.py: every cell trains on training seeds and is scored on seeds none of
    them is; and two frozen instances that decide alike play the same episode on a seed, so
    the report's distinct count is half its episodes, not all of them (a cell of 2 x 5
    looks like 10 samples and is 5)."""
    import transfer

    out = tmp_path / "runs"
    transfer.main(["--llm", "test", "--quick", "--envs", "frozenlake-random-4x4", "--conditions", "zero-shot",
                   "--run-seeds", "0", "--out", str(out), "--json"])
    cfg = json.loads((out / "frozenlake-random-4x4-zero-shot-rules-seed0" / "config.json").read_text())
    assert cfg["eval_seeds"] and not set(cfg["eval_seeds"]) & set(cfg["train_seeds"])
    played = {r["seed"] for p in (out / "frozenlake-random-4x4-zero-shot-rules-seed0" / "checkpoints" / "eval").glob("inst-*.json")
              for r in json.loads(p.read_text())["results"]}
    assert played == set(cfg["eval_seeds"])
    rec = transfer.decisions(out / "frozenlake-random-4x4-zero-shot-rules-seed0")
    assert rec["distinct_episodes"] == 5 and rec["decisions"] > 5
    # the same seed with other actions is another episode
    inst = out / "frozenlake-random-4x4-zero-shot-rules-seed0" / "checkpoints" / "eval" / "inst-01.json"
    data = json.loads(inst.read_text())
    data["episodes"][0]["steps"][0]["action"] = "a move the other instance never made"
    inst.write_text(json.dumps(data))
    assert transfer.decisions(out / "frozenlake-random-4x4-zero-shot-rules-seed0")["distinct_episodes"] == 6


def test_transfer_merges_cells_run_apart_into_one_table_with_ratios(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A TextWorld grid is hours of 2 cores, so its cells run one process each; --merge puts
    them in one table and computes FORGE's ratios across them. Results run under different
    settings are refused: their ratio would compare unlike runs."""
    import transfer

    common = ["--llm", "test", "--envs", "frozenlake-random-4x4", "-s", "1", "-k", "1", "--eval-episodes", "2",
              "--max-steps", "6", "--run-seeds", "0", "--json"]
    paths = []
    for cond, n in (("zero-shot", "1"), ("forge/rules", "2"), ("reflexion/rules", "2")):
        transfer.main([*common, "--conditions", cond, "-n", n])
        paths.append(tmp_path / f"{cond.replace('/', '-')}.json")
        paths[-1].write_text(capsys.readouterr().out)
    transfer.main(["--merge", *map(str, paths), "--json"])
    merged = json.loads(capsys.readouterr().out)
    assert [c["label"] for c in merged["cells"]] == ["zero-shot", "forge/rules", "reflexion/rules"]
    assert [c["instances"] for c in merged["cells"]] == [1, 2, 2] and merged["instances"] == [1, 2]
    (ratio,) = merged["ratios"]
    forge, zero = merged["cells"][1], merged["cells"][0]
    assert ratio["success_above_reflexion"] == (forge["success"] > merged["cells"][2]["success"])
    if zero["success"]:
        assert ratio["success_vs_zero_shot"] == pytest.approx(forge["success"] / zero["success"])
    transfer.main(["--merge", *map(str, paths)])
    assert "N=1/2" in capsys.readouterr().out
    # without Reflexion its two targets have no verdict: "not run", never "missed"
    transfer.main(["--merge", *map(str, paths[:2]), "--json"])
    (alone,) = json.loads(capsys.readouterr().out)["ratios"]
    assert alone["meets"]["above_reflexion"] is None and alone["meets"]["tokens_per_success"] is None
    transfer.main(["--merge", *map(str, paths[:2])])
    assert "above_reflexion=not run tokens_per_success=not run" in capsys.readouterr().out
    other = json.loads(paths[0].read_text()) | {"stages": 3}
    paths[0].write_text(json.dumps(other))
    with pytest.raises(SystemExit, match="differ in stages"):
        transfer.main(["--merge", *map(str, paths)])
    with pytest.raises(SystemExit, match=r"run seed \[0\] is in two results"):
        transfer.main(["--merge", str(paths[1]), str(paths[1])])
    # hostile files: one line, no traceback
    bad = tmp_path / "bad.json"
    for text, says in (("[1, 2]", "not a bench/transfer.py --json result"), ("nope", "bad.json"),
                       ('{"cells": [{"env": 1}]}', "lacks")):
        bad.write_text(text)
        with pytest.raises(SystemExit, match=says):
            transfer.main(["--merge", str(bad)])
    # the same cell run one run seed at a time joins into one cell over both seeds
    transfer.main([*common[:-3], "--run-seeds", "1", "--json", "--conditions", "forge/rules", "-n", "2"])
    seed1 = tmp_path / "forge-rules-seed1.json"
    seed1.write_text(capsys.readouterr().out)
    transfer.main(["--merge", str(paths[1]), str(seed1), "--json"])
    (cell,) = json.loads(capsys.readouterr().out)["cells"]
    rates = [r["success_rate"] for r in cell["runs"]]
    assert cell["run_seeds"] == [0, 1] and cell["success"] == pytest.approx(sum(rates) / 2)
    assert cell["episodes"] == sum(r["episodes"] for r in cell["runs"])


def test_online_stream_is_distinct_unseen_tasks_split_between_three_agents() -> None:
    """bench/online.py: at least 40 distinct tasks, none on a seed any run trains or is judged
    on, the envs in equal shares, each task played by one of three agents, in an order the
    run seed draws; its agent loop imports nothing of FORGE's but the client, the task world
    and the public types and errors the client speaks."""
    import ast

    import online
    import online_agent
    from forge.envs.textworld import held_out_seeds, train_seeds

    tasks = online.stream(online.ENVS, 42, 0)
    assert len({(t["env"], t["seed"]) for t in tasks}) == 42 and [t["index"] for t in tasks] == list(range(42))
    assert {t["env"] for t in tasks} == set(online.ENVS) and all(sum(t["env"] == e for t in tasks) == 14 for e in online.ENVS)
    for family in ("coin", "treasure"):
        seen = set(train_seeds(family)) | set(held_out_seeds(family))
        assert not seen & {t["seed"] for t in tasks if t["env"].startswith(f"textworld:{family}")}
    assert all(t["seed"] >= online.FIRST_SEED for t in tasks)
    assert [sum(t["agent"] == a for t in tasks) for a in online.AGENTS] == [14, 14, 14]
    assert tasks != online.stream(online.ENVS, 42, 1) and tasks == online.stream(online.ENVS, 42, 0)

    lo, hi = online.wilson(10, 20)
    assert lo < 0.5 < hi and online.wilson(0, 0) == (0.0, 0.0) and online.wilson(20, 20)[1] == 1.0
    verdict = online.targets({"none": {"last_half_success": 0.2, "tokens_per_task": 100.0},
                              "shared": {"last_half_success": 0.3, "tokens_per_task": 95.0, "failing_retired": 0.5}})
    assert verdict["met"]["shared_vs_none"] is True and verdict["met"]["tokens_vs_none"] is False
    assert "failing_retired" in verdict["missed"] and "poisoned_vs_clean" in verdict["not_measured"]

    rules = [{"when": "tool check_locks returned waiting sessions", "avoid": ["answer:VACUUM"], "prefer": ["answer:LOCK_CONTENTION"]}]
    acts = ["check_locks", "answer:VACUUM", "answer:LOCK_CONTENTION"]
    assert online_agent.guarded(acts, rules, "Last result: tool check_locks returned 3 waiting sessions") == (
        ["check_locks", "answer:LOCK_CONTENTION"], ["answer:vacuum"])
    assert online_agent.guarded(acts, rules, "Last result: nothing yet")[1] == []
    assert online_agent.guarded(["answer:VACUUM"], rules, "check_locks returned waiting sessions") == (["answer:VACUUM"], [])

    tree = ast.parse((BENCH / "online_agent.py").read_text())
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in imported if m and m.split(".")[0] == "forge"} <= {"forge", "forge.client", "forge.envs", "forge.errors"}


@pytest.mark.slow
def test_online_bench_runs_three_agent_processes_over_rest(tmp_path: Path) -> None:
    """The whole bench on a scripted model: its model server, a FORGE server per mode, three
    agent processes each; every task is recorded, raw memory stores episodes, and learning
    sends each trace as a job that completes."""
    import online

    out = tmp_path / "online"
    assert online.main(["--llm", "test", "--quick", "--tasks", "3", "--modes", "none,raw,shared", "--out", str(out), "--json"]) == 0
    result = json.loads((out / "online.json").read_text())
    assert set(result["modes"]) == {"none", "raw", "shared"}
    for m in result["modes"].values():
        assert m["tasks_played"] == 3 and m["errors"] == 0 and m["last_half_n"] == 2
        assert m["tokens_per_task"] > 0
    assert result["modes"]["none"]["jobs"]["jobs"] == 0
    shared = result["modes"]["shared"]
    assert shared["jobs"]["jobs"] == 3 and shared["jobs"]["status"] == {"done": 3}
    assert (out / "online.png").stat().st_size > 1000
    runs = {r["mode"]: r for r in result["runs"]}
    assert all(row["agent"] == online.AGENTS[row["index"] % 3] for row in runs["raw"]["rows"])
