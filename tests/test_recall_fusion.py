"""Score-aware fusion, time windows and the search context (issue 13)."""

from datetime import UTC, datetime

import numpy as np
import pytest

from forge.engine.recall import Weights, _minmax, event_time, recall, time_window
from forge.errors import ValidationError
from forge.model import Relation, RelationType, Unit, Viewer
from forge.store import SEARCH_CONTEXT, SPEAKER, Hit, SQLiteStore, indexed_text

ADMIN = Viewer.admin()


class TwoSignals(SQLiteStore):
    """A real store whose two signals return scripted (id, raw score) lists."""

    def __init__(self, vector: list[tuple[str, float]], keyword: list[tuple[str, float]]) -> None:
        super().__init__(":memory:")
        ids = {i for i, _ in vector + keyword}
        self.add([Unit(f"unit {i}", id=i) for i in sorted(ids)])
        self._v, self._k = vector, keyword

    def vector_search(self, query, *, k, viewer, filter=None):  # noqa: ANN001
        return [Hit(i, s) for i, s in self._v[:k]]

    def keyword_search(self, query, *, k, viewer, filter=None):  # noqa: ANN001
        return [Hit(i, s) for i, s in self._k[:k]]


def _ids(results):
    return [r.unit.id for r in results]


def test_score_fusion_keeps_a_strong_keyword_match_that_rrf_flattens():
    # BM25 is sure about "kw" (12.0 against 3.1); cosine puts it fifth, a hair behind the top.
    vec = [("v1", 0.52), ("v2", 0.51), ("v3", 0.50), ("v4", 0.495), ("kw", 0.49), ("v5", 0.40)]
    kw = [("kw", 12.0), ("v3", 3.1), ("x", 3.0)]
    store = TwoSignals(vec, kw)
    q = np.zeros(4, dtype=np.float32)
    score = recall(store, query="q", query_vector=q, viewer=ADMIN, k=3, hops=0, touch=False)
    rrf = recall(store, query="q", query_vector=q, viewer=ADMIN, k=3, hops=0, touch=False,
                 weights=Weights(fusion="rrf", keyword=1.0))
    assert _ids(score)[0] == "kw"
    assert _ids(rrf)[0] == "v3"  # two middling ranks beat one sure match under RRF
    assert score[0].why["keyword"] == {"rank": 1, "bm25": 12.0}
    assert score == sorted(score, key=lambda r: r.score, reverse=True)


def test_minmax_and_weights_validation():
    assert _minmax([]) == []
    assert _minmax([2.0, 2.0]) == [0.5, 0.5]  # a tie tells nothing: equal, not full, credit (issue 24)
    assert _minmax([3.0, 1.0, 2.0]) == [1.0, 0.0, 0.5]
    assert _minmax([0.52, 0.51]) == pytest.approx([1.0, 1 - 0.01 / 0.26])  # near-ties stay near-ties
    with pytest.raises(ValidationError, match="fusion"):
        Weights(fusion="borda")


NOW = datetime(2024, 3, 10, 12, tzinfo=UTC).timestamp()


def _day(text: str) -> str:
    w = time_window(text, now=NOW)
    return None if w is None else [datetime.fromtimestamp(x, UTC).date().isoformat() for x in w]


@pytest.mark.parametrize(
    ("query", "window"),
    [
        ("what did Ann do on 7 May 2023?", ["2023-05-07", "2023-05-08"]),
        ("what happened on May 7th, 2023", ["2023-05-07", "2023-05-08"]),
        ("trips in May 2023", ["2023-05-01", "2023-06-01"]),
        ("what did X do last May", ["2023-05-01", "2023-06-01"]),  # the latest May before now
        ("anything in March", ["2024-03-01", "2024-04-01"]),
        ("books read in 2022", ["2022-01-01", "2023-01-01"]),
        ("what broke yesterday", ["2024-03-09", "2024-03-10"]),
        ("what did we learn last week", ["2024-03-03", "2024-03-11"]),
        ("how do I restart the service", None),
        ("the 2022 report", None),  # a bare number is not a time window
    ],
)
def test_time_window(query, window):
    assert _day(query) == window


def test_temporal_boost_uses_event_time_not_creation_time():
    may = datetime(2023, 5, 20, tzinfo=UTC).timestamp()
    june = datetime(2023, 6, 20, tzinfo=UTC).timestamp()
    store = SQLiteStore(":memory:")
    # written the same moment (a later import), but one happened in May
    in_may = Unit("Ann went hiking with her dog", id="may", meta={"event_at": may}, created_at=june)
    in_june = Unit("Ann went hiking with her sister", id="june", created_at=june)
    store.add([in_may, in_june])
    assert event_time(store.get("may", viewer=ADMIN)) == may
    plain = recall(store, query="when did Ann go hiking in May 2023", query_vector=None, viewer=ADMIN, k=2,
                   touch=False, now=NOW)
    boosted = recall(store, query="when did Ann go hiking in May 2023", query_vector=None, viewer=ADMIN, k=2,
                     touch=False, now=NOW, weights=Weights(temporal=1.0))
    assert {r.unit.id for r in plain} == {"may", "june"}
    assert _ids(boosted)[0] == "may" and "boost" in boosted[0].why and "boost" not in boosted[1].why


