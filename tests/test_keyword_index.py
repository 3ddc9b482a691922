"""The in-memory BM25 index ranks exactly as FTS5 does, and follows the file's changes."""

from __future__ import annotations

import random
import sqlite3

import numpy as np
import pytest

import forge.store.keywords as keywords
import forge.store.sqlite as sqlite_store
from forge.model import Context, Kind, Unit, Viewer
from forge.store import SQLiteStore
from forge.store.base import Filter
from forge.store.keywords import KeywordIndex, top

ADMIN = Viewer.admin()
WORDS = [f"w{i}" for i in range(400)] + ["running", "runs", "harbour", "lighthouses", "lighthouse", "Café", "naïve"]


def _texts(n, seed=0):
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 25))) + "." for _ in range(n)]


def _fts(rows):
    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE f USING fts5(t, tokenize='porter unicode61')")
    db.executemany("INSERT INTO f(rowid, t) VALUES (?, ?)", rows)
    return db


def _fts_scores(db, words):
    match = " OR ".join(f'"{w}"' for w in words)
    return dict(db.execute("SELECT rowid, -bm25(f) FROM f WHERE f MATCH ?", (match,)).fetchall())


def _assert_scores_as_fts5(index, db):
    """Every query matches the same units as FTS5, each with FTS5's bm25() score."""
    for words in QUERIES:
        want = _fts_scores(db, words)
        ids, scores = index.score(words)
        got = dict(zip(ids.tolist(), scores.tolist(), strict=True))
        assert set(got) == set(want), words
        for rowid, s in want.items():
            assert got[rowid] == pytest.approx(s, rel=1e-9), (words, rowid)


QUERIES = [["w1", "w2"], ["running", "harbour"], ["lighthouse"], ["cafe"], ["naive", "w3"], ["w5", "w6", "w7"], ["absent"]]


@pytest.mark.parametrize("bulk", [True, False])
def test_scores_equal_fts5_bm25(bulk):
    rows = list(enumerate(_texts(3000), 1))
    index = KeywordIndex()
    if bulk:
        index.load([rows[:1000], rows[1000:]], seq=7)
    else:
        index.apply(rows, seq=7)
    assert index.seq == 7 and len(index) == 3000
    db = _fts(rows)
    _assert_scores_as_fts5(index, db)


def test_changes_and_merges_follow_the_text(monkeypatch):
    """Inserts, re-texts and deletes, across several seals, still rank as FTS5 does."""
    monkeypatch.setattr(keywords, "MERGE_MIN_DOCS", 50)
    rng = random.Random(3)
    texts = dict(enumerate(_texts(400, seed=1), 1))
    index = KeywordIndex()
    index.apply(list(texts.items()), seq=1)
    fresh = iter(_texts(600, seed=2))
    for step in range(2, 40):
        batch = []
        for _ in range(15):
            op = rng.random()
            if op < 0.4:  # a new unit
                rowid = max(texts) + 1
                texts[rowid] = next(fresh)
                batch.append((rowid, texts[rowid]))
            elif op < 0.75 and texts:  # a unit re-texted
                rowid = rng.choice(list(texts))
                texts[rowid] = next(fresh)
                batch.append((rowid, texts[rowid]))
            elif texts:  # a unit deleted
                rowid = rng.choice(list(texts))
                del texts[rowid]
                batch.append((rowid, None))
        index.apply(batch, seq=step)
    assert len(index) == len(texts)
    db = _fts(list(texts.items()))
    _assert_scores_as_fts5(index, db)
    index._seal()
    _assert_scores_as_fts5(index, db)


def test_common_words_are_skipped_when_others_remain():
    rows = [(i, f"common filler {'rare' if i == 5 else 'x'}") for i in range(1, 2001)]
    index = KeywordIndex()
    index.load([rows], seq=1)
    ids, _ = index.score(["common", "rare"], common_share=0.10)
    assert ids.tolist() == [5]
    ids, _ = index.score(["common", "filler"], common_share=0.10)  # all common: the rarest one stays
    assert len(ids) == 2000


def test_top_orders_by_score_then_rowid():
    ids, scores = top(np.array([4, 2, 9, 7], dtype=np.int32), np.array([1.0, 3.0, 3.0, 0.5]), 3)
    assert ids.tolist() == [2, 9, 4] and scores.tolist() == [3.0, 3.0, 1.0]


def test_load_refuses_a_filled_index():
    index = KeywordIndex()
    index.apply([(1, "one")], seq=1)
    with pytest.raises(ValueError):
        index.load([[(2, "two")]], seq=2)


