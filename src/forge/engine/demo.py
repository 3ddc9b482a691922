"""The engine demo: load sample memories, then recall them as different agents.

Shows what FORGE's recall returns and why (which signals matched), that scope is enforced
(an agent never sees another agent's private notes), and what a packed prompt block looks
like. Runs offline on the embedded embedder.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from forge.engine.memory import Memory
from forge.engine.recall import pack
from forge.model import Viewer

__all__ = ["QUERIES", "run_demo", "sample_records"]

QUERIES: list[tuple[str, Viewer]] = [
    ("how do I avoid falling into a hole on the frozen lake?", Viewer.of("scout", ["ops"])),
    ("the taxi got a penalty for dropping off", Viewer.of("scout", ["ops"])),
    ("postgres table has too many dead tuples", Viewer.of("analyst", ["ops"])),
    ("where is the flag and what is the admin password rotation?", Viewer.of("scout")),
]


def sample_records() -> list[dict[str, Any]]:
    text = resources.files("forge").joinpath("data/sample_memories.jsonl").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def run_demo(out_dir: Path, *, embedder: str = "local", k: int = 4) -> dict[str, Any]:
    """Build ``out_dir/demo.db`` afresh from the sample and run the demo queries."""
    out_dir.mkdir(parents=True, exist_ok=True)
    db = out_dir / "demo.db"
    for suffix in ("", "-wal", "-shm", ".usearch", ".usearch.json"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    lines: list[str] = []
    data: dict[str, Any] = {"db": str(db), "queries": []}
    with Memory.open(db, embedder=embedder) as mem:
        n = mem.import_records(sample_records(), actor="demo")
        lines.append(f"loaded {n} sample records into {db} (embedder {mem.embedder.name})\n")
        for query, viewer in QUERIES:
            who = f"{viewer.agent} (groups: {', '.join(sorted(viewer.groups)) or 'none'})"
            results = mem.recall(query, viewer=viewer, k=k)
            lines.append(f"? {query}\n  as {who}")
            for r in results:
                lines.append(f"  {r.score:.4f} [{r.unit.kind.value}/{r.unit.scope}] {r.unit.content[:90]}")
                lines.append(f"         why: {'; '.join(r.reasons)}")
            data["queries"].append(
                {"query": query, "agent": viewer.agent,
                 "results": [{"id": r.unit.id, "score": r.score, "reasons": r.reasons} for r in results]}
            )
            lines.append("")
        packed = pack(mem.recall(QUERIES[0][0], viewer=QUERIES[0][1], k=10), budget=120)
        lines.append(f"packed prompt block for the first query ({packed.tokens}/{packed.budget} tokens):")
        lines.append(packed.render())
        data["packed"] = {"tokens": packed.tokens, "prompt": packed.render()}
    return {"text": "\n".join(lines), "data": data}
