"""The ANN index is a cache of the SQLite file: rebuilt when missing, caught up when stale."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np

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
