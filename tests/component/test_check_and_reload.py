"""`stallwatch check` verdicts and exit codes, and the exporter's config reload."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from stallwatch import USER_AGENT
from stallwatch.common.cli import EXIT_USAGE
from stallwatch.common.config_files import load_exporter_config
from stallwatch.core.classify import State
from stallwatch.exporter.app import reload_config, running_exporter
from stallwatch.exporter.check_cli import EXIT_DOWN, EXIT_OK, EXIT_STUCK, EXIT_UNKNOWN, run_check
from stallwatch.localstack.processes import free_port
from stallwatch.simulator.load import run_load
from stallwatch.simulator.testing import running_simulator
from tests.support.check import check_target, run_cli
from tests.support.exporter import wait_until


async def test_check_busy_server_exits_zero_without_a_test_request() -> None:
    """A busy server is healthy for `check`, which sends it no test request."""
    async with running_simulator(max_num_seqs=2, tokens_per_second=40) as sim:
        load = asyncio.create_task(
            run_load(sim.url, concurrency=2, prompt_tokens=10, max_tokens=1_900, duration=30)
        )
        await wait_until(lambda: sim.stats()["running"] == 2, what="load running")
        result = await run_check(check_target(sim.url))
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
    assert result.exit_code == EXIT_OK
    assert result.as_json()["state"] == "busy"
    assert result.as_json()["test_requests_sent"] == 0
    assert USER_AGENT not in sim.stats()["completions_by_user_agent"]


async def test_check_hung_server_is_stuck_after_two_stalled_intervals() -> None:
    """A hung engine with work exits 1 only after two stalled intervals in a row."""
    async with running_simulator(max_num_seqs=2, tokens_per_second=40) as sim:
        load = asyncio.create_task(
            run_load(sim.url, concurrency=2, prompt_tokens=10, max_tokens=1_900, duration=30)
        )
        await wait_until(lambda: sim.stats()["running"] == 2, what="load running")
        sim.apply_fault("hang")
        result = await run_check(check_target(sim.url))
        load.cancel()
        await asyncio.gather(load, return_exceptions=True)
    report = result.as_json()
    assert result.exit_code == EXIT_STUCK
    assert report["stuck"] is True
    assert report["state"] == State.STALLED
    assert report["polls"] == 3  # baseline, stalled, stalled again
    assert report["test_requests_sent"] == 0


async def test_check_idle_server_is_proven_by_one_test_request() -> None:
    """An idle server gets one test request and exits 0."""
    async with running_simulator() as sim:
        result = await run_check(check_target(sim.url))
        assert sim.stats()["completions_by_user_agent"][USER_AGENT] == 1
    assert result.exit_code == EXIT_OK
    assert result.as_json()["state"] == "idle"


async def test_check_down_server_exits_two() -> None:
    """Nothing listening is down: exit 2."""
    result = await run_check(check_target("http://127.0.0.1:9"))
    assert result.exit_code == EXIT_DOWN


async def test_check_server_without_engine_metrics_cannot_be_judged() -> None:
    """A server without vLLM metrics gets exit 3, never 'healthy'."""
    async with running_simulator(metrics_enabled=False) as sim:
        result = await run_check(check_target(sim.url))
    assert result.exit_code == EXIT_UNKNOWN
    assert result.as_json()["state"] == "no_metrics"


async def test_check_survives_a_garbled_payload() -> None:
    """A /metrics that answers garbage is a state with an exit code, not a crash."""

    async def garbage(_: web.Request) -> web.Response:
        return web.Response(body=b"\x00\xff{{{\nvllm:num_requests_running{ nonsense\n", status=200)

    async def models(_: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": []})

    app = web.Application()
    app.router.add_get("/metrics", garbage)
    app.router.add_get("/v1/models", models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        result = await run_check(check_target(f"http://127.0.0.1:{port}"))
    finally:
        await runner.cleanup()
    assert result.exit_code == EXIT_UNKNOWN
    assert result.history.poll_errors.get("parse") == 1


async def test_check_command_prints_json_and_exits_with_the_verdict() -> None:
    """The `stallwatch check --json` command prints the fields scripts rely on."""
    # Bounds far above a loopback read on a loaded machine: what is judged is the report.
    bounds = ("--interval", "2s", "--timeout", "2s", "--test-request-timeout", "2s")
    async with running_simulator() as sim:
        completed = await asyncio.to_thread(run_cli, "check", sim.url, *bounds, "--json")
    assert completed.returncode == EXIT_OK, completed.stderr
    report = json.loads(completed.stdout)
    for key in (
        "state",
        "running",
        "waiting",
        "steps_per_second",
        "tokens_per_second",
        "restart_detected",
        "test_requests_sent",
        "probe_requests_sent",
    ):
        assert key in report
    assert report["state"] == "idle"


def write_config(path: Path, sim_url: str, names: list[str], *, listen: str) -> None:
    targets = "".join(f"  - name: {name}\n    url: {sim_url}\n" for name in names)
    path.write_text(f"listen: {listen}\ninterval: 300ms\ntimeout: 300ms\ntargets:\n{targets}")


async def scrape_text(url: str) -> str:
    async with aiohttp.ClientSession() as session, session.get(url + "/metrics") as response:
        return await response.text()


async def test_sighup_reload_swaps_valid_config_and_refuses_a_bad_one(tmp_path: Path) -> None:
    """SIGHUP applies a valid new config; a bad one is refused and the old one keeps running."""
    config = tmp_path / "exporter.yml"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with running_simulator() as sim:
        write_config(config, sim.url, ["first"], listen=f"127.0.0.1:{port}")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "stallwatch", "exporter", "--config", str(config),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )  # fmt: skip
        try:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 20)
            assert line.decode().startswith("listening on ")
            text = await scrape_text(url)
            assert 'stallwatch_target_up{target="first"}' in text or "first" in text

            write_config(config, sim.url, ["first", "second"], listen=f"127.0.0.1:{port}")
            process.send_signal(signal.SIGHUP)
            for _ in range(100):
                text = await scrape_text(url)
                if 'target="second"' in text:
                    break
                await asyncio.sleep(0.05)
            assert 'target="second"' in text
            assert "stallwatch_config_last_reload_successful 1.0" in text

            config.write_text("targets: [{name: broken}]\n")
            process.send_signal(signal.SIGHUP)
            for _ in range(100):
                text = await scrape_text(url)
                if "stallwatch_config_last_reload_successful 0.0" in text:
                    break
                await asyncio.sleep(0.05)
            assert "stallwatch_config_last_reload_successful 0.0" in text
            assert 'target="second"' in text  # the running config is kept
        finally:
            process.terminate()
            _, stderr = await asyncio.wait_for(process.communicate(), 20)
    assert process.returncode == 0
    assert "reload refused" in stderr.decode()
    assert "targets[0].url" in stderr.decode()


# Bad files a reload must refuse with 400 and the reason, keeping the running config.
BAD_RELOADS: dict[str, str] = {
    "interval: never\n": "interval",
    'targets:\n  - {name: first, url: "http://[::1"}\n': "targets[0].url",
    "targets:\n  - {name: first, url: 'http://127.0.0.1:99999'}\n": "targets[0].url",
    "interval: .nan\n": "interval",
    "~: 5s\n": "key ~ is not a string",
    "1: 5s\n": "key 1 is not a string",
    "interval: 5s\ninterval: 6s\n": "duplicate key",
    "interval: 5s # \x07\n": "not valid YAML: line 1, column 16: character U+0007",
    "targets:\n  - {name: \"a\\ud800\", url: 'http://127.0.0.1:1'}\n": "not valid Unicode",
    "": "the file is empty",
    "# being written\n": "the file is empty",
}


async def test_post_reload_answers_400_for_a_bad_config(tmp_path: Path) -> None:
    """POST /-/reload answers 400 and why for each bad file (never 500), 200 for a good one."""
    config = tmp_path / "exporter.yml"
    port = free_port()
    async with running_simulator() as sim:
        write_config(config, sim.url, ["first"], listen=f"127.0.0.1:{port}")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "stallwatch", "exporter", "--config", str(config),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            await asyncio.wait_for(process.stdout.readline(), 20)
            async with aiohttp.ClientSession() as session:
                for text, reason in BAD_RELOADS.items():
                    config.write_text(text)
                    async with session.post(f"http://127.0.0.1:{port}/-/reload") as response:
                        body = await response.text()
                        assert (response.status, reason in body) == (400, True), (text, body)
                metrics = await scrape_text(f"http://127.0.0.1:{port}")
                assert "stallwatch_config_last_reload_successful 0.0" in metrics
                assert 'target="first"' in metrics  # the running config is kept
                write_config(config, sim.url, ["first"], listen=f"127.0.0.1:{port}")
                async with session.post(f"http://127.0.0.1:{port}/-/reload") as response:
                    assert response.status == 200
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), 20)


async def test_sighup_with_an_unparsable_url_marks_the_reload_failed(tmp_path: Path) -> None:
    """A SIGHUP reload of a file the URL parser chokes on sets last_reload_successful to 0."""
    config = tmp_path / "exporter.yml"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    async with running_simulator() as sim:
        write_config(config, sim.url, ["first"], listen=f"127.0.0.1:{port}")
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "stallwatch", "exporter", "--config", str(config),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            await asyncio.wait_for(process.stdout.readline(), 20)
            assert "stallwatch_config_last_reload_successful 1.0" in await scrape_text(url)
            config.write_text('targets:\n  - {name: first, url: "http://[::1"}\n')
            process.send_signal(signal.SIGHUP)
            for _ in range(100):
                text = await scrape_text(url)
                if "stallwatch_config_last_reload_successful 0.0" in text:
                    break
                await asyncio.sleep(0.05)
            assert "stallwatch_config_last_reload_successful 0.0" in text
            assert 'target="first"' in text
        finally:
            process.terminate()
            _, stderr = await asyncio.wait_for(process.communicate(), 20)
    assert "Traceback" not in stderr.decode()
    assert "targets[0].url: not a valid URL" in stderr.decode()


def test_exporter_port_in_use_is_one_clear_line_and_exit_1(tmp_path: Path) -> None:
    """A listen port already taken ends the exporter with exit 1 and one line, no traceback."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = tmp_path / "exporter.yml"
        write_config(config, "http://127.0.0.1:9", ["first"], listen=f"127.0.0.1:{port}")
        completed = run_cli("exporter", "--config", str(config))
    assert completed.returncode == 1
    assert "Traceback" not in completed.stderr
    assert f"stallwatch exporter: cannot listen on 127.0.0.1:{port}: " in completed.stderr


