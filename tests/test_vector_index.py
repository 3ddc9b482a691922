"""The ANN index is a cache of the SQLite file: rebuilt when missing, caught up when stale."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from forge.model import Unit, Viewer
from forge.store import SQLiteStore

ADMIN = Viewer.admin()


def _vecs(n, seed=0, dim=16):
    return np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)


def _top(store, q):
    return store.vector_search(q, k=1, viewer=ADMIN)[0].id


def test_index_saved_on_close_and_reused(tmp_path):
    db = tmp_path / "m.db"
    s = SQLiteStore(db)
    units = [Unit(f"u{i}") for i in range(50)]
    v = _vecs(50)
    s.add(units, v)
    assert _top(s, v[7]) == units[7].id
    s.close()
    assert Path(str(db) + ".usearch").exists()
    s2 = SQLiteStore(db)
    assert _top(s2, v[7]) == units[7].id
    assert s2._index is not None and s2._index.seq == 1  # loaded, nothing replayed
    s2.close()


def test_missing_index_is_rebuilt(tmp_path):
    db = tmp_path / "m.db"
    s = SQLiteStore(db)
    units = [Unit(f"u{i}") for i in range(30)]
    v = _vecs(30)
    s.add(units, v)
    _top(s, v[0])
    s.close()
    os.remove(str(db) + ".usearch")
    s2 = SQLiteStore(db)
    assert _top(s2, v[3]) == units[3].id
    s2.close()


def test_corrupt_index_is_rebuilt(tmp_path):
    db = tmp_path / "m.db"
    s = SQLiteStore(db)
    units = [Unit(f"u{i}") for i in range(30)]
    v = _vecs(30)
    s.add(units, v)
    _top(s, v[0])
    s.close()
    Path(str(db) + ".usearch").write_bytes(b"garbage")
    s2 = SQLiteStore(db)
    assert _top(s2, v[5]) == units[5].id
    s2.close()


def test_stale_index_after_crash_catches_up(tmp_path):
    """A process dies after committing rows but before saving its index."""
    db = tmp_path / "m.db"
    s = SQLiteStore(db)
    first = [Unit(f"first {i}") for i in range(20)]
    v1 = _vecs(20, seed=1)
    s.add(first, v1)
    s.close()  # index saved at vseq 1
    script = textwrap.dedent(
        f"""
        import os, numpy as np
        from forge.model import Unit, Viewer
        from forge.store import SQLiteStore
        s = SQLiteStore({str(db)!r})
        s.vector_search(np.ones(16, dtype=np.float32), k=1, viewer=Viewer.admin())
        v = np.random.default_rng(2).normal(size=(10, 16)).astype(np.float32)
        s.add([Unit(f"second {{i}}", id=f"second-{{i}}") for i in range(10)], v)
        os._exit(0)  # crash: no close, no index save
        """
    )
    subprocess.run([sys.executable, "-c", script], check=True)
    v2 = _vecs(10, seed=2)
    s2 = SQLiteStore(db)
    assert _top(s2, v2[4]) == "second-4"
    assert _top(s2, v1[4]) == first[4].id
    assert len(s2._index) == 30
    s2.close()


def test_writes_from_another_process_are_seen(tmp_path):
    db = tmp_path / "m.db"
    reader = SQLiteStore(db)
    reader.add([Unit("seed")], _vecs(1, seed=9))
    reader.vector_search(_vecs(1, seed=9)[0], k=1, viewer=ADMIN)  # index built in this process
    writer = SQLiteStore(db)
    v = _vecs(5, seed=3)
    writer.add([Unit(f"w{i}", id=f"w{i}") for i in range(5)], v)
    assert _top(reader, v[2]) == "w2"
    writer.close()
    reader.close()


# -- the index is bound to its database (issue 9) ------------------------------------------


def _remove_db(db: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        p = Path(str(db) + suffix)
        if p.exists():
            p.unlink()


def test_an_index_left_by_a_recreated_database_is_rebuilt(tmp_path):
    db = tmp_path / "x.db"
    s = SQLiteStore(db)
    s.add([Unit(f"old {i}") for i in range(40)], _vecs(40, seed=1))
    s.vector_search(_vecs(1)[0], k=1, viewer=ADMIN)
    s.close()  # the old database's index stays beside the path
    assert Path(str(db) + ".usearch").exists()
    _remove_db(db)
    s = SQLiteStore(db)  # same name, new database (same vseq after one add)
    new = [Unit(f"new {i}") for i in range(40)]
    v = _vecs(40, seed=2)
    s.add(new, v)
    hits = s.vector_search(v[7], k=1, viewer=ADMIN)
    assert hits[0].id == new[7].id and hits[0].score == pytest.approx(1.0, abs=1e-4)
    s.close()


def test_an_index_newer_than_a_restored_backup_is_rebuilt(tmp_path):
    db = tmp_path / "x.db"
    s = SQLiteStore(db)
    first = [Unit(f"first {i}") for i in range(30)]
    s.add(first, _vecs(30, seed=1))
    s.vector_search(_vecs(1)[0], k=1, viewer=ADMIN)
    s.close()
    backup = tmp_path / "backup.db"
    shutil.copy(db, backup)
    s = SQLiteStore(db)
    s.add([Unit(f"later {i}") for i in range(30)], _vecs(30, seed=2))
    s.vector_search(_vecs(1)[0], k=1, viewer=ADMIN)
    s.close()  # the index now reflects rows the backup never had
    _remove_db(db)
    shutil.copy(backup, db)
    s = SQLiteStore(db)
    other = [Unit(f"other {i}") for i in range(30)]  # the restored file diverges from the index
    v = _vecs(30, seed=3)
    s.add(other, v)
    for i in (0, 11, 29):
        hit = s.vector_search(v[i], k=1, viewer=ADMIN)[0]
        assert hit.id == other[i].id and hit.score == pytest.approx(1.0, abs=1e-4)
    assert len(s._index) == 60
    s.close()


def test_a_second_opener_of_a_new_file_does_not_reset_the_counter(tmp_path, monkeypatch):
    """Two processes open a new file at once: both see it empty, one creates it and writes;
    the other must not then reset the vector counter (its units would never be indexed)."""
    db = tmp_path / "race.db"
    first = SQLiteStore(db)
    real = SQLiteStore._owner_check
    calls = {"n": 0}

    def stale_first_look(self):
        calls["n"] += 1
        return 0 if calls["n"] == 1 else real(self)  # what it saw before the other's commit

    first.add([Unit("a")], _vecs(1, seed=1))
    monkeypatch.setattr(SQLiteStore, "_owner_check", stale_first_look)
    second = SQLiteStore(db)
    monkeypatch.undo()
    assert second._setting("vseq") == "1"
    v = _vecs(3, seed=4)
    second.add([Unit(f"b{i}", id=f"b{i}") for i in range(3)], v)
    assert _top(first, v[1]) == "b1"
    first.close()
    second.close()


_OPEN_AND_ADD = textwrap.dedent(
    """
    import sys, time, numpy as np
    from forge.model import Unit, Viewer
    from forge.store import SQLiteStore
    path, me, start = sys.argv[1], sys.argv[2], float(sys.argv[3])
    while time.time() < start:
        time.sleep(0.001)
    s = SQLiteStore(path)
    v = np.random.default_rng(int(me)).normal(size=(5, 16)).astype(np.float32)
    s.add([Unit(f"p{me}-{i}", id=f"p{me}-{i}") for i in range(5)], v)
    s.vector_search(v[0], k=1, viewer=Viewer.admin())
    s.close()
    """
)


@pytest.mark.slow
def test_processes_opening_a_new_file_at_once_all_get_indexed(tmp_path):
    import time

    for trial in range(3):
        db = tmp_path / f"new{trial}.db"
        start = time.time() + 1.0
        procs = [
            subprocess.Popen([sys.executable, "-c", _OPEN_AND_ADD, str(db), str(me), str(start)])
            for me in range(6)
        ]
        codes = [p.wait(timeout=120) for p in procs]  # wait for every one, even after a failure
        assert codes == [0] * len(procs)
        s = SQLiteStore(db)
        for me in range(6):
            v = np.random.default_rng(me).normal(size=(5, 16)).astype(np.float32)
            assert _top(s, v[3]) == f"p{me}-3"
        assert s._setting("vseq") == "6"
        s.close()


def test_two_stores_saving_one_index_do_not_collide(tmp_path):
    """Both flush the same database's index at once: no shared temp file, no crash."""
    import threading

    db = tmp_path / "m.db"
    stores = [SQLiteStore(db), SQLiteStore(db)]
    errors: list[BaseException] = []

    def work(s: SQLiteStore, seed: int) -> None:
        try:
            for i in range(15):
                s.add([Unit(f"s{seed}-{i}")], _vecs(1, seed=seed * 100 + i))
                s.vector_search(_vecs(1)[0], k=1, viewer=ADMIN)
                s.flush()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s, n)) for n, s in enumerate(stores)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for s in stores:
        s.close()
    assert errors == []
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    s = SQLiteStore(db)
    assert s.count(viewer=ADMIN) == 30
    [target] = [u.id for u in s.list(viewer=ADMIN) if u.content == "s1-7"]
    assert _top(s, _vecs(1, seed=107)[0]) == target
    s.close()