def test_search_context_is_indexed_but_not_content():
    u = Unit("Yes, last Tuesday!", id="reply", meta={SEARCH_CONTEXT: "Ann: Did you adopt the greyhound?"})
    assert indexed_text(u).startswith("Yes, last Tuesday!") and "greyhound" in indexed_text(u)
    store = SQLiteStore(":memory:")
    store.add([u])
    assert [h.id for h in store.keyword_search("greyhound adopted", k=3, viewer=ADMIN)] == ["reply"]
    assert store.get("reply", viewer=ADMIN).content == "Yes, last Tuesday!"


def test_graph_expansion_checks_the_seeds_visibility_in_one_query():
    # neighbors() ran one visibility query per seed (ten per recall), a third of a recall's
    # SQL at 20k units; the count of statements is what this guards, not a time.
    store = SQLiteStore(":memory:")
    ids = store.add([Unit(f"unit {i}", owner="a", scope="private" if i % 2 else "global") for i in range(12)])
    for a, b in [*zip(ids, ids[1:], strict=False), *zip(ids, ids[2:], strict=False)]:
        store.relate(Relation(a, b, RelationType.SUPPORTS))
    seen: list[str] = []
    store._db.set_trace_callback(seen.append)
    got = store.neighbors(ids[:10], viewer=Viewer.of("b"))
    store._db.set_trace_callback(None)
    # bob sees the global units (even numbers) only, and only their relations
    assert got and all(int(store.get(n, viewer=ADMIN).content.split()[-1]) % 2 == 0 for n, _ in got)
    assert sum(s.lstrip().upper().startswith("SELECT") for s in seen) <= 2, seen


@pytest.mark.parametrize("seed", range(12))
def test_boosted_recall_reads_only_what_can_reach_the_top_k_and_answers_the_same(seed):
    """Boosts may lift a candidate from below the top k, so recall reads further candidates,
    but only those the largest possible boost could lift above the k-th boosted score so
    far. The answer must equal boosting all of the first max(3k, 30) (what an identity
    reranker is shown), for any mix of boosts, including ones that lower a unit."""
    rng = np.random.default_rng(seed)
    speakers = ["Nate", "Joanna", "agent-3", "Mary Ann"]
    n = 80
    vector = [(f"u{i:03d}", float(s)) for i, s in sorted(enumerate(rng.uniform(0.2, 0.9, n)), key=lambda x: -x[1])]
    keyword = [(f"u{i:03d}", float(s)) for i, s in sorted(enumerate(rng.uniform(0.5, 9.0, n)), key=lambda x: -x[1])][: n // 2]
    store = TwoSignals(vector, keyword)
    now = datetime(2024, 6, 1, tzinfo=UTC).timestamp()
    for i in range(n):
        u = store.get(f"u{i:03d}", viewer=ADMIN)
        meta = {SPEAKER: speakers[int(rng.integers(len(speakers)))], "event_at": now - float(rng.uniform(0, 400)) * 86400}
        store.update(u.replace(meta=meta, validation=float(rng.uniform()), importance=float(rng.uniform())))
    weights = Weights(
        attribution=float(rng.choice([0.0, 0.2, 1.0])), temporal=float(rng.choice([0.0, 0.5])),
        validation=float(rng.choice([0.0, 1.0, -1.0])), importance=float(rng.choice([0.0, 0.5])), graph=0.0,
    )
    query = rng.choice(["what did Nate say in May 2024", "did mary ann or AGENT-3 go", "anything at all"])
    k = int(rng.choice([1, 5, 10]))
    reads: list[int] = []
    get_many = store.get_many

    def counting(ids, *, viewer):  # noqa: ANN001
        reads.append(len(ids))
        return get_many(ids, viewer=viewer)

    store.get_many = counting
    fast = recall(store, query=query, query_vector=np.ones(4), viewer=ADMIN, k=k, weights=weights, touch=False, now=now)
    fast_reads = sum(reads)
    full = recall(store, query=query, query_vector=np.ones(4), viewer=ADMIN, k=k, weights=weights, touch=False, now=now,
                  rerank=lambda q, rs: list(rs))
    assert [(r.unit.id, round(r.score, 12)) for r in fast] == [(r.unit.id, round(r.score, 12)) for r in full]
    assert fast_reads <= sum(reads) - fast_reads  # never more than reading them all
