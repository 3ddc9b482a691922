"""The ``forge`` command line: thin commands over the library.

Every command calls the same functions a Python user would; output is for humans by
default and JSON with ``--json``. Errors print one line (``error: ...``) and exit non-zero:
2 for something the user can fix (bad arguments, bad input files, a missing file or
directory), 1 for a backend failure. No traceback reaches the user: an exception nobody
expected is reported in one line as an internal error (exit 1).

``--agent`` and ``--group`` say whose view to take; they are taken on the user's word
(whoever runs the command can read the file anyway), so they scope what is shown, they do
not authenticate anyone.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from forge.errors import ForgeError, UserError, ValidationError
from forge.files import read_text
from forge.model import (
    Context,
    Kind,
    Provenance,
    RelationType,
    Scope,
    Status,
    Unit,
    Viewer,
)

__all__ = ["cli", "main"]

KINDS = [k.value for k in Kind]
RELATIONS = [r.value for r in RelationType]
STATUSES = [s.value for s in Status]


class _Ctx:
    def __init__(self, db: str, embedder: str | None, as_json: bool) -> None:
        self.db = db
        self.embedder = embedder
        self.as_json = as_json

    def memory(self, *, must_exist: bool = False):  # -> Memory (imported lazily: keeps --help fast)
        from forge.engine.memory import Memory

        server = self.db.startswith(("postgresql://", "postgres://"))  # the server says what exists
        if must_exist and self.db != ":memory:" and not server and not Path(self.db).exists():
            raise UserError(f"{self.db}: no such database; create it with 'forge add' or 'forge import'")
        # The embedder is built before the store is opened: a bad --embedder leaves no
        # new, empty database (nor its -wal/-shm files) behind.
        return Memory.open(self.db, embedder=_embedder(self.embedder) if self.embedder else None)

    def emit(self, data: Any, human: str) -> None:
        click.echo(json.dumps(data, indent=2, default=str) if self.as_json else human)

    def progress(self, description: str, total: int | None, *, then: str | None = None) -> Any:
        """A progress display for long work (see :func:`progress`); commands in other packages
        reach it here, since they cannot import this module."""
        return progress(description, total, then=then)

    def counting(self, mem: Any, bar: Any) -> Any:
        return counting(mem, bar)


pass_ctx = click.make_pass_decorator(_Ctx)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--db", default="forge.db", show_default=True, envvar="FORGE_DB", help="Memory database file, or postgresql://USER@HOST/DB[?schema=NAME] (password from PGPASSWORD). Read from FORGE_DB when not given.")
@click.option(
    "--embedder",
    default=None,
    help="local | hash[:DIM] | openai:MODEL. Default: the one the database was built with, else local.",
)
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (every command also takes --json after its name).")
@click.version_option(package_name="forge-memory")
@click.pass_context
def cli(ctx: click.Context, db: str, embedder: str | None, as_json: bool) -> None:
    """FORGE: self-improving, shareable memory for LLM agents."""
    if os.environ.get("FORGE_SCREEN_PROBE", "").strip():
        # Checked before any command runs: a bad value would otherwise surface in the first
        # Exchange a server or swarm builds, long after start-up (imported only when set).
        from forge.share.screen import probe_from_env

        probe_from_env()
    ctx.obj = _Ctx(db, embedder, as_json)


def _viewer(agent: str | None, groups: tuple[str, ...]) -> Viewer:
    return Viewer.of(agent, groups) if agent else Viewer.admin()


@cli.command()
@click.argument("content")
@click.option("--kind", type=click.Choice(KINDS), default="fact", show_default=True)
@click.option("--domain", default="")
@click.option("--task", default="")
@click.option("--role", default="")
@click.option("--tag", "tags", multiple=True, help="Free tag (repeatable).")
@click.option("--scope", default="global", show_default=True, help="private | group:NAME | global")
@click.option("--owner", default="", help="Owner / source agent (required for private units).")
@click.option("--confidence", type=float, default=0.5, show_default=True)
@click.option("--importance", type=float, default=0.5, show_default=True)
@click.option("--validation", type=float, default=0.5, show_default=True)
@click.option("--source", default="user", show_default=True, help="Provenance source.")
@click.option("--derived-from", "derived", multiple=True, help="Unit id this one derives from (repeatable).")
@click.option("--meta", "meta_json", default="{}", help="Extra fields as a JSON object.")
@click.option("--admit/--no-admit", "through_admission", default=True, show_default=True,
              help="Admission (forge.curate): a duplicate merges into the unit already stored, a newer "
                   "contradiction updates it; --no-admit stores the unit as given.")
@pass_ctx
def add(obj: _Ctx, content: str, kind: str, domain: str, task: str, role: str, tags: tuple[str, ...], scope: str,
        owner: str, confidence: float, importance: float, validation: float, source: str,
        derived: tuple[str, ...], meta_json: str, through_admission: bool) -> None:
    """Add one memory unit."""
    meta = _json_object(meta_json, "--meta")
    unit = Unit(
        content=content,
        kind=kind,  # type: ignore[arg-type]
        context=Context(domain=domain, task=task, role=role, tags=tags),
        scope=Scope.parse(scope),
        owner=owner,
        confidence=confidence,
        importance=importance,
        validation=validation,
        provenance=Provenance(source=source, derived_from=derived),
        meta=meta,
    )
    from forge.curate.admission import admit

    with obj.memory() as mem:
        for parent in derived:
            mem.get(parent, viewer=Viewer.admin())
        decision = admit(mem, unit, actor="cli")[0] if through_admission else None
        [uid] = [decision.unit_id] if decision is not None else mem.add(unit, actor="cli")
        for parent in derived:
            mem.relate(uid, parent, "derived_from", actor="cli")
    if decision is None:
        obj.emit({"id": uid}, uid)
    else:  # the id alone on stdout (ID=$(forge add ...)); what admission did on stderr
        obj.emit({"id": uid, "admission": {**decision.to_dict(), "summary": decision.summary}}, uid)
        if not obj.as_json:
            click.echo(f"{decision.summary}: {decision.reason}", err=True)


@cli.command()
@click.argument("query")
@click.option("-k", "k", type=int, default=10, show_default=True, help="How many units.")
@click.option("--kind", "kinds", multiple=True, type=click.Choice(KINDS))
@click.option("--tag", "tags", multiple=True, help="Require this tag (repeatable).")
@click.option("--any-tag", "any_tags", multiple=True, help="Require at least one of these tags.")
@click.option("--domain", default=None)
@click.option("--task", default=None)
@click.option("--role", default=None)
@click.option("--status", "statuses", multiple=True, type=click.Choice(STATUSES), help="Default: active.")
@click.option("--agent", default=None, help="Recall as this agent (scope enforced; self-asserted, not authenticated: "
              "anyone who can open the file can read as any agent). Default: operator view.")
@click.option("--group", "groups", multiple=True, help="Groups the agent belongs to.")
@click.option("--hops", type=int, default=1, show_default=True, help="Graph expansion depth.")
@click.option("--budget", type=int, default=None, help="Pack into this many tokens and print the prompt block.")
@click.option("--no-touch", is_flag=True, help="Do not update access statistics.")
@click.option("--min-score", type=click.FloatRange(0.0, 1.0), default=0.0, show_default=True, help="Leave out results scored below this (scores are 0-1).")
@pass_ctx
def recall(obj: _Ctx, query: str, k: int, kinds: tuple[str, ...], tags: tuple[str, ...], any_tags: tuple[str, ...],
           domain: str | None, task: str | None, role: str | None, statuses: tuple[str, ...], agent: str | None,
           groups: tuple[str, ...], hops: int, budget: int | None, no_touch: bool, min_score: float) -> None:
    """Recall the units that best match QUERY, with why each was returned (scores 0-1)."""
    from forge.engine.recall import pack
    from forge.store import Filter

    if not query.strip():
        raise ValidationError("the query is empty; say what to recall, e.g. forge recall 'thin ice'")
    flt = Filter.make(kinds=kinds, tags_all=tags, tags_any=any_tags, domain=domain, task=task, role=role,
                      status=statuses or None)
    with obj.memory(must_exist=True) as mem:
        results = mem.recall(query, viewer=_viewer(agent, groups), k=k, filter=flt, hops=hops, touch=not no_touch, min_score=min_score)
    if budget is not None:
        packed = pack(results, budget=budget)
        obj.emit(
            {"tokens": packed.tokens, "budget": budget, "prompt": packed.render(),
             "units": [u.id for u in packed.units]},
            packed.render() + f"\n\n({packed.tokens}/{budget} tokens, {len(packed.units)} units)",
        )
        return
    data = [{"id": r.unit.id, "score": round(r.score, 6), "kind": r.unit.kind.value, "content": r.unit.content,
             "why": r.why, "reasons": r.reasons} for r in results]
    lines = [f"{i:>2}. [{r.unit.kind.value}] {r.unit.content}\n    id={r.unit.id} score={r.score:.4f} "
             f"why: {'; '.join(r.reasons)}" for i, r in enumerate(results, 1)]
    obj.emit(data, "\n".join(lines) if lines else "(nothing recalled)")


@cli.command()
@click.argument("unit_id")
@click.option("--agent", default=None, help="Show as this agent (scope enforced; self-asserted, not authenticated).")
@click.option("--group", "groups", multiple=True)
@pass_ctx
def show(obj: _Ctx, unit_id: str, agent: str | None, groups: tuple[str, ...]) -> None:
    """Show one unit with its relations and change history."""
    viewer = _viewer(agent, groups)
    with obj.memory(must_exist=True) as mem:
        unit = mem.get(unit_id, viewer=viewer)
        rels = mem.store.relations(unit_id, viewer=viewer)
        events = mem.store.events(unit_id=unit_id, viewer=viewer)
    data = {**unit.to_dict(), "relations": [r.to_dict() for r in rels],
            "events": [{"seq": e.seq, "ts": e.ts, "op": e.op, "actor": e.actor, "data": e.data} for e in events]}
    lines = [f"{unit.id}  [{unit.kind.value}]  {unit.status.value}  scope={unit.scope}  owner={unit.owner or '-'}",
             f"  {unit.content}",
             f"  confidence={unit.confidence} validation={unit.validation} importance={unit.importance} "
             f"accessed={unit.access_count}x",
             f"  context: {json.dumps(unit.context.to_dict())}",
             f"  provenance: {json.dumps(unit.provenance.to_dict())}"]
    lines += [f"  {r.src} -[{r.type.value}]-> {r.dst}" for r in rels]
    lines += [f"  event #{e.seq} {e.op} by {e.actor or '-'} {json.dumps(e.data)[:120]}" for e in events]
    obj.emit(data, "\n".join(lines))


@cli.command()
@click.argument("src")
@click.argument("relation", type=click.Choice(RELATIONS))
@click.argument("dst")
@click.option("--weight", type=float, default=1.0, show_default=True)
@click.option("--note", default="")
@pass_ctx
def relate(obj: _Ctx, src: str, relation: str, dst: str, weight: float, note: str) -> None:
    """Relate two units: SRC RELATION DST (e.g. abc supports def)."""
    with obj.memory(must_exist=True) as mem:
        rel = mem.relate(src, dst, relation, weight=weight, note=note, actor="cli")
    obj.emit(rel.to_dict(), f"{src} -[{relation}]-> {dst}")


@cli.command()
@click.argument("unit_id")
@click.option("--reason", required=True, help="Why (kept in the tombstone event), e.g. 'erasure request 12'.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@pass_ctx
def erase(obj: _Ctx, unit_id: str, reason: str, yes: bool) -> None:
    """Erase a unit for good: its text, vector, keyword postings, relations and history go;
    one tombstone event says who erased it, when and why. (To forget a unit and keep its
    history, archive it: forge curate, or status archived through the API.)"""
    with obj.memory(must_exist=True) as mem:
        unit = mem.get(unit_id, viewer=Viewer.admin())
        if not yes:
            if not sys.stdin.isatty():
                raise UserError("erasing cannot be undone: add --yes to erase without being asked")
            click.confirm(f"Erase {unit.id} ({unit.kind.value}: {unit.content[:60]!r}) for good?", abort=True, err=True)
        done = mem.erase(unit_id, reason=reason, actor="cli")
    removed = done["removed"]
    obj.emit({"erased": unit_id, **done}, f"erased {unit_id}: {removed['relations']} relation(s), {removed['history']} history event(s), "
             f"{removed['mentions_scrubbed']} other event(s) scrubbed; tombstone event #{done['seq']}")


@cli.command("export")
@click.argument("path", default="-")
@click.option("--agent", default=None, help="Export only what this agent may see. Default: everything.")
@click.option("--group", "groups", multiple=True, help="Groups the agent belongs to.")
@pass_ctx
def export_cmd(obj: _Ctx, path: str, agent: str | None, groups: tuple[str, ...]) -> None:
    """Write every unit, relation and episode as JSONL (lossless; '-' = stdout)."""
    from forge.store import Filter

    target = None if path == "-" else _export_target(path)
    viewer = _viewer(agent, groups)
    with obj.memory(must_exist=True) as mem:
        total = mem.count(viewer=viewer, filter=Filter.make(status=STATUSES)) if sys.stderr.isatty() else None
        with progress("exporting units", total) as bar:
            records = _counted(mem.export(viewer=viewer), bar)
            if target is None:
                n = _write_jsonl(sys.stdout, records)
            else:
                n = _write_atomically(target, records)
    if target is not None:
        obj.emit({"records": n, "path": path}, f"exported {n} records to {path}")


@cli.command("import")
@click.argument("path")
@click.option("--with-history", is_flag=True, help="Also write the audit events and settings (reputations) the records carry: "
              "restoring a whole store's export. Without it such records are refused.")
@pass_ctx
def import_cmd(obj: _Ctx, path: str, with_history: bool) -> None:
    """Import JSONL records in one transaction: every line lands or none does."""
    from forge.store.records import check_history

    records = list(_read_jsonl(path))
    check_history(records, allowed=with_history)
    units = [r for r in records if isinstance(r, dict) and r.get("record") == "unit"]
    to_embed = len(units) if units and not any("vector" in r for r in units) else 0  # embedded only when none has one
    writing = f"writing {len(records):,} records in one transaction"
    with obj.memory() as mem, progress("embedding units", to_embed, then=writing) if to_embed else progress(writing, None) as bar:
        n = counting(mem, bar).import_records(records, actor="cli-import")
    obj.emit({"records": n}, f"imported {n} records")


@cli.command()
@pass_ctx
def stats(obj: _Ctx) -> None:
    """Counts by kind, status and scope."""
    with obj.memory(must_exist=True) as mem:
        s = mem.stats()
    human = [f"{s['units']} units, {s['relations']} relations, {s['episodes']} episodes, {s['events']} events",
             f"embedder: {s['embedder']} (dim {s['dim']})"]
    for key in ("by_kind", "by_status", "by_scope"):
        human.append(f"{key[3:]}: " + ", ".join(f"{k}={v}" for k, v in s[key].items()))
    obj.emit(s, "\n".join(human))


@cli.command()
@click.option("--dir", "out_dir", default="forge-demo", show_default=True, help="Where the demo database goes.")
@pass_ctx
def demo(obj: _Ctx, out_dir: str) -> None:
    """Load sample memories and recall them with explanations."""
    from forge.engine.demo import run_demo

    report = run_demo(Path(out_dir), embedder=obj.embedder or "local")
    obj.emit(report["data"], report["text"])


# -- helpers ------------------------------------------------------------------------------


class _Quiet:
    """A progress display that shows nothing (output is not a terminal)."""

    def advance(self, n: int = 1) -> None:
        return None

    def phase(self, description: str, total: int | None = None) -> None:
        return None


class _Bar(_Quiet):
    def __init__(self, progress: Any, task: Any, then: str | None) -> None:
        self.progress, self.task, self.then = progress, task, then

    def advance(self, n: int = 1) -> None:
        self.progress.advance(self.task, n)
        if self.then and next(t for t in self.progress.tasks if t.id == self.task).finished:  # e.g. embedded everything: now writing
            self.phase(self.then)
            self.then = None

    def phase(self, description: str, total: int | None = None) -> None:
        """Go on to the next step of the work (a new line; ``total=None``: a spinner)."""
        self.progress.update(self.task, visible=False)
        self.task = self.progress.add_task(description, total=total)


class _Logged(_Quiet):
    """Progress as lines on standard error where no bar can be drawn (a log, a pipe, CI): what
    was done, the time elapsed and left, at most one line per :data:`~forge.protocols.progress.QUIET_S`
    seconds and none through work shorter than that. A heartbeat thread speaks for a phase that
    counts nothing (a curation pass), so a long silent step still shows it is alive."""

    def __init__(self, description: str, total: int | None, then: str | None) -> None:
        from forge.protocols.progress import Lines

        self.lines = Lines()
        self.description, self.total, self.then, self.done = description, total, then, 0
        self._stop = threading.Event()
        self._beat = threading.Thread(target=self._heartbeat, name="forge-progress", daemon=True)
        self._beat.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(1.0):
            if self.lines.due():
                self._line()

    def _line(self, *, force: bool = False) -> None:
        self.lines.count(self.description, self.done, self.total, force=force)

    def advance(self, n: int = 1) -> None:
        self.done += n
        self._line()
        if self.then and self.total is not None and self.done >= self.total:  # e.g. embedded everything: now writing
            self.phase(self.then)
            self.then = None

    def phase(self, description: str, total: int | None = None) -> None:
        self.description, self.total, self.done = description, total, 0
        self.lines.mark()

    def close(self) -> None:
        self._stop.set()
        self._beat.join()
        # work that outlasted the quiet start says that it ended, and when
        self.lines.write(f"{self.description}: done | {self.lines.timing(0, None)}", force=True)


@contextlib.contextmanager
def progress(description: str, total: int | None, *, then: str | None = None) -> Iterator[_Quiet]:
    """A rich progress bar on standard error while the work runs when that is a terminal, and
    lines there otherwise (:class:`_Logged`: only for work that lasts); standard output stays
    the data. ``total=None``: a spinner; ``then``: what the spinner says once the bar is full
    (the write after the embedding)."""
    if not sys.stderr.isatty():
        logged = _Logged(description, total, then)
        try:
            yield logged
        finally:
            logged.close()
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
               TextColumn("left"), TimeRemainingColumn())
    with Progress(*columns, console=Console(stderr=True), transient=True) as bar:
        yield _Bar(bar, bar.add_task(description, total=total), then)


class _Counting:
    """An embedder that embeds in batches and advances a progress display after each: the
    embedding is most of an import or a bulk add (1,500 units: ~19 s on 2 cores, silent before)."""

    def __init__(self, inner: Any, bar: _Quiet, *, batch: int = 64) -> None:
        self._inner, self._bar, self._batch = inner, bar, batch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def embed(self, texts: Any) -> Any:
        import numpy as np

        texts = list(texts)
        if len(texts) <= self._batch:
            out = self._inner.embed(texts)
            self._bar.advance(len(texts))
            return out
        parts = []
        for i in range(0, len(texts), self._batch):
            parts.append(self._inner.embed(texts[i : i + self._batch]))
            self._bar.advance(len(parts[-1]))
        return np.concatenate(parts)


def counting(mem: Any, bar: _Quiet) -> Any:
    """``mem`` with its embedder reporting to ``bar`` (nothing else about it changes)."""
    if not isinstance(bar, (_Bar, _Logged)):
        return mem
    mem.embedder = _Counting(mem.embedder, bar)
    return mem


#: The largest hashing-embedder dimension accepted (a vector of 65,536 floats is 256 KiB).
MAX_HASH_DIM = 65_536


def _embedder(spec: str) -> Any:
    """The embedder ``--embedder`` names, checked and built (nothing is opened on disk)."""
    from forge.engine.embed import open_embedder
    from forge.errors import ConfigError

    name, _, arg = spec.partition(":")
    if name == "hash" and arg:
        try:
            dim = int(arg)
        except ValueError:
            raise ConfigError(f"--embedder {spec}: the dimension must be a whole number, e.g. hash:256") from None
        if not 8 <= dim <= MAX_HASH_DIM:
            raise ConfigError(f"--embedder {spec}: the hashing dimension must be between 8 and {MAX_HASH_DIM:,}")
    return open_embedder(spec)


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise ValidationError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ValidationError(f"{what} must be a JSON object")
    return value


def _read_jsonl(path: str) -> Iterator[dict[str, Any]]:
    name = "standard input" if path == "-" else path
    text = read_text(path)
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError as exc:
            raise ValidationError(f"{name}:{n}: malformed JSON ({exc})") from None
        except RecursionError:
            raise ValidationError(f"{name}:{n}: JSON nested too deeply") from None


def _counted(records: Any, bar: _Quiet) -> Iterator[dict[str, Any]]:
    """The export's records, advancing ``bar`` per unit; the rest (relations, events) on a spinner."""
    done = False
    for rec in records:
        if rec.get("record") == "unit":
            bar.advance()
        elif not done:
            done = True
            bar.phase("exporting relations, episodes and events")
        yield rec


