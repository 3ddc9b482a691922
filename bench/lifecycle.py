"""Memory lifecycle over a long stream: curation off vs on side by side, against issue 12's targets.

The stream is ``bench/curation.py``'s (seeded, one write a minute): new facts, exact
re-writes, paraphrases, value changes that make the old value false, and one-day notes that
go stale. Off: every write is a bare ``Memory.add``. On: every write goes through admission
(``forge.curate.admit``) and one curation pass runs at the end. Printed per side: store size,
duplicates (active units repeating a fact already held), recall@10 of the facts still true,
the share of recalls whose top 10 hold a superseded or expired fact, ms per add; then the
targets with curation on and whether each was met:

- at least 90% fewer exact or near duplicates than with curation off;
- stale-fact recall share at most 2%;
- recall of true facts not lower than with curation off;
- add p50 at most 2 ms over a bare add.

    python bench/lifecycle.py                 # 50,000 writes, hashing embedder (minutes)
    python bench/lifecycle.py --quick         # 5,000 writes
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import emit, parser, table  # noqa: E402
from curation import both_sides, side_rows  # noqa: E402

#: Issue 12's targets with curation on.
DUPLICATE_CUT = 0.90
STALE_SHARE = 0.02
ADD_OVER_BARE_MS = 2.0


def targets(off: dict[str, Any], on: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target with the measured value and whether it was met."""
    cut = 1.0 - on["duplicates"] / off["duplicates"] if off["duplicates"] else 1.0
    over = on["p50_ms"] - off["p50_ms"]
    return [
        {"target": f">= {DUPLICATE_CUT:.0%} fewer duplicates", "value": cut, "met": cut >= DUPLICATE_CUT},
        {"target": f"stale-fact recall share <= {STALE_SHARE:.0%}", "value": on["false_recall_share"], "met": on["false_recall_share"] <= STALE_SHARE},
        {"target": "recall@10 of true facts not lower", "value": on["recall_at_10"] - off["recall_at_10"], "met": on["recall_at_10"] >= off["recall_at_10"]},
        {"target": f"add p50 <= {ADD_OVER_BARE_MS:g} ms over a bare add", "value": over, "met": over <= ADD_OVER_BARE_MS},
    ]


def run(*, writes: int = 50_000, embedder: str = "hash", queries: int = 500) -> dict[str, Any]:
    """Both sides over one stream, and the targets; the result ``main`` prints."""
    with tempfile.TemporaryDirectory(prefix="forge-lifecycle-") as tmp:
        r = both_sides(writes, embedder=embedder, queries=queries, workdir=Path(tmp))
    return {"bench": "lifecycle", **r, "targets": targets(r["off"], r["on"])}


def render(r: dict[str, Any]) -> str:
    off, on = r["off"], r["on"]
    rows = [*side_rows(off, on), ("ms per write p50 over a bare add", 0.0, on["p50_ms"] - off["p50_ms"]), ("curation pass s", "-", on["pass_s"])]
    a = table(f"Lifecycle, curation off vs on: {r['writes']:,} writes ({r['mix']}), {r['queries']} queries, embedder {r['embedder']}", ["", "off", "on"], rows)
    b = table("Targets with curation on", ["target", "measured", "met"], [(t["target"], t["value"], "yes" if t["met"] else "NO") for t in r["targets"]])
    return f"{a}\n  admission decisions: {on['actions']}\n\n{b}"


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--writes", type=int, default=None, help="writes in the stream (default 50,000; --quick 5,000)")
    p.add_argument("--embedder", default="hash", help="hash | local (default hash: the pipeline, not the model)")
    p.add_argument("--queries", type=int, default=500)
    args = p.parse_args()
    n = args.writes or (5_000 if args.quick else 50_000)
    emit(run(writes=n, embedder=args.embedder, queries=args.queries), args.json, render)


if __name__ == "__main__":
    main()