def test_small_stores_search_exactly(tmp_path):
    """HNSW misses some exact matches on clustered data whatever its ef (issue 9): a store of
    up to EXACT_MAX vectors answers exactly, matching brute force on every query."""
    g = np.random.default_rng(0)
    centres = g.normal(size=(20, 64))
    x = centres[g.integers(0, 20, 3000)] + 0.05 * g.normal(size=(3000, 64))
    x = (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)
    s = SQLiteStore(tmp_path / "m.db")
    units = [Unit(f"u{i}", id=f"u{i}") for i in range(len(x))]
    s.add(units, x)
    queries = x[:300]
    sims = queries @ x.T
    for i, q in enumerate(queries):
        hits = s.vector_search(q, k=10, viewer=ADMIN)
        assert hits[0].id == f"u{i}"  # the exact match, always
        tenth = np.sort(sims[i])[-10]  # and no better neighbour left out (ties aside)
        assert min(h.score for h in hits) >= tenth - 1e-5
    s.close()


def test_a_transaction_that_searches_right_after_open_does_not_deadlock_the_warm_up(tmp_path):
    """The warm-up thread loads the index while a transaction (holding the store lock)
    searches: both take the store lock before the index lock, so both finish."""
    import threading

    db = tmp_path / "m.db"
    with SQLiteStore(db) as s:
        s.add([Unit(f"u{i}") for i in range(2000)], _vecs(2000))
        s.vector_search(_vecs(1)[0], k=1, viewer=ADMIN)
    done = threading.Event()

    def work() -> None:
        for _ in range(20):
            s = SQLiteStore(db)  # starts the warm-up thread
            with s.transaction():
                s.add([Unit("new")], _vecs(1, seed=5))
                s.vector_search(_vecs(1, seed=6)[0], k=3, viewer=ADMIN)
            s.close()
        done.set()

    t = threading.Thread(target=work, daemon=True)
    t.start()
    # (Loading the index under the index lock, then reading the store, deadlocked here.)
    assert done.wait(120), "deadlock between the warm-up thread and a searching transaction"


