"""``forge serve``, ``forge keys``, ``forge audit`` and ``forge mcp``: the service's commands.

Registered on the main ``forge`` group by :func:`register`; each is a thin call into
:mod:`forge.server`. Output is human text, or JSON with ``forge --json``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import click

from forge.errors import ConfigError

__all__ = ["register"]


def _keys(obj: Any, path: str | None) -> Any:
    from forge.server.keys import KeyStore

    return KeyStore(path) if path else KeyStore.beside(obj.db)


def _need_server_extra(*, mcp: bool = True) -> None:
    try:
        import fastapi  # noqa: F401
        import uvicorn  # noqa: F401

        if mcp:
            import mcp as _mcp  # noqa: F401
    except ImportError as exc:
        raise ConfigError(f"this command needs the server extra ({exc.name} is missing): pip install 'forge-memory[server]'") from None


def _emit(obj: Any, data: Any, human: str) -> None:
    click.echo(json.dumps(data, indent=2, default=str) if obj.as_json else human)


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind; non-loopback needs API keys.")
@click.option("--port", type=int, default=8765, show_default=True, help="TCP port, 1-65535.")
@click.option("--keys", "keys_path", default=None, help="API key file. Default: <db>.keys.json.")
@click.option("--runs", "runs_dir", default="runs", show_default=True, help="Folder of evolution runs shown by /v1/runs and the dashboard.")
@click.option("--rate", type=float, default=50.0, show_default=True, help="Default requests/s per key (a key can set its own).")
@click.option("--capsule-keys", default=None, help="Keyring file of senders' public keys: agents may POST capsules to /v1/capsules.")
@click.option("--no-mcp", is_flag=True, help="Do not mount the MCP endpoint at /mcp.")
@click.option("--no-dashboard", is_flag=True, help="Do not serve the dashboard at /ui.")
@click.option("--curate-every", type=float, default=None, help="Run a curation pass (forge curate's defaults) every this many seconds.")
@click.option("--workers", type=int, default=1, show_default=True,
              help="Server processes sharing the port and the database: one per core serves more requests at once.")
@click.option("--max-body-mb", type=float, default=8.0, show_default=True,
              help="Largest request body accepted, in MiB (413 above it; /v1/import accepts 16 times as much).")
@click.option("--read-audit-ms", type=float, default=50.0, show_default=True,
              help="Read audit records (recall, read, list, context) are written in batches at most this old; "
                   "a crash loses at most this much of them. 0 writes each at once (a write transaction per read).")
@click.option("--llm", "llm_spec", default=None,
              help="What POST /v1/messages and MCP remember_messages extract with: local (the embedded model, loaded on "
                   "first use; the default), local:smollm2, openai:MODEL.")
@click.pass_obj
def serve_command(obj: Any, host: str, port: int, keys_path: str | None, runs_dir: str, rate: float, capsule_keys: str | None,
                  no_mcp: bool, no_dashboard: bool, curate_every: float | None, workers: int, max_body_mb: float,
                  read_audit_ms: float, llm_spec: str | None) -> None:
    """Serve the REST API (/v1, docs at /docs), MCP (/mcp) and the dashboard (/ui) over one memory."""
    import math

    if not 1 <= port <= 65535:
        raise ConfigError(f"--port {port}: a TCP port is between 1 and 65535")
    if not (math.isfinite(max_body_mb) and 0.001 <= max_body_mb <= 4096):
        raise ConfigError("--max-body-mb must be between 0.001 and 4096")
    if curate_every is not None and not (math.isfinite(curate_every) and curate_every > 0):
        raise ConfigError("--curate-every must be a positive number of seconds")
    _need_server_extra(mcp=not no_mcp)  # --no-mcp serves without the MCP SDK installed
    if workers < 1:
        raise ConfigError("--workers must be 1 or more")
    if not 0 <= read_audit_ms <= 60_000:  # (NaN fails this too)
        raise ConfigError("--read-audit-ms must be between 0 and 60000")
    if workers > 1 and str(obj.db) in (":memory:", "sqlite://"):
        raise ConfigError("--workers needs a database file or PostgreSQL: each process would have its own in-memory store")
    import uvicorn

    from forge.server.app import create_app
    from forge.server.auth import is_loopback

    keys = _keys(obj, keys_path)
    notes = []
    if not keys.active():
        if not is_loopback(host):
            notes.append(f"no API keys in {keys.path}: binding to 127.0.0.1 only, not {host} (create one with 'forge keys create')")
        host = "127.0.0.1"
        notes.append("local mode: no API keys configured; only this machine (127.0.0.1) can connect, as the operator")
    if not (math.isfinite(rate) and rate > 0):
        raise ConfigError("--rate must be a positive number of requests per second")
    keyring = None
    if capsule_keys:
        from forge.share.capsule import Keyring

        keyring = Keyring.load(capsule_keys)
    max_body = int(max_body_mb * 2**20)
    _port_free(host, port)  # before any banner: a busy port is one line, never "serving ... on" and then a failure
    for note in notes:
        click.echo(note, err=True)
    mem = obj.memory()
    mem.llm = llm_spec  # opened on the first conversation, not before
    served = f"FORGE serving {obj.db} on http://{host}:{port}  (API /v1, docs /docs{'' if no_mcp else ', MCP /mcp'}{'' if no_dashboard else ', dashboard /ui'})"
    run = {"host": host, "port": port, "log_level": "warning", "timeout_graceful_shutdown": 10, "access_log": False}
    if workers > 1:
        # Each process opens the memory itself (uvicorn starts them and calls worker_app);
        # opening it here first makes a bad database or embedder one clear error, not N.
        embedder = mem.embedder.name
        mem.close()
        os.environ[_WORKER_ENV] = json.dumps({
            "db": str(obj.db), "embedder": embedder, "keys": str(keys.path), "rate": rate, "runs": runs_dir,
            "capsule_keys": capsule_keys, "host": host, "mcp": not no_mcp, "dashboard": not no_dashboard,
            "curate_every": curate_every, "workers": workers, "read_audit_s": read_audit_ms / 1000, "max_body": max_body,
            "llm": llm_spec,
        })
        click.echo(f"{served}, {workers} worker processes", err=True)
        uvicorn.run("forge.server.cli:worker_app", factory=True, workers=workers, **run)
        return
    app = create_app(mem, keys=keys, rate=rate, runs_dir=runs_dir, capsule_secret=os.environ.get("FORGE_CAPSULE_SECRET"), capsule_keyring=keyring,
                     host=host, mcp=not no_mcp, dashboard=not no_dashboard, close_memory=True, curate_every=curate_every,
                     read_audit_delay_s=read_audit_ms / 1000, max_body=max_body, max_import_body=16 * max_body)
    click.echo(served, err=True)
    uvicorn.run(app, **run)


def _port_free(host: str, port: int) -> None:
    """Refuse a port another process listens on, as uvicorn would bind it (SO_REUSEADDR)."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise ConfigError(f"port {port} on {host} is busy (another server listens there); "
                                  f"stop it or pick another with --port") from None
            raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


