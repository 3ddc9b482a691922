"""Recall scores a user can read: on 0-1, a min_score that drops the unrelated, and tied
keyword scores that earn equal, not full, credit."""

from __future__ import annotations

import pytest

from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.engine.recall import TIED_CREDIT, Weights, _minmax
from forge.errors import ValidationError
from forge.model import Unit, Viewer

ADMIN = Viewer.admin()


@pytest.fixture
def memory():
    with Memory.open(":memory:", embedder=HashingEmbedder(dim=256)) as mem:
        mem.add([Unit(t) for t in (
            "The build server restarts on Sundays.",
            "Deploys freeze on Fridays after noon.",
            "The coffee machine on floor 3 is broken.",
            "Rotate the API keys every 90 days.",
        )])
        mem.add([Unit(f"widget {i}") for i in range(10)])
        yield mem


@pytest.mark.parametrize("query", ["when does the build server restart", "widget 5", "keys", "zebra crossing"])
def test_scores_lie_between_0_and_1_best_first(memory, query):
    hits = memory.recall(query, viewer=ADMIN, k=10, weights=Weights(recency=0.3, validation=0.5, importance=0.5))
    scores = [h.score for h in hits]
    assert scores and all(0.0 <= s <= 1.0 for s in scores)
    assert scores == sorted(scores, reverse=True)


def test_the_unit_best_by_every_signal_scores_near_one(memory):
    [top, *_] = memory.recall("The build server restarts on Sundays.", viewer=ADMIN, k=3)
    assert top.unit.content.startswith("The build server") and top.score > 0.9


def test_min_score_drops_what_is_below_it(memory):
    every = memory.recall("build server restarts", viewer=ADMIN, k=14)
    cut = (every[0].score + every[-1].score) / 2
    kept = memory.recall("build server restarts", viewer=ADMIN, k=14, min_score=cut)
    assert kept and len(kept) < len(every) and all(h.score >= cut for h in kept)
    assert [h.unit.id for h in kept] == [h.unit.id for h in every if h.score >= cut]
    for bad in (-0.1, 1.5, float("nan"), True, "0.5"):
        with pytest.raises(ValidationError, match="min_score"):
            memory.recall("x", viewer=ADMIN, min_score=bad)


def test_tied_scores_earn_equal_partial_credit():
    assert _minmax([2.0, 2.0, 2.0]) == [TIED_CREDIT] * 3 and TIED_CREDIT < 1.0
    assert _minmax([0.0, 0.0]) == [TIED_CREDIT] * 2
    assert _minmax([3.0, 1.0])[0] == 1.0  # a real difference still gives the best full credit


def test_a_word_every_unit_shares_does_not_rank_the_wrong_widget_high(memory):
    hits = memory.recall("widget 5", viewer=ADMIN, k=5)
    assert hits[0].unit.content == "widget 5"
    others = [h.score for h in hits[1:]]
    assert all(s < hits[0].score for s in others)