def _write_jsonl(fh: Any, records: Any) -> int:
    n = 0
    for rec in records:
        fh.write(json.dumps(rec, sort_keys=True) + "\n")
        n += 1
    return n


def _export_target(path: str) -> Path:
    """Where an export goes, checked before anything is read or written.

    Only a regular file (or a new name) is written, by renaming a finished temporary file
    onto it: a FIFO, a device or a symbolic link there would be replaced, not written
    through, so they are refused.
    """
    import stat

    target = Path(path)
    if target.is_dir():
        raise UserError(f"{path}: is a directory; give a file name to export to")
    try:
        mode = os.lstat(target).st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:
        raise UserError(f"{path}: cannot check it ({exc.strerror or exc})") from None
    if mode is not None and not stat.S_ISREG(mode):
        what = ("a symbolic link" if stat.S_ISLNK(mode) else "a FIFO" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise UserError(f"{path}: is {what}; export writes regular files only (give a new file name, or '-' to write to standard output)")
    parent = target.parent
    if not parent.is_dir():
        raise UserError(f"{parent}: no such directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UserError(f"{parent}: no permission to write here")
    return target


def _write_atomically(target: Path, records: Any) -> int:
    """Write to a unique temporary file beside ``target`` and rename it into place; on any
    failure the temporary file is removed and ``target`` is left as it was."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise UserError(f"{target}: cannot write ({exc.strerror or exc})") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            n = _write_jsonl(fh, records)
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise UserError(f"{target}: cannot write ({exc.strerror or exc})") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return n


from forge.curate.cli import curate_command, trace_command  # noqa: E402
from forge.population.swarm_cli import swarm_command  # noqa: E402
from forge.protocols.cli import evolve_command, report_command  # noqa: E402  (after cli is defined)
from forge.server.cli import register as _register_service  # noqa: E402
from forge.team.cli import team_command  # noqa: E402

cli.add_command(evolve_command, "evolve")
cli.add_command(report_command, "report")
cli.add_command(swarm_command, "swarm")
cli.add_command(team_command, "team")
cli.add_command(curate_command, "curate")
cli.add_command(trace_command, "trace")
_register_service(cli)  # serve, keys, audit, mcp


def _json_flag(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if value:
        ctx.find_object(_Ctx).as_json = True  # type: ignore[union-attr]


def _json_everywhere(group: click.Group) -> None:
    """``--json`` after any command's name too (``forge stats --json``), not only before it.

    A command with a ``--json`` of its own (evolve, report, swarm, team run) keeps it, and
    takes ``forge --json CMD`` as the same request."""
    for cmd in group.commands.values():
        if isinstance(cmd, click.Group):
            _json_everywhere(cmd)
            continue
        if any(p.name == "as_json" for p in cmd.params):
            cmd.callback = _or_global_json(cmd.callback)
        elif not any("--json" in getattr(p, "opts", ()) for p in cmd.params):
            cmd.params.append(click.Option(["--json"], is_flag=True, expose_value=False, callback=_json_flag,
                                           help="Machine-readable output (the same as forge --json)."))


def _or_global_json(callback: Any) -> Any:
    import functools

    @functools.wraps(callback)
    def call(*args: Any, **kwargs: Any) -> Any:
        obj = click.get_current_context().find_object(_Ctx)
        kwargs["as_json"] = kwargs.get("as_json") or bool(obj and obj.as_json)
        return callback(*args, **kwargs)

    return call


_json_everywhere(cli)


def _one_line(text: str) -> str:
    """An error message as one printable line (no newlines, no unencodable characters)."""
    line = " ".join(str(text).split())
    return line.encode("utf-8", "backslashreplace").decode("utf-8")


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else list(argv)
    for i, arg in enumerate(args, 1):
        try:
            arg.encode("utf-8")
        except UnicodeEncodeError:
            shown = arg.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            click.echo(f"error: argument {i} is not valid UTF-8: {shown[:80]}", err=True)
            sys.exit(2)
    try:
        cli.main(args=args, standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except ForgeError as exc:
        click.echo(f"error: {_one_line(str(exc))}", err=True)
        sys.exit(2 if isinstance(exc, UserError) else 1)
    except KeyboardInterrupt:
        click.echo("interrupted", err=True)
        sys.exit(130)
    except BrokenPipeError:  # e.g. 'forge export - | head': the reader left, nothing to say
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(141)
    except (SystemExit, GeneratorExit):
        raise
    except Exception as exc:  # a bug, or a failure nobody mapped: one line, never a traceback
        what = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        click.echo(f"error: internal error ({_one_line(what)[:300]}); please report it", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