_WORKER_ENV = "FORGE_SERVE_WORKER"  # the settings of `forge serve --workers N`, for its processes (no secrets)
_held_locks: list[Any] = []  # the curation lock stays held while this worker lives


def worker_app() -> Any:
    """The app of one ``forge serve --workers N`` process: the same memory and keys as the
    others, its share of each key's rate, and curation in exactly one of them (the first to
    take the database's curation lock)."""
    from forge.engine.memory import Memory
    from forge.server.app import create_app
    from forge.server.keys import KeyStore
    from forge.share.capsule import Keyring

    if _WORKER_ENV not in os.environ:
        raise ConfigError("worker_app is started by 'forge serve --workers N', which passes it its settings")
    cfg = json.loads(os.environ[_WORKER_ENV])
    curate_every = cfg["curate_every"] if cfg["curate_every"] and _take_curation_lock(cfg["db"]) else None
    return create_app(
        Memory.open(cfg["db"], embedder=cfg["embedder"], llm=cfg.get("llm")), keys=KeyStore(cfg["keys"]), rate=cfg["rate"], runs_dir=cfg["runs"],
        capsule_secret=os.environ.get("FORGE_CAPSULE_SECRET"),
        capsule_keyring=Keyring.load(cfg["capsule_keys"]) if cfg["capsule_keys"] else None,
        host=cfg["host"], mcp=cfg["mcp"], dashboard=cfg["dashboard"], close_memory=True, curate_every=curate_every,
        workers=cfg["workers"], read_audit_delay_s=cfg.get("read_audit_s", 0.05),
        max_body=cfg.get("max_body", 8 * 2**20), max_import_body=16 * cfg.get("max_body", 8 * 2**20),
    )


def _take_curation_lock(db: str) -> bool:
    """True in the one worker process that gets the database's curation lock."""
    import hashlib
    import tempfile

    path = f"{db}.curate.lock" if "://" not in db else os.path.join(
        tempfile.gettempdir(), f"forge-curate-{hashlib.sha256(db.encode()).hexdigest()[:16]}.lock")
    try:
        import fcntl
    except ImportError:  # no flock (Windows): every worker curates; passes are transactions, so only wasteful
        return True
    handle = open(path, "a")  # noqa: SIM115 - held open (and locked) for the life of the process
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        handle.close()
        return False
    _held_locks.append(handle)
    return True


@click.group("keys")
def keys_group() -> None:
    """Manage API keys (only their hashes are stored)."""


@keys_group.command("create")
@click.option("--agent", default="", help="The agent id this key acts as.")
@click.option("--group", "groups", multiple=True, help="A group the agent belongs to (repeatable).")
@click.option("--admin", is_flag=True, help="An operator key: sees and manages everything.")
@click.option("--rate", type=float, default=None, help="Requests/s for this key (default: the server's).")
@click.option("--note", default="")
@click.option("--keys", "keys_path", default=None, help="API key file. Default: <db>.keys.json.")
@click.pass_obj
def keys_create(obj: Any, agent: str, groups: tuple[str, ...], admin: bool, rate: float | None, note: str, keys_path: str | None) -> None:
    """Create a key and print it once."""
    store = _keys(obj, keys_path)
    token = store.create(agent=agent, groups=groups, admin=admin, rate=rate, note=note)
    rec = store.list()[-1]
    _emit(obj, {"key": token, **rec.public()}, f"{token}\n(key id {rec.id} for {'admin' if admin else 'agent ' + rec.agent}; shown once, store it now)")


