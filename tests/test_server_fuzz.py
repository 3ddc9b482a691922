"""Property-based fuzzing of every REST endpoint from the OpenAPI schema (schemathesis).

Bounded: a fixed number of examples per operation, no deadline. Every response must be
documented (status code, content type, body schema, Allow header), invalid input must be
refused, and no response may be a 5xx, for an agent key and for an admin key.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
schemathesis = pytest.importorskip("schemathesis")

from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from forge.llm.testing import ScriptedLLM  # noqa: E402
from server_support import make_setup  # noqa: E402

schemathesis.serializer.alias("application/x-ndjson", "text/plain")  # /v1/import takes JSON lines as text

_TMP = Path(tempfile.mkdtemp(prefix="forge-fuzz-"))
# Bodies up to 64 MiB: schema-valid extremes (10,000 episode steps) pass the default 8 MiB cap,
# whose 413 test_server_hardening checks; here every schema-valid body reaches its route.
_SETUP = make_setup(_TMP, mcp=False, capsule_secret="fuzz", max_body=64 * 2**20, llm=ScriptedLLM())  # no real model
_SETUP.memory.add([__import__("forge").Unit("When the ice is thin, step back.", kind="rule", id="seed-unit")])

schema = schemathesis.openapi.from_asgi("/openapi.json", _SETUP.app).exclude(path_regex=r"/v1/events/stream$")


@pytest.fixture(scope="module", autouse=True)
def _cleanup():
    yield
    _SETUP.memory.close()
    shutil.rmtree(_TMP, ignore_errors=True)


@pytest.fixture(params=["agent", "admin"])
def auth(request: pytest.FixtureRequest) -> dict[str, str]:
    return _SETUP.h(_SETUP.alice if request.param == "agent" else _SETUP.admin)


@pytest.mark.slow
@schema.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)
def test_every_endpoint_conforms(case, auth) -> None:
    # Schema-valid input may still break the data model (a private unit without an owner,
    # since >= until, a unit related to itself): that is a documented 422, not a failure.
    case.call_and_validate(headers=auth, excluded_checks=[positive_data_acceptance])