def test_catch_up_reads_by_the_vseq_index_and_pages_across_batches(tmp_path, monkeypatch):
    """After every write the index catches up; that query must use units_vseq, not walk rowids."""
    from forge.store import sqlite as sq

    s = SQLiteStore(tmp_path / "m.db")
    a = [Unit(f"a{i}") for i in range(5)]
    s.add(a, _vecs(5))
    plan = " ".join(r[3] for r in s._q("EXPLAIN QUERY PLAN " + sq._CATCH_UP_SQL, (0, 1, 0, 0)))
    assert "units_vseq" in plan and "TEMP B-TREE" not in plan, plan
    assert _top(s, _vecs(5)[3]) == a[3].id  # index loaded
    # small pages: a batch that shares one vseq is split across pages and nothing is skipped
    monkeypatch.setattr(sq, "_CATCH_UP_SQL", sq._CATCH_UP_SQL.replace("LIMIT 20000", "LIMIT 3"))
    v = _vecs(14, seed=1)
    b = [Unit(f"b{i}") for i in range(14)]
    s.add(b[:7], v[:7])
    s.add(b[7:], v[7:])
    assert len(s._index) == 19
    assert [_top(s, v[i]) for i in range(14)] == [u.id for u in b]
    s.close()


def test_check_index_reports_what_the_database_and_index_disagree_on(tmp_path):
    s = SQLiteStore(tmp_path / "m.db")
    units = [Unit(f"u{i}") for i in range(20)]
    v = _vecs(20)
    s.add(units, v)
    assert s.check_index() == [] and s.check_index(sample=5) == []
    rowid = s._q("SELECT rowid FROM units WHERE id = ?", (units[3].id,))[0][0]
    s._index.upsert(np.array([rowid]), v[4:5], seq=s._index.seq)  # a wrong vector under u3's row
    assert s.check_index() == [f"{units[3].id}: the index holds another vector"]
    s._index._index.remove(rowid)
    problems = s.check_index()
    assert f"{units[3].id}: missing from the index" in problems
    assert "the index holds 19 vectors, the database 20" in problems
    s.close()