# -- in the store ----------------------------------------------------------------------------


def _store_units(n=600, seed=0):
    rng = random.Random(seed)
    texts = _texts(n, seed=seed)
    units = []
    for i, text in enumerate(texts):
        scope, owner = rng.choice([("global", ""), ("private", "ann"), ("private", "bob"), ("group:red", "")])
        units.append(Unit(text, kind=rng.choice([Kind.FACT, Kind.RULE, Kind.LESSON]), scope=scope, owner=owner,
                          context=Context(tags=(f"t{i % 7}",))))
    return units


CASES = [
    (ADMIN, Filter()),
    (Viewer.of("ann"), Filter()),
    (Viewer.of("bob", ["red"]), Filter()),
    (ADMIN, Filter.make(kinds=["rule"], tags_all=["t3"])),
    (Viewer.of("ann"), Filter.make(kinds=["lesson"], tags_any=["t1", "t2"])),
]


@pytest.mark.parametrize("widen_max", [4096, 64])
def test_store_ranks_as_fts5_for_every_viewer_and_filter(tmp_path, monkeypatch, widen_max):
    monkeypatch.setattr(sqlite_store, "KEYWORD_WIDEN_MAX", widen_max)  # 64: selective filters list admitted units
    units = _store_units()
    fast = SQLiteStore(tmp_path / "a.db")
    slow = SQLiteStore(tmp_path / "b.db", keyword_index=False)
    for s in (fast, slow):
        s.add(units)
    try:
        fast._ensure_keywords(build=True)
        for viewer, f in CASES:
            for words in QUERIES:
                q = " ".join(words)
                got = fast.keyword_search(q, k=10, viewer=viewer, filter=f)
                want = slow.keyword_search(q, k=10, viewer=viewer, filter=f)
                # the same units in the same order (ties by row id), whichever ranks them
                assert [h.id for h in got] == [h.id for h in want], (viewer, f, q)
                assert [h.score for h in got] == pytest.approx([h.score for h in want], rel=1e-9)
        assert fast._mirror is not None and slow._mirror is None
    finally:
        fast.close()
        slow.close()


def test_another_connection_sees_writes_updates_and_archives(tmp_path):
    db = tmp_path / "m.db"
    writer, reader = SQLiteStore(db), SQLiteStore(db)
    try:
        u = Unit("the lighthouse keeper")
        writer.add([u])
        assert reader._ensure_keywords(build=True) is not None
        assert [h.id for h in reader.keyword_search("lighthouse", k=5, viewer=ADMIN)] == [u.id]
        writer.update(_retext(u, "the harbour master"))
        assert reader.keyword_search("lighthouse", k=5, viewer=ADMIN) == []
        assert [h.id for h in reader.keyword_search("harbour", k=5, viewer=ADMIN)] == [u.id]
        writer.set_status(u.id, sqlite_store.Status.ARCHIVED, reason="test")
        assert reader.keyword_search("harbour", k=5, viewer=ADMIN) == []
    finally:
        writer.close()
        reader.close()


def _retext(unit, content):
    from dataclasses import replace

    return replace(unit, content=content)


def test_a_transaction_sees_its_own_writes_and_a_rollback_leaves_none(tmp_path):
    store = SQLiteStore(tmp_path / "m.db")
    try:
        store.add([Unit("a harbour")])
        store._ensure_keywords(build=True)
        with pytest.raises(RuntimeError), store.transaction():
            store.add([Unit("a lighthouse")])
            assert len(store.keyword_search("lighthouse", k=5, viewer=ADMIN)) == 1  # FTS5, inside
            raise RuntimeError("undo")
        assert store.keyword_search("lighthouse", k=5, viewer=ADMIN) == []
        assert len(store.keyword_search("harbour", k=5, viewer=ADMIN)) == 1
    finally:
        store.close()


def test_a_file_made_before_the_unit_log_gets_one(tmp_path):
    db = tmp_path / "old.db"
    store = SQLiteStore(db)
    u = Unit("an old lighthouse")
    store.add([u])
    store.close()
    raw = sqlite3.connect(db)
    for name in ("units_log_ai", "units_log_ad", "units_log_au"):
        raw.execute(f"DROP TRIGGER {name}")
    raw.execute("DROP TABLE unit_log")
    raw.commit()
    raw.close()
    store = SQLiteStore(db)
    try:
        store.add([Unit("a new lighthouse")])
        assert store._keyword_index
        store._ensure_keywords(build=True)
        assert len(store.keyword_search("lighthouse", k=5, viewer=ADMIN)) == 2
    finally:
        store.close()


