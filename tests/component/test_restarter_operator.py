"""The restarter from an operator's side: --config.check-targets, deprecation warnings, reload."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer

from stallwatch.localstack.processes import free_port
from stallwatch.simulator.testing import running_simulator
from tests.support.restarter import AUTH, write_config


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


def write_reload_config(tmp_path: Path, port: int, names: list[str]) -> None:
    write_config(
        tmp_path,
        [
            {
                "name": name,
                "url": "http://127.0.0.1:9",
                "action": {"kind": "command", "argv": ["true"]},
            }
            for name in names
        ],
        listen=f"127.0.0.1:{port}",
    )


@contextlib.contextmanager
def restarter_process(tmp_path: Path, port: int) -> Iterator[subprocess.Popen[str]]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "stallwatch",
            "restarter",
            "--config",
            str(tmp_path / "restarter.yml"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        assert process.stderr is not None
        process.stderr.close()


async def metrics_text(session: aiohttp.ClientSession, base: str) -> str:
    async with session.get(base + "/metrics") as response:
        return await response.text()


async def wait_for_metrics(session: aiohttp.ClientSession, base: str, wanted: str) -> str:
    """The metrics page once it holds `wanted` (the restarter may still be starting)."""
    text = ""
    for _ in range(200):
        with contextlib.suppress(aiohttp.ClientError):
            text = await metrics_text(session, base)
            if wanted in text:
                return text
        await asyncio.sleep(0.05)
    raise AssertionError(f"{wanted!r} never appeared in:\n{text}")


async def test_sighup_reloads_and_a_bad_file_keeps_the_running_config(tmp_path: Path) -> None:
    """SIGHUP swaps in a valid file, keeps running on a bad one, and the gauges say which."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    write_reload_config(tmp_path, port, ["gpu1"])
    with restarter_process(tmp_path, port) as process:
        async with aiohttp.ClientSession() as session:
            await wait_for_metrics(
                session, base, "stallwatch_restarter_config_last_reload_successful 1.0"
            )
            write_reload_config(tmp_path, port, ["gpu1", "gpu2"])
            process.send_signal(signal.SIGHUP)
            await wait_for_metrics(session, base, 'target="gpu2"')

            (tmp_path / "restarter.yml").write_text("targets: [\n")
            process.send_signal(signal.SIGHUP)
            text = await wait_for_metrics(
                session, base, "stallwatch_restarter_config_last_reload_successful 0.0"
            )
            assert process.poll() is None
            assert 'target="gpu2"' in text
            async with session.get(base + "/-/healthy") as response:
                assert response.status == 200


async def test_reload_of_a_control_character_or_an_empty_file_is_a_clean_refusal(
    tmp_path: Path,
) -> None:
    """POST /-/reload of a file with a control character, or of an empty file, answers 400 with
    one line naming the file and why (it was a 500), keeps the running config, and sets the
    reload-success gauge to 0 (it stayed 1)."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    write_reload_config(tmp_path, port, ["gpu1"])
    config = tmp_path / "restarter.yml"
    good = config.read_text()
    with restarter_process(tmp_path, port):
        async with aiohttp.ClientSession() as session:
            await wait_for_metrics(
                session, base, "stallwatch_restarter_config_last_reload_successful 1.0"
            )
            for text, reason in (
                (good + "# \x07\n", "not valid YAML: line "),
                ("", "the file is empty"),
            ):
                config.write_text(text)
                async with session.post(base + "/-/reload", headers=AUTH) as response:
                    assert response.status == 400, text
                    error = (await response.json())["error"]
                assert reason in error
                assert str(config) in error
                assert "\n" not in error
                text_now = await metrics_text(session, base)
                assert "stallwatch_restarter_config_last_reload_successful 0.0" in text_now
                assert 'target="gpu1"' in text_now
                config.write_text(good)
                async with session.post(base + "/-/reload", headers=AUTH) as response:
                    assert response.status == 200


async def test_post_reload_needs_the_token_and_answers_400_for_a_bad_file(
    tmp_path: Path,
) -> None:
    """POST /-/reload: 401 without the token, 400 naming the error, 200 once the file is good."""
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    write_reload_config(tmp_path, port, ["gpu1"])
    with restarter_process(tmp_path, port):
        async with aiohttp.ClientSession() as session:
            await wait_for_metrics(session, base, "stallwatch_restarter_config_last_reload")
            async with session.post(base + "/-/reload") as response:
                assert response.status == 401
            config = tmp_path / "restarter.yml"
            good = config.read_text()
            config.write_text(
                good.replace("url: http://127.0.0.1:9", "url: http://127.0.0.1:9/metrics")
            )
            async with session.post(base + "/-/reload", headers=AUTH) as response:
                assert response.status == 400
                body = await response.json()
            assert "points into /metrics" in body["error"]
            assert "the running config is kept" in body["error"]
            config.write_text(good)
            async with session.post(base + "/-/reload", headers=AUTH) as response:
                assert response.status == 200
            text = await metrics_text(session, base)
            assert "stallwatch_restarter_config_last_reload_successful 1.0" in text
