"""Where a population plays: process workers vs Ray tasks, at 1, 2 and 4 workers.

``forge evolve`` on frozenlake-4x4 with the scripted test LLM (no model: what is measured
is the executor's own cost, the part Ray adds or saves), N instances, S stages, one attempt
and one evaluation episode each. A task is one instance's stage or its final evaluation, so
a run is N * (S + 1) tasks. Ray's time includes starting a local Ray (``ray.init``) once per
run, as ``forge evolve --executor ray`` does; the results of both executors are compared too
(they must be equal for the same seeds).

    python bench/population_executors.py [--quick] [--json] [--workers 1,2,4] [--instances N]
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import emit, log, parser, table
from forge.protocols import ForgeConfig, evolve


def one(executor: str, workers: int, instances: int, stages: int, where: Path) -> dict[str, Any]:
    cfg = ForgeConfig(condition="forge-no-graduation", env="frozenlake-4x4", llm="test", instances=instances,
                      stages=stages, attempts=1, eval_episodes=1, workers=workers)
    t0 = time.perf_counter()
    result = evolve(cfg, where / f"{executor}-{workers}", executor=executor)
    wall = time.perf_counter() - t0
    tasks = instances * (stages + 1)
    log(f"  {executor} x{workers}: {wall:.1f}s, {tasks / wall:.2f} tasks/s")
    return {"wall_s": round(wall, 2), "tasks_per_s": round(tasks / wall, 2),
            "mean_return": result.final["evaluation"]["mean_return"]}


def run(workers: list[int], instances: int, stages: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="forge-bench-pop-"))
    try:
        rows = []
        for w in workers:
            log(f"{w} worker(s) ...")
            rows.append({"workers": w, "process": one("process", w, instances, stages, tmp),
                         "ray": one("ray", w, instances, stages, tmp)})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"bench": "population_executors", "instances": instances, "stages": stages,
            "tasks": instances * (stages + 1), "rows": rows}


def render(r: dict[str, Any]) -> str:
    rows = [[x["workers"], x["process"]["tasks_per_s"], x["ray"]["tasks_per_s"], x["process"]["wall_s"], x["ray"]["wall_s"],
             round(x["ray"]["wall_s"] - x["process"]["wall_s"], 2),
             "yes" if x["ray"]["mean_return"] == x["process"]["mean_return"] else "NO"]
            for x in r["rows"]]
    return table(f"forge evolve, {r['instances']} instances x {r['stages']} stages ({r['tasks']} tasks), scripted LLM",
                 ["workers", "process tasks/s", "ray tasks/s", "process s", "ray s", "ray overhead s", "same result"], rows)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    p.add_argument("--instances", type=int, default=None, help="population size (default 8, quick 4)")
    p.add_argument("--stages", type=int, default=None, help="stages (default 3, quick 2)")
    a = p.parse_args()
    emit(run([int(w) for w in a.workers.split(",") if w], a.instances or (4 if a.quick else 8),
             a.stages or (2 if a.quick else 3)), a.json, render)


if __name__ == "__main__":
    main()