@pytest.mark.parametrize(
    "flags",
    [
        ["--interval", "0"],
        ["--interval", "0s"],
        ["--interval", "-5s"],
        ["--timeout", "0s"],
        ["--timeout", "-1s"],
        ["--test-request-timeout", "0s"],
        ["--interval", "1.5s"],
        ["--interval", ".nan"],
        ["--interval", "10ms"],
    ],
)
def test_check_refuses_a_duration_that_cannot_work_with_a_usage_error(flags: list[str]) -> None:
    """Zero, negative, malformed or too short durations are usage errors (64), never a hang."""
    completed = run_cli("check", "http://127.0.0.1:9", *flags)
    assert completed.returncode == EXIT_USAGE, completed.stderr
    assert flags[0] in completed.stderr


def test_check_usage_error_exit_code_is_no_verdict() -> None:
    """A usage error exits 64, which no verdict (0 to 3) uses: 2 would read as down."""
    completed = run_cli("check")
    assert completed.returncode == EXIT_USAGE
    assert EXIT_USAGE not in (EXIT_OK, EXIT_STUCK, EXIT_DOWN, EXIT_UNKNOWN)


def test_config_check_flag_validates_and_exits(tmp_path: Path) -> None:
    """--config.check exits 0 for a valid file and 1 naming the field for a bad one."""
    good = tmp_path / "good.yml"
    good.write_text("targets:\n  - {name: a, url: 'http://127.0.0.1:8000'}\n")
    completed = run_cli("exporter", "--config", str(good), "--config.check")
    assert completed.returncode == 0
    assert "valid, 1 targets" in completed.stdout
    bad = tmp_path / "bad.yml"
    bad.write_text("targets:\n  - {name: a, url: 'http://127.0.0.1:8000', kind: ollama}\n")
    completed = run_cli("exporter", "--config", str(bad), "--config.check")
    assert completed.returncode == 1
    assert f"{bad}: targets[0].kind" in completed.stderr


