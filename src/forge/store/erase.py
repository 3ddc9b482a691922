"""Erasure (the right to be forgotten): a unit's text out of every table, leaving a tombstone.

Archiving keeps a unit for history; erasing removes it. :func:`erase_rows` is the SQL both
backends share, run inside one write transaction:

- the unit's row (content, search text, vector, meta and the merged duplicates' wording in
  it); each backend's own rows go with it through ``delete_unit`` (SQLite: its tags; the
  FTS5 index and the change feed by trigger; PostgreSQL: its keyword postings by cascade);
- every relation that names it, at either end;
- its history: every event about it;
- what other events say of it: an event whose data names its id or quotes its text (another
  unit's admission decision, a relation's note, a recall that returned it) keeps its ids and
  numbers, and every other string in it becomes ``[erased]``;
- then one ``erase`` event, the tombstone: who erased which id, when and why, with its kind,
  scope and owner and how much was removed, never its text.

What a backend must do after the commit (pages freed on disk, derived indexes on disk) is
its own; see ``SQLiteStore.erase`` and ``PostgresStore.erase``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from forge.errors import NotFoundError

__all__ = ["ERASED", "erase_rows", "scrub"]

#: What a string that may quote an erased unit becomes.
ERASED = "[erased]"


def scrub(value: Any, *, unit_id: str, text: str) -> Any:
    """``value`` with every string that could carry the erased text replaced: ids, names and
    other single short tokens stay (so an event still says which units it was about)."""
    if isinstance(value, str):
        plain = 0 < len(value) <= 128 and not any(c.isspace() for c in value) and (not text or text not in value)
        return value if plain or value == unit_id else ERASED
    if isinstance(value, dict):
        return {k: scrub(v, unit_id=unit_id, text=text) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v, unit_id=unit_id, text=text) for v in value]
    return value


def _like(text: str) -> str:
    """A LIKE pattern for ``text`` as it appears inside stored JSON (escaped as json.dumps writes it)."""
    quoted = json.dumps(text)[1:-1]
    return "%" + quoted.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def erase_rows(
    store: Any, db: Any, unit_id: str, *, actor: str, reason: str, delete_unit: Callable[[Any, str], None]
) -> dict[str, Any]:
    """Remove ``unit_id``'s rows inside the open write ``db`` of ``store`` (a SQLStore); the tombstone's data."""
    m = store.dialect.mark
    row = db.execute(f"SELECT kind, scope, owner, content FROM units WHERE id = {m}{store._LOCK_ROW}", (unit_id,)).fetchone()
    if row is None:
        raise NotFoundError(f"no unit with id {unit_id}")
    kind, scope, owner, content = row
    relations = db.execute(f"DELETE FROM relations WHERE src = {m} OR dst = {m}", (unit_id, unit_id)).rowcount
    delete_unit(db, unit_id)
    history = db.execute(f"DELETE FROM events WHERE unit_id = {m}", (unit_id,)).rowcount
    needles = [_like(unit_id)] + ([_like(content)] if len(content.strip()) >= 4 else [])
    cond = " OR ".join(f"data LIKE {m} ESCAPE '\\'" for _ in needles)
    mentions = db.execute(f"SELECT seq, data FROM events WHERE {cond}", needles).fetchall()
    for seq, data in mentions:
        cleaned = scrub(json.loads(data), unit_id=unit_id, text=content)
        db.execute(f"UPDATE events SET data = {m} WHERE seq = {m}", (json.dumps(cleaned), seq))
    done = {"kind": kind, "scope": scope, "owner": owner, "reason": reason,
            "removed": {"relations": max(relations, 0), "history": max(history, 0), "mentions_scrubbed": len(mentions)}}
    done["seq"] = store._log(db, "erase", unit_id, actor, done)
    return done
