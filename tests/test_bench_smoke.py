"""Smoke test for the benchmarks in bench/: they run on tiny inputs and report sane shapes.

Benchmarks print figures and assert nothing; this only checks that the code paths work,
with the hashing embedder so no model is loaded.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import ingest  # noqa: E402
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


def test_poisoning_bench_runs_and_reports_the_labelled_set() -> None:
    import poisoning

    res = poisoning.screen_set()
    fams = res["families"]
    assert fams["attack:ALL"]["heldout"][1] >= 100 and fams["benign:ALL"]["heldout"][1] >= 100
    out = poisoning.run(n_agents=3, n_rules=3, policy_name="confidence", embedder_spec="hash", seed=1)
    assert out["attacks"]["replay"]["stopped"] == 1.0 and out["attacks"]["tampered"]["stopped"] == 1.0
    assert out["attacks"]["injection"]["stopped"] == 1.0