def test_exact_search_among_keys_reads_the_int8_copy_and_scores_its_best_from_the_index():
    """A filter's units are searched in the int8 copy; only its best candidates are fetched
    from usearch and scored exactly, so the answer is exact search's, and it follows changes."""
    from forge.store.vectors import RESCORE_MIN, VectorIndex

    idx = VectorIndex(dim=16, path=None)
    v = _vecs(400, dim=16)
    idx.upsert(np.arange(400, dtype=np.uint64), v, seq=1)
    among = np.arange(0, 400, 2)
    q = v[3]  # an odd key's vector: not among them

    def brute(keys: np.ndarray, k: int = 5) -> list[int]:
        x = v[keys]
        sims = (x @ q) / (np.linalg.norm(x, axis=1) * np.linalg.norm(q))
        return keys[np.argsort(-sims)[:k]].tolist()

    fetched: list[list[int]] = []
    get_many = idx._get_many
    idx._get_many = lambda keys: fetched.append(keys.tolist()) or get_many(keys)  # type: ignore[method-assign]
    best = idx.search_exact_among(q, np.append(among, 999), k=5)  # 999: no vector
    assert [key for key, _ in best] == brute(among)
    sims = (v[brute(among)] @ q) / (np.linalg.norm(v[brute(among)], axis=1) * np.linalg.norm(q))
    assert [s for _, s in best] == pytest.approx(sims.tolist(), abs=1e-5)  # exact scores, not int8 ones
    assert len(fetched) == 1 and len(fetched[0]) == RESCORE_MIN  # the other 160 were read from the copy
    v[10] = 2 * q
    idx.upsert(np.array([10], dtype=np.uint64), v[10:11], seq=2)  # key 10 now points where the query does
    top = idx.search_exact_among(q, among, k=1)
    assert top[0][0] == 10 and top[0][1] == pytest.approx(1.0, abs=1e-5)
    wider = np.sort(np.append(among, 3))  # the set gains key 3, the query's own vector
    assert [key for key, _ in idx.search_exact_among(q, wider, k=2)] == [3, 10]
    assert len(idx.search_exact_among(q, among, k=300)) == len(among)
    idx._index.remove(10)  # gone from the index behind the copy's back: never named
    assert 10 not in [key for key, _ in idx.search_exact_among(q, among, k=5)]
    assert idx.search_exact_among(q, np.array([999], dtype=np.uint64), k=3) == []


