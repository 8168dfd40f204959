"""`stallwatch sim` runs as a real process: prints its URL, serves, and dies on a crash fault."""

from __future__ import annotations

import subprocess
import sys
import urllib.error
import urllib.request

import pytest

from stallwatch.common.cli import EXIT_USAGE
from stallwatch.simulator.testing import simulator_process


def test_process_prints_url_serves_and_exits_on_crash() -> None:
    """The first stdout line is the URL; a crash fault makes the process exit and close the port."""
    with simulator_process(["--model", "m1", "--data-parallel-size", "2"]) as proc:
        with urllib.request.urlopen(proc.url + "/v1/models", timeout=5) as response:
            assert b'"m1"' in response.read()
        with urllib.request.urlopen(proc.url + "/metrics", timeout=5) as response:
            assert b'engine="1"' in response.read()
        request = urllib.request.Request(
            proc.url + "/sim/fault",
            data=b'{"fault": "crash"}',
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            assert response.status == 200
        assert proc.process.wait(timeout=10) == 1
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(proc.url + "/health", timeout=2)


def test_help_explains_every_flag() -> None:
    """`stallwatch sim --help` documents each flag the simulator accepts."""
    result = subprocess.run(
        [sys.executable, "-m", "stallwatch.simulator", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    for flag in (
        "--host",
        "--port",
        "--model",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--tokens-per-second",
        "--prefill-tokens-per-second",
        "--api-server-count",
        "--data-parallel-size",
        "--no-metrics",
        "--seed",
    ):
        assert flag in result.stdout


def test_invalid_flag_value_is_a_clear_error() -> None:
    """A zero --max-num-seqs is refused with a message naming the flag, exit code 64 (usage)."""
    result = subprocess.run(
        [sys.executable, "-m", "stallwatch.simulator", "--port", "0", "--max-num-seqs", "0"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert result.returncode == EXIT_USAGE
    assert "--max-num-seqs must be >= 1" in result.stderr