def test_in_memory_store_uses_the_index():
    store = SQLiteStore()
    store.add([Unit("the lighthouse keeper"), Unit("harbour lights")])
    assert len(store.keyword_search("lighthouse harbour", k=5, viewer=ADMIN)) == 2
    assert store._mirror is not None and len(store._mirror[0]) == 2
    store.close()


def test_a_retexted_units_old_postings_do_not_count():
    """Until the next seal a re-texted unit's old postings stay in the arrays, masked."""
    index = KeywordIndex()
    index.load([[(1, "apple pie")]], seq=1)
    index.apply([(1, "apple tart")], seq=2)
    ids, scores = index.score(["apple"])
    assert ids.tolist() == [1] and np.isfinite(scores).all() and scores[0] > 0
    assert index.score(["pie"])[0].tolist() == []


def test_common_words_are_skipped_alike_by_fts5_and_the_index(tmp_path):
    """Both skip a word in more than 10% of units once a store has 1,000: the same top 10."""
    units = [Unit(text + (" memo" if i % 3 else " memos"), id=f"u{i:05d}") for i, text in enumerate(_texts(1500, seed=4))]
    fast = SQLiteStore(tmp_path / "a.db")
    slow = SQLiteStore(tmp_path / "b.db", keyword_index=False)
    try:
        for s in (fast, slow):
            s.add(units)
        fast._ensure_keywords(build=True)
        for q in ("memo lighthouse", "memos running harbour", "memo memos", "memo w7 zzz"):
            got = fast.keyword_search(q, k=10, viewer=ADMIN)
            want = slow.keyword_search(q, k=10, viewer=ADMIN)
            assert [h.id for h in got] == [h.id for h in want], q
        assert len(fast.keyword_search("memo lighthouse", k=2000, viewer=ADMIN)) < 1000  # "memo" was skipped
    finally:
        fast.close()
        slow.close()


def test_top_breaks_ties_at_the_cut_by_rowid():
    ids = np.arange(100, 0, -1, dtype=np.int32)
    got, _ = top(ids, np.ones(100), 5)
    assert got.tolist() == [1, 2, 3, 4, 5]
    got, scores = top(ids, np.where(ids == 50, 2.0, 1.0), 3)
    assert got.tolist() == [50, 1, 2] and scores.tolist() == [2.0, 1.0, 1.0]


_ODD = list("abcdefg hij 19_-'") + ["é", "ü", "ß", "ﬁ", "²", "Ａ", "İ", "ñ", "Ω", "中", "\u0301", "ǅ", "ı", "ø", "æ", "\x00", "😀"]


def test_tokens_and_stems_are_fts5s_for_any_unicode():
    """Ligatures, Turkish dotted I, title-case digraphs, combining marks, CJK, emoji: the
    tokens and stems are what FTS5's porter unicode61 stores, term for term."""
    from forge.store.keywords import stem, tokens

    rng = random.Random(7)
    db = _fts([])
    db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(f, 'instance')")
    for i in range(400):
        text = "".join(rng.choice(_ODD) for _ in range(rng.randint(1, 40)))
        db.execute("INSERT INTO f(rowid, t) VALUES (?, ?)", (i, text))
        want = [r[0] for r in db.execute("SELECT term FROM v WHERE doc = ? ORDER BY offset", (i,))]
        assert [stem(t) for t in tokens(text)] == want, repr(text)


@pytest.mark.slow
def test_unicode_texts_score_as_fts5():
    from forge.store.common import STOPWORDS, query_words
    from forge.store.keywords import tokens

    rng = random.Random(1)
    rows = [(i, "".join(rng.choice(_ODD) for _ in range(rng.randint(0, 40)))) for i in range(1, 2001)]
    index = KeywordIndex()
    index.load([rows], seq=1)
    db = _fts(rows)
    checked = 0
    for _ in range(300):
        words = query_words("".join(rng.choice(_ODD) for _ in range(rng.randint(1, 15))))
        # the words FTS5 would search as one searchable token each (a word it splits is a phrase)
        if not words or any(len(t := tokens(w)) != 1 or len(t[0]) < 2 or t[0] in STOPWORDS for w in words):
            continue
        want = _fts_scores(db, words)
        ids, scores = index.score(words)
        got = dict(zip(ids.tolist(), scores.tolist(), strict=True))
        assert set(got) == set(want), words
        assert all(got[r] == pytest.approx(s, rel=1e-9) for r, s in want.items()), words
        checked += 1
    assert checked > 100
