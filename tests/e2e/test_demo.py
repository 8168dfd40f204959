"""`stallwatch demo --short` end to end: the whole pipeline, real Prometheus and Alertmanager."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO_TIMEOUT_SECONDS = 240


def running_with_argv(pid: int, argv: list[str]) -> bool:
    """Whether `pid` is a live process running `argv` (a reused PID runs something else)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return raw.rstrip(b"\0").split(b"\0") == [arg.encode() for arg in argv]


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, str, dict[str, Any]]:
    """Run `stallwatch demo --short` once; its exit code, output and JSON summary."""
    summary_file = tmp_path_factory.mktemp("demo") / "summary.json"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stallwatch",
            "demo",
            "--short",
            "--color=never",
            "--json-summary",
            str(summary_file),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=DEMO_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        # SIGTERM lets the demo stop what it started; SIGKILL if it does not.
        os.killpg(process.pid, signal.SIGTERM)
        try:
            output, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, _ = process.communicate()
        pytest.fail(f"the demo did not end within {DEMO_TIMEOUT_SECONDS} s:\n{output}")
    if not summary_file.exists():
        pytest.fail(f"no JSON summary (exit code {process.returncode}):\n{output}")
    return process.returncode, output, json.loads(summary_file.read_text())


@pytest.mark.long_wait
def test_demo_story(demo_run: tuple[int, str, dict[str, Any]]) -> None:
    """The demo sends no test request to a busy server, restarts only the hung one, once."""
    code, output, summary = demo_run
    assert code == 0, output
    assert summary["ok"] is True, summary["problems"]
    targets = summary["targets"]
    hung = summary["hung_target"]
    for name, tally in targets.items():
        assert tally["requests_sent_while_busy"] == 0, name
        assert tally["sim_test_requests_while_busy"] == 0, name
        assert tally["false_restarts"] == 0, name
    assert targets["gpu-a"]["busy_seconds"] > 0
    assert targets["gpu-a"]["restarts"] == 0
    # Act 2: gpu-a's silence told people, waited out the window and ended by itself.
    assert targets["gpu-a"]["stuck_alerts"] >= 1
    assert targets["gpu-a"]["skips"].get("restart_window", 0) >= 1
    assert targets["gpu-a"]["skips"].get("recovered_in_window", 0) >= 1
    assert targets[hung]["stalls_detected"] >= 1
    assert targets[hung]["stuck_alerts"] >= 1
    assert targets[hung]["restarts"] == 1
    assert targets[hung]["stall_to_restart_seconds"] is not None
    assert targets[hung]["stall_to_resolved_seconds"] is not None
    assert summary["batch_job"]["failed"] == {}
    restarts = [entry for entry in summary["journal"] if entry["decision"] == "restart"]
    assert [(entry["target"], entry["alertname"]) for entry in restarts] == [
        (hung, "LLMServerStuck")
    ]
    results = [
        entry["result"] for entry in summary["journal"] if entry["decision"] == "action_result"
    ]
    assert results == ["success"]


def test_demo_users_through_haproxy_move_off_the_hung_server(
    demo_run: tuple[int, str, dict[str, Any]],
) -> None:
    """Users through HAProxy: the hung server leaves its rotation after the hang, gets none of
    their requests while out, and gets them again once it is back."""
    _code, output, summary = demo_run
    rotation = summary["haproxy_rotation"]
    assert rotation["target"] == summary["hung_target"]
    assert rotation["hang_to_out_of_rotation_seconds"] is not None, output
    assert rotation["hang_to_back_in_rotation_seconds"] is not None, output
    assert rotation["requests_before_hang"] > 0
    assert rotation["requests_while_out_of_rotation"] == 0
    assert rotation["requests_after_back_in_rotation"] > 0
    assert summary["haproxy_users"]["completed"] > 0
    assert "users through HAProxy:" in output


def test_demo_leaves_nothing_running(demo_run: tuple[int, str, dict[str, Any]]) -> None:
    """Every process the demo started (both gpu-b processes included) is gone after it ends."""
    _code, output, summary = demo_run
    processes = summary["processes"]
    names = sorted(entry["name"] for entry in processes)
    assert names == sorted(
        [
            "alertmanager",
            "exporter",
            "haproxy",
            "prometheus",
            "proxy",
            "restarter",
            "sim-gpu-a",
            "sim-gpu-b",
            "sim-gpu-b",
        ]
    ), output
    alive = [entry for entry in processes if running_with_argv(entry["pid"], entry["argv"])]
    assert alive == []
