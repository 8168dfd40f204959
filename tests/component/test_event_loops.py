"""`stallwatch exporter` on uvloop and on asyncio's own loop: the same reads, the same answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest

from tests.support.bounded import terminate
from tests.support.exporter import big_metrics_server
from tests.support.probe import probe, value

REPO = Path(__file__).resolve().parents[2]
PAYLOAD = sorted((REPO / "tests" / "testdata" / "real-metrics").glob("vllm-*.txt"))[0]
INTERVAL_SECONDS = 1.0

pytestmark = pytest.mark.timeout(120)


@dataclass
class Running:
    url: str
    log: str = ""  # its standard error, once stopped


@contextlib.contextmanager
def exporter(config: Path, *arguments: str) -> Iterator[Running]:
    """`stallwatch exporter` on a free port; yields its URL, and its log once stopped."""
    process = subprocess.Popen(
        [sys.executable, "-m", "stallwatch", "exporter", "--config", str(config), *arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        cwd=REPO,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    try:
        line = process.stdout.readline()
        assert line.startswith("listening on "), line
        running = Running(line.split()[-1])
        yield running
    finally:
        terminate(process)
        running.log = process.stderr.read()
        process.stdout.close()
        process.stderr.close()


def write_config(path: Path) -> Path:
    interval = f"{INTERVAL_SECONDS:g}s"
    module = {"allow": ["127.0.0.1"], "interval": interval, "timeout": interval}
    path.write_text(json.dumps({"listen": "127.0.0.1:0", "modules": {"vllm": module}}))
    return path


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
async def test_either_event_loop_reads_a_real_payload_and_answers_it(
    loop: str, tmp_path: Path
) -> None:
    """On each loop the exporter names it in its log, reads a real vLLM payload twice over
    the plain read (one connection each), and answers the target up with both polls."""
    config = write_config(tmp_path / "exporter.yml")
    seen: list[dict[str, str]] = []
    async with big_metrics_server(PAYLOAD.read_bytes(), seen) as server:
        with exporter(config, f"--event-loop={loop}", "--log.level=info") as running:
            async with aiohttp.ClientSession() as session:
                status, _ = await probe(session, running.url, server, module="vllm")
                assert status == 200
                await asyncio.sleep(INTERVAL_SECONDS * 1.2)
                status, body = await probe(session, running.url, server, module="vllm")
                assert status == 200, body
    assert f"event loop: {loop} " in running.log, running.log
    assert value(body, "stallwatch_target_up", target=server) == 1.0, body
    assert value(body, "stallwatch_polls_total", target=server) == 2.0, body
    assert len(seen) == 2
    assert all(headers.get("connection") == "close" for headers in seen), seen


def test_uvloop_asked_for_where_it_is_missing_stops_the_start_saying_why(tmp_path: Path) -> None:
    """`--event-loop=uvloop` without uvloop importable exits 1 naming the fix; nothing listens."""
    config = write_config(tmp_path / "exporter.yml")
    hide = tmp_path / "no-uvloop"
    hide.mkdir()
    (hide / "uvloop.py").write_text("raise ImportError('uvloop hidden by the test')\n")
    completed = subprocess.run(
        [sys.executable, "-m", "stallwatch", "exporter", "--config", str(config),
         "--event-loop=uvloop"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PYTHONPATH": f"{hide}:{REPO}", "PATH": "/usr/bin:/bin"},
        timeout=60,
        check=False,
    )  # fmt: skip
    assert completed.returncode == 1, completed
    assert "uvloop is not installed (pip install uvloop)" in completed.stderr
    assert "listening on" not in completed.stdout
