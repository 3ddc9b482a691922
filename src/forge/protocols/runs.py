"""Run directories: the files an evolution run leaves, written so a kill at any moment loses
at most the work in flight.

    RUN/
      config.json                      the settings (written once, never rewritten)
      events.jsonl                     append-only log, one JSON object per line, flushed
      memory.db                        every unit, relation and episode (SQLite)
      checkpoints/stage-XX.json        every instance's state after stage XX (authoritative)
      checkpoints/stage-XX/inst-YY.result.json   one instance's finished stage (before the
                                       stage completes; what resume picks up)
      checkpoints/stage-XX/inst-YY.jsonl         that instance's memory export after the stage
      checkpoints/eval/inst-YY.json    one instance's final evaluation
      final.json                       the summary

JSON files are written to a temporary name and renamed, so a file either exists whole or not
at all. The store holds every instance's memory (its units, in its private scope): workers get
their memory from it and their results come back as store ops (:mod:`forge.protocols.ops`) recorded in the result files.
Every op is idempotent (unit and episode ids come from the files, use counts are absolute), so
replaying a file after a crash is harmless.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from forge.engine.memory import Memory
from forge.errors import ConfigError, ForgeError, NotFoundError, StoreError
from forge.model import Episode, Scope, Status, Unit, Viewer
from forge.protocols.config import ForgeConfig
from forge.protocols.ops import Add, Archive, Op, Relate, SetCounts, Supersede, parse_all
from forge.store import Filter

__all__ = ["RunDir", "RunStore"]

_ADMIN = Viewer.admin()


def _write_json(path: Path, data: Any) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=False)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


class RunDir:
    """Paths and file I/O of one run directory; the only code that writes its JSON files."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def config_path(self) -> Path:
        return self.path / "config.json"

    @property
    def events_path(self) -> Path:
        return self.path / "events.jsonl"

    @property
    def db_path(self) -> Path:
        return self.path / "memory.db"

    @property
    def final_path(self) -> Path:
        return self.path / "final.json"

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    def stage_path(self, stage: int) -> Path:
        return self.checkpoints / f"stage-{stage:02d}.json"

    def stage_dir(self, stage: int) -> Path:
        return self.checkpoints / f"stage-{stage:02d}"

    def result_path(self, stage: int, instance: int) -> Path:
        return self.stage_dir(stage) / f"inst-{instance:02d}.result.json"

    def export_path(self, stage: int, instance: int) -> Path:
        return self.stage_dir(stage) / f"inst-{instance:02d}.jsonl"

    def eval_path(self, instance: int) -> Path:
        return self.checkpoints / "eval" / f"inst-{instance:02d}.json"

    # -- creation and loading ---------------------------------------------------------------
    def create(self, config: ForgeConfig) -> None:
        """Start a new run here; refuses a directory that already holds anything."""
        if self.config_path.exists():
            raise ConfigError(f"{self.path} already holds a run; resume it with --resume {self.path} or pick another --run-dir")
        if self.path.exists() and (not self.path.is_dir() or any(self.path.iterdir())):
            raise ConfigError(f"{self.path} exists and is not an empty directory; pick another --run-dir")
        self.path.mkdir(parents=True, exist_ok=True)
        self.checkpoints.mkdir(exist_ok=True)
        _write_json(self.config_path, config.to_dict())

    def load_config(self) -> ForgeConfig:
        if not self.path.is_dir():
            raise NotFoundError(f"no run directory at {self.path}")
        if not self.config_path.is_file():
            raise NotFoundError(f"{self.path} is not a FORGE run: config.json is missing")
        data = self.read_json(self.config_path)
        try:
            return ForgeConfig.from_dict(data)
        except (ConfigError, TypeError) as exc:
            raise StoreError(f"{self.config_path}: not a valid run config ({exc}); nothing was changed") from None

    def read_json(self, path: Path) -> Any:
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreError(f"{path}: corrupt or unreadable ({exc.__class__.__name__}: {exc}); nothing was changed") from None

    def write_json(self, path: Path, data: Any) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_json(path, data)

    def write_jsonl(self, path: Path, records: Iterable[Mapping[str, Any]]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            for r in records:
                fh.write(json.dumps(r, sort_keys=True) + "\n")
        os.replace(tmp, path)

    # -- events -----------------------------------------------------------------------------
    def event(self, name: str, **data: Any) -> None:
        """Append one event line and flush it (a kill loses no logged event)."""
        line = json.dumps({"ts": round(time.time(), 3), "event": name, **data}, default=str)
        with self.events_path.open("a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()

    def events(self) -> list[dict[str, Any]]:
        """Every complete event line; a torn last line (killed mid-write) is skipped."""
        out: list[dict[str, Any]] = []
        if not self.events_path.exists():
            return out
        for line in self.events_path.read_text(encoding="utf-8").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
        return out

    # -- checkpoints ------------------------------------------------------------------------
    def completed_stages(self, stages: int) -> list[int]:
        return [s for s in range(stages) if self.stage_path(s).is_file()]


class RunStore:
    """The run's memory store, written only by the parent process, idempotently."""

    def __init__(self, run: RunDir, config: ForgeConfig) -> None:
        self.config = config
        try:
            self.memory = Memory.open(run.db_path, embedder=config.embedder)
        except ForgeError as exc:
            raise StoreError(f"{run.db_path}: cannot open the run's memory store ({exc}); nothing was changed") from None

    def close(self) -> None:
        self.memory.close()

    def add_episodes(self, episodes: Iterable[Mapping[str, Any]]) -> None:
        for data in episodes:
            try:
                self.memory.get_episode(data["id"])
                continue
            except NotFoundError:
                pass
            self.memory.add_episode(Episode.from_dict(data), actor="forge")

    def units(self, instance: int) -> list[Unit]:
        """Instance ``instance``'s memory: its active units as its own viewer sees them, oldest first."""
        viewer = Viewer.of(f"inst-{instance}")
        return self.memory.list(viewer=viewer, filter=Filter.make(owner=f"inst-{instance}"), limit=1_000_000)

    def vectors(self, units: Sequence[Unit]) -> np.ndarray | None:
        """The vectors ``units`` are stored with, one row each (None if any has none): what a
        worker's scratch memory and a broadcast copy store, instead of embedding again."""
        vecs = [self.memory.vector(u.id, viewer=_ADMIN) for u in units]
        if not vecs or any(v is None for v in vecs):
            return None
        return np.stack([v for v in vecs if v is not None])

    def apply(self, ops: Iterable[Op | Mapping[str, Any]], *, owner: str) -> None:
        """Apply store ops (typed, or their dicts from a run file); safe to apply twice.

        Every op is parsed before any is applied: an unknown or malformed one is a
        :class:`~forge.errors.ValidationError` and nothing is written."""
        parsed = parse_all(ops)
        adds = [op for op in parsed if isinstance(op, Add)]
        if adds:
            present = {u.id for u in self.memory.get_many([op.unit.id for op in adds], viewer=_ADMIN)}
            new = [op for op in adds if op.unit.id not in present]
            if any(op.unit.owner != owner or op.unit.scope != Scope("private") for op in new):
                raise StoreError(f"a result for {owner} adds units outside its private scope; nothing was applied")
            dim = self.memory.embedder.dim
            carried = [op for op in new if op.vector is not None and op.vector.shape == (dim,)]
            bare = [op.unit for op in new if op not in carried]  # from a file written before ops carried vectors
            with self.memory.transaction():
                if carried:  # what the worker embedded is stored as it is
                    self.memory.add([op.unit for op in carried], vectors=np.stack([op.vector for op in carried if op.vector is not None]), actor="forge")
                if bare:
                    self.memory.add(bare, actor="forge")
        for op in parsed:
            if isinstance(op, SetCounts):
                self._counts(op)
            elif isinstance(op, Archive):
                self._status(op.id, Status.ARCHIVED, op.reason)
            elif isinstance(op, Supersede):
                self._status(op.id, Status.SUPERSEDED, op.reason)
            elif isinstance(op, Relate):
                self.memory.relate(op.src, op.dst, op.type, note=op.note, actor="forge")

    def _counts(self, op: SetCounts) -> None:
        try:
            unit = self.memory.get(op.id, viewer=_ADMIN)
        except NotFoundError:
            return
        counts = {"uses": op.uses, "successes": op.successes, "failures": op.failures}
        if all(unit.meta.get(k, 0) == v for k, v in counts.items()) and unit.validation == op.validation:
            return
        self.memory.update(unit.replace(meta={**unit.meta, **counts}, validation=op.validation), actor="forge", reembed=False)

    def _status(self, unit_id: str, status: Status, reason: str) -> None:
        try:
            unit = self.memory.get(unit_id, viewer=_ADMIN)
        except NotFoundError:
            return
        if unit.status != status:
            self.memory.set_status(unit_id, status, reason=reason, actor="forge")

    def export(self, owner: str) -> list[dict[str, Any]]:
        """The owner's active units, oldest first, as unit records."""
        out: list[dict[str, Any]] = []
        offset = 0
        while True:
            page = self.memory.list(viewer=_ADMIN, filter=Filter.make(owner=owner), limit=500, offset=offset)
            out += [u.to_dict() for u in page]
            if len(page) < 500:
                return out
            offset += 500
