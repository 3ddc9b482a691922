"""The one way FORGE reaches PostgreSQL (forge.store.pg): DSNs shown without their password,
a failed connection as one line of the caller's error type."""

from __future__ import annotations

import sys

import pytest

from forge.envs.postgres import PostgresDiagnosisEnv, PostgresEnvError
from forge.errors import ConfigError, StoreError
from forge.store.pg import connect, redact_dsn


@pytest.mark.parametrize(
    ("dsn", "shown"),
    [
        ("postgresql://forge:hunter2@db:5432/memory", "postgresql://forge:***@db:5432/memory"),
        ("postgresql://forge:hun%40ter2@[::1]/memory?sslmode=require", "postgresql://forge:***@[::1]/memory?sslmode=require"),
        ("postgresql://forge@db/memory?password=hunter2&schema=x", "postgresql://forge@db/memory?password=***&schema=x"),
        ("postgresql://forge:hunter2@db:notaport/memory", "postgresql://forge:***@db:notaport/memory"),
        ("host=db password=hunter2 dbname=memory", "host=db password=*** dbname=memory"),
        ("host=db password = 'hunter 2' dbname=memory", "host=db password = *** dbname=memory"),
        ("host=db password hunter2", "host=db password ***"),  # malformed: libpq quotes it back
        ("postgresql://forge@db/memory", "postgresql://forge@db/memory"),
        ("postgresql://forge:@/memory?host=/tmp/pg", "postgresql://forge:@/memory?host=/tmp/pg"),  # no password
        ("host=db dbname=memory", "host=db dbname=memory"),
    ],
)
def test_a_dsn_is_shown_without_its_password(dsn, shown):
    assert redact_dsn(dsn) == shown


@pytest.mark.parametrize(
    "dsn",
    [
        "postgresql://forge:hunter2@127.0.0.1:1/none?connect_timeout=1",
        "host=127.0.0.1 port=1 connect_timeout=1 password hunter2",  # libpq's parse error names the word
    ],
)
def test_a_failed_connection_is_one_line_without_the_password(dsn):
    pytest.importorskip("psycopg")
    with pytest.raises(StoreError) as err:
        connect(dsn, advice="; start the server")
    message = str(err.value)
    assert message.startswith("cannot connect to PostgreSQL at ") and message.endswith("; start the server")
    assert "\n" not in message and "hunter2" not in message and "127.0.0.1" in message


def test_the_error_type_is_the_callers():
    pytest.importorskip("psycopg")
    with pytest.raises(PostgresEnvError, match="cannot connect to PostgreSQL at postgresql://x:\\*\\*\\*@127.0.0.1:1"):
        connect("postgresql://x:secret@127.0.0.1:1/none", error=PostgresEnvError, connect_timeout=1)


def test_the_store_and_the_env_give_one_install_hint_without_psycopg(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # makes "import psycopg" fail
    from forge.store import open_store

    hint = r"psycopg is not installed; install it with: pip install 'forge-memory\[postgres\]'"
    with pytest.raises(ConfigError, match=hint):
        open_store("postgresql://forge@127.0.0.1:1/none")
    with pytest.raises(ConfigError, match=hint):
        PostgresDiagnosisEnv(dsn="postgresql://forge@127.0.0.1:1/none")