def test_config_check_prints_the_old_test_request_key_warning(tmp_path: Path) -> None:
    """--config.check prints the `probe:` deprecation with file and place; none for the new key."""
    old = tmp_path / "old.yml"
    old.write_text("targets:\n  - {name: a, url: 'http://127.0.0.1:8000', probe: {}}\n")
    completed = run_cli("exporter", "--config", str(old), "--config.check")
    assert completed.returncode == 0
    assert f"warning: {old}: targets[0].probe: deprecated" in completed.stderr
    new = tmp_path / "new.yml"
    new.write_text("targets:\n  - {name: a, url: 'http://127.0.0.1:8000', test_request: {}}\n")
    completed = run_cli("exporter", "--config", str(new), "--config.check")
    assert completed.returncode == 0
    assert "warning" not in completed.stderr


async def test_a_reload_applies_the_old_test_request_key_and_logs_its_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A reload of a file with `probe:` applies it and logs the deprecation with file and place."""
    path = tmp_path / "exporter.yml"
    path.write_text("targets: []\n")
    async with running_exporter(load_exporter_config(path), path, port=0) as (service, _url):
        path.write_text(
            "probe: {min_interval: 5m}\ntargets: [{name: a, url: 'http://127.0.0.1:9'}]\n"
        )
        with caplog.at_level(logging.WARNING, logger="stallwatch.exporter"):
            assert await reload_config(service, path) is None
        (target,) = service.config.targets
        assert target.test_request.min_interval_seconds == 300.0
    logged = [record.getMessage() for record in caplog.records]
    expected = f"{path}: probe: deprecated (to be removed in 0.3): write test_request: instead"
    assert any(message.startswith(expected) for message in logged), logged