@keys_group.command("list")
@click.option("--keys", "keys_path", default=None)
@click.pass_obj
def keys_list(obj: Any, keys_path: str | None) -> None:
    """List keys (ids, agents, groups; never the keys)."""
    recs = _keys(obj, keys_path).list()
    lines = [f"{r.id}  {'admin' if r.admin else r.agent:<16} groups={','.join(r.groups) or '-'}  rate={r.rate or 'default'}"
             f"  {'REVOKED' if r.revoked_at else 'active'}  {r.note}" for r in recs]
    _emit(obj, [r.public() for r in recs], "\n".join(lines) or "(no keys: the server runs in local mode)")


@keys_group.command("revoke")
@click.argument("key_id")
@click.option("--keys", "keys_path", default=None)
@click.pass_obj
def keys_revoke(obj: Any, key_id: str, keys_path: str | None) -> None:
    """Revoke a key by id; a running server refuses it from its next request."""
    rec = _keys(obj, keys_path).revoke(key_id)
    _emit(obj, rec.public(), f"revoked {rec.id} ({rec.agent})")


@click.command("audit")
@click.option("--agent", default=None, help="Only entries by this agent.")
@click.option("--op", "ops", multiple=True, help="Only these ops (add, update, status, relate, read, list, recall, context, export...).")
@click.option("--unit", "unit_id", default=None, help="Only entries about this unit.")
@click.option("--since-seq", type=int, default=0, show_default=True)
@click.option("--before", type=float, default=None, help="Only entries before this Unix time.")
@click.option("--limit", type=int, default=100, show_default=True)
@click.option("--seen-by", default=None, help="Which units this agent was shown (recall, context, read) before --before.")
@click.pass_obj
def audit_command(obj: Any, agent: str | None, ops: tuple[str, ...], unit_id: str | None, since_seq: int, before: float | None, limit: int, seen_by: str | None) -> None:
    """Query the audit log: who did what to which unit, when, and why it was recalled."""
    import math

    if before is not None and not (math.isfinite(before) and before >= 0):
        raise ConfigError("--before must be a Unix time in seconds (a finite number, 0 or more)")
    if limit < 1 or since_seq < 0:
        raise ConfigError("--limit must be 1 or more and --since-seq 0 or more")
    from forge.server.keys import Principal
    from forge.server.service import Service, event_dict

    op = Principal.local()
    with obj.memory(must_exist=True) as mem, Service(mem) as service:
        if seen_by:
            seen = service.seen(op, seen_by, before=before)
            lines = [f"{s['id']}  {s['times']}x  {'; '.join(s['reasons'])}" for s in seen]
            _emit(obj, seen, "\n".join(lines) or f"({seen_by} was shown nothing)")
            return
        evs = [event_dict(e) for e in service.events(op, since_seq=since_seq, unit_id=unit_id, actor=agent, ops=ops, until=before, limit=limit)]
    lines = [f"#{e['seq']} {e['ts']:.3f} {e['actor'] or '-':<14} {e['op']:<8} {e['unit_id'] or '':<22} {json.dumps(e['data'])[:120]}" for e in evs]
    _emit(obj, evs, "\n".join(lines) or "(no entries)")


@click.command("mcp")
@click.option("--keys", "keys_path", default=None)
@click.option("--runs", "runs_dir", default="runs", show_default=True)
@click.pass_obj
def mcp_command(obj: Any, keys_path: str | None, runs_dir: str) -> None:
    """Serve MCP over stdio (for desktop and coding agents). The caller is FORGE_API_KEY's agent."""
    _need_server_extra()
    import anyio

    from forge.errors import AccessError
    from forge.server.keys import Principal
    from forge.server.mcp import build_mcp
    from forge.server.service import Service

    keys = _keys(obj, keys_path)
    token = os.environ.get("FORGE_API_KEY")
    if token:
        found = keys.authenticate(token)
        if found is None:
            raise AccessError("FORGE_API_KEY is unknown or revoked")
        principal = found[0]
    elif keys.active():
        raise AccessError("this store has API keys: set FORGE_API_KEY to the key this MCP server acts as")
    else:
        principal = Principal.local()
    from forge.server.learning import Learning, peers_from

    with obj.memory() as mem, Service(mem, runs_dir=runs_dir) as service:
        learning = Learning(service, peers=peers_from(keys))
        server = build_mcp(service, lambda ctx: principal, learning)
        print(f"forge mcp: stdio, acting as {principal.agent}", file=sys.stderr)
        learning.start()
        try:
            anyio.run(server.run_stdio_async)
        finally:
            learning.stop()


def register(cli: click.Group) -> None:
    for command in (serve_command, keys_group, audit_command, mcp_command):
        cli.add_command(command)
