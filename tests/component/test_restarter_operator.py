"""The restarter from an operator's side: --config.check-targets, deprecation warnings, reload."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from aiohttp import web
from aiohttp.test_utils import TestServer

from stallwatch.simulator.testing import running_simulator
from tests.component.restarter_support import write_config


def run_restarter_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stallwatch", "restarter", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


async def test_check_targets_names_a_target_whose_url_is_no_metrics_endpoint(
    tmp_path: Path,
) -> None:
    """--config.check-targets reads each target once: a page without engine metrics is exit 1."""

    async def hello(_: web.Request) -> web.Response:
        return web.Response(text="hello\n")

    app = web.Application()
    app.router.add_get("/health/metrics", hello)
    not_metrics = TestServer(app, host="127.0.0.1")
    await not_metrics.start_server()
    try:
        async with running_simulator() as sim:
            action = {"kind": "command", "argv": ["true"]}
            write_config(
                tmp_path,
                [
                    {"name": "good", "url": sim.url, "action": action},
                    {
                        "name": "wrong",
                        "url": str(not_metrics.make_url("/health")),
                        "action": action,
                    },
                    {"name": "gone", "url": "http://127.0.0.1:9", "action": action},
                ],
            )
            config = str(tmp_path / "restarter.yml")
            completed = await asyncio.to_thread(
                run_restarter_cli, "--config", config, "--config.check-targets"
            )
    finally:
        await not_metrics.close()
    assert completed.returncode == 1, completed.stdout + completed.stderr
    lines = completed.stdout.splitlines()
    assert "  good: ok, 1 engine(s), " in "\n".join(lines)
    (wrong,) = [line for line in lines if line.startswith("  wrong:")]
    assert "PROBLEM" in wrong
    assert "no engine metrics" in wrong
    (gone,) = [line for line in lines if line.startswith("  gone:")]
    assert "PROBLEM: http://127.0.0.1:9/metrics" in gone


async def test_check_targets_passes_when_every_target_reads(tmp_path: Path) -> None:
    """Every target a model server's /metrics: exit 0."""
    async with running_simulator() as sim:
        write_config(
            tmp_path,
            [{"name": "good", "url": sim.url, "action": {"kind": "command", "argv": ["true"]}}],
        )
        completed = await asyncio.to_thread(
            run_restarter_cli, "--config", str(tmp_path / "restarter.yml"), "--config.check-targets"
        )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert "good: ok" in completed.stdout


def test_config_check_prints_the_deprecation_of_metrics_url(tmp_path: Path) -> None:
    """--config.check of a config with metrics_url is valid and says what to write instead."""
    write_config(
        tmp_path,
        [
            {
                "name": "gpu1",
                "metrics_url": "http://127.0.0.1:8000/metrics",
                "action": {"kind": "command", "argv": ["true"]},
            }
        ],
    )
    completed = run_restarter_cli("--config", str(tmp_path / "restarter.yml"), "--config.check")
    assert completed.returncode == 0, completed.stderr
    assert "targets[0].metrics_url: deprecated" in completed.stderr
    assert "write url: http://127.0.0.1:8000 instead" in completed.stderr


def test_config_check_refuses_a_program_that_does_not_exist(tmp_path: Path) -> None:
    """--config.check fails (exit 1) on an argv[0] that is not there, naming the field."""
    (tmp_path / "token").write_text("t\n")
    (tmp_path / "token").chmod(0o600)
    (tmp_path / "restarter.yml").write_text(
        "token_file: token\njournal: j.sqlite\ntargets:\n"
        "  - {name: gpu1, url: 'http://127.0.0.1:8000',"
        " action: {kind: command, argv: [/opt/nowhere/restart-vllm]}}\n"
    )
    completed = run_restarter_cli("--config", str(tmp_path / "restarter.yml"), "--config.check")
    assert completed.returncode == 1
    assert "targets[0].action.argv: program not found: /opt/nowhere/restart-vllm" in (
        completed.stderr
    )