def test_a_loaded_index_codes_its_copy_on_demand_and_when_filled(tmp_path):
    from forge.store.vectors import VectorIndex

    v = _vecs(300, dim=16)
    q = v[7]
    keys = np.arange(1, 301, dtype=np.uint64)
    saved = VectorIndex(dim=16, path=tmp_path / "i.usearch")
    saved.upsert(keys, v, seq=1)
    saved.save()
    loaded = VectorIndex(dim=16, path=tmp_path / "i.usearch")
    assert loaded.load() and not loaded._coded.any()
    among = keys[::3]
    want = [key for key, _ in saved.search_exact_among(q, among, k=5)]
    assert [key for key, _ in loaded.search_exact_among(q, among, k=5)] == want  # coded as it searched
    assert loaded._coded[among.astype(int)].all() and not loaded._complete
    loaded.fill_copy()
    assert loaded._complete and loaded._coded[keys.astype(int)].all()
    assert np.array_equal(loaded._codes, saved._codes[: len(loaded._codes)])
    assert [key for key, _ in loaded.search_exact_among(q, keys[1::3], k=5)] == \
        [key for key, _ in saved.search_exact_among(q, keys[1::3], k=5)]


def test_sparse_keys_get_no_copy_and_are_still_searched_exactly():
    from forge.store.vectors import VectorIndex

    idx = VectorIndex(dim=8, path=None)
    v = _vecs(100, dim=8)
    keys = np.arange(100, dtype=np.uint64) * 10_000_000  # a copy by key would be mostly empty rows
    idx.upsert(keys, v, seq=1)
    assert idx._sparse and len(idx._codes) == 0
    q = v[4]
    sims = (v @ q) / (np.linalg.norm(v, axis=1) * np.linalg.norm(q))
    assert [key for key, _ in idx.search_exact_among(q, keys, k=3)] == keys[np.argsort(-sims)[:3]].tolist()


def test_a_selective_tag_filter_is_searched_exactly_among_its_units(tmp_path, monkeypatch):
    """A filter whose rarest tag has few units lists them and searches them exactly, without an
    ANN probe; units added afterwards are found."""
    from forge.model import Context
    from forge.store.base import Filter

    s = SQLiteStore(tmp_path / "m.db")
    v = _vecs(2000, seed=3)
    s.add([Unit(f"u{i}", id=f"u{i}", context=Context(tags=("rare",) if i % 40 == 0 else ("common",)))
           for i in range(len(v))], v)
    s.vector_search(v[0], k=1, viewer=ADMIN)
    if s._warming is not None:
        s._warming.join()
    rare = Filter.make(tags_all=["rare"])
    index = s._ensure_index()
    monkeypatch.setattr(index, "search", lambda *a, **kw: pytest.fail("probed the ANN index"))
    tagged = np.arange(0, len(v), 40)
    q = v[7]
    sims = (v[tagged] @ q) / (np.linalg.norm(v[tagged], axis=1) * np.linalg.norm(q))
    want = [f"u{i}" for i in tagged[np.argsort(-sims)[:5]]]
    assert [h.id for h in s.vector_search(q, k=5, viewer=ADMIN, filter=rare)] == want
    assert [h.id for h in s.vector_search(q, k=5, viewer=ADMIN, filter=rare)] == want
    s.add([Unit("new", id="new", context=Context(tags=("rare",)))], q[None, :])
    assert [h.id for h in s.vector_search(q, k=5, viewer=ADMIN, filter=rare)] == ["new", *want[:4]]
    assert s.vector_search(q, k=5, viewer=ADMIN, filter=Filter.make(tags_all=["no-such-tag"])) == []
    s.close()


def test_the_candidate_list_grows_with_the_index():
    from forge.store.vectors import EXACT_MAX, VectorIndex, expansion_search

    sizes = [1_000, 100_000, 300_000, 1_000_000, 10**7, 10**9]
    efs = [expansion_search(n) for n in sizes]
    assert efs == sorted(efs) and efs[0] == efs[1] == 64 and expansion_search(1_000_000) == 202 and efs[-1] == 256
    idx = VectorIndex(dim=8, path=None)
    v = _vecs(EXACT_MAX + 500, dim=8)
    idx.upsert(np.arange(len(v), dtype=np.uint64), v, seq=1)
    assert idx.search(v[5], 3)[0][0] == 5
    assert idx._index.expansion_search == expansion_search(len(v))
