"""What every adapter's learning door shares (forge.integrations._learn): a run recorded step by
step becomes a trace the learning entry takes, whatever a framework hands over (huge tool
output, arguments that are not JSON, a run longer than a trace holds), and report refuses
what it cannot send, with one line."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from forge.engine.embed import HashingEmbedder
from forge.engine.memory import Memory
from forge.errors import ConfigError, ValidationError
from forge.integrations._learn import TraceRecorder, areport, report
from forge.learn.trace import MAX_TRACE_STEPS, Trace
from forge.store import SQLiteStore


def test_a_recorded_run_is_a_valid_trace() -> None:
    rec = TraceRecorder(kind="ops")
    rec.message("user", "The disk is full.")
    rec.message("assistant", "   ")  # nothing said: no step
    rec.tool("cleanup", '{"path": "/var/log"}')
    rec.observation("PermissionDenied", tool="cleanup", error="PermissionDenied: needs root")
    rec.tool("rotate", "logs now")  # not JSON: kept as its text
    rec.tool("stats", {"ratio": math.nan})  # not JSON either
    rec.tool("dump", {"blob": "x" * 10_000})  # too long to keep as arguments
    rec.observation("y" * 200_000, tool="dump")  # a web page of output
    rec.recalled("r1")
    rec.recalled("r1")
    rec.finish("Rotated the logs.")
    trace = rec.trace()
    assert trace["task"] == "The disk is full." and trace["recall_ids"] == ["r1"]
    tools = [s for s in trace["steps"] if s["type"] == "tool"]
    assert tools[0]["args"] == {"path": "/var/log"} and tools[0]["error"] == "PermissionDenied: needs root"  # the call failed
    assert tools[1]["args"] == {"input": "logs now"} and "nan" in tools[2]["args"]["input"]
    assert set(tools[3]["args"]) == {"input"} and len(tools[3]["args"]["input"]) <= 4000
    assert max(len(s.get("content", "")) for s in trace["steps"]) <= 4000
    assert trace["steps"][-1] == {"type": "answer", "content": "Rotated the logs."}
    Trace.from_dict(trace)  # the server's own check passes


def test_a_run_longer_than_a_trace_keeps_its_start_and_end() -> None:
    rec = TraceRecorder(task="many steps")
    for i in range(MAX_TRACE_STEPS + 50):
        rec.tool(f"step{i}")
    steps = Trace.from_dict(rec.trace()).steps
    assert len(steps) == MAX_TRACE_STEPS
    assert steps[0].tool == "step0" and steps[-1].tool == f"step{MAX_TRACE_STEPS + 49}"
    assert any("steps left out" in s.content for s in steps)


def test_report_says_what_it_cannot_do(tmp_path: Path) -> None:
    mem = Memory(SQLiteStore(tmp_path / "m.db"), HashingEmbedder(64))
    rec = TraceRecorder(task="Refund a late order", kind="refund")
    rec.tool("refund_api", {"order": "A-1"}, error="rate_limited")
    with pytest.raises(ValidationError, match="agent="):
        report(mem, rec.trace(), success=False)
    with pytest.raises(ValidationError, match="score"):
        report(mem, rec.trace(), score=2.0, agent="bot")
    got = asyncio.run(areport(mem, rec.trace(), success=False, agent="bot"))  # a blocking memory, off the loop
    assert [u["kind"] for u in got["learned"]] == ["rule"] and "rate_limited" in got["learned"][0]["content"]
    mem.close()


def test_report_over_an_async_client_must_be_awaited() -> None:
    pytest.importorskip("httpx")
    from forge.client import AsyncClient

    client = AsyncClient("http://127.0.0.1:9")
    with pytest.raises(ConfigError, match="areport"):
        report(client, TraceRecorder(task="t").trace())
    asyncio.run(client.aclose())
