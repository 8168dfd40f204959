"""Each restart action kind against a real counterpart: a process, a Docker API, systemctl, HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from stallwatch.restarter.actions import run_argv
from stallwatch.restarter.service import Restarter
from tests.support.docker import fake_docker, short_tmp_dir
from tests.support.restarter import (
    alert,
    fake_vllm,
    marker_argv,
    marker_lines,
    payload,
    post_alerts,
    running_restarter,
    settle,
    target_entry,
    write_config,
)


def last_result(restarter: Restarter) -> dict[str, Any]:
    entry = restarter.journal.recent(1)[0]
    assert entry.decision == "action_result"
    return entry.as_json()


async def test_command_gets_the_target_name_in_the_environment_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target name reaches the command as $STALLWATCH_TARGET, never through a shell."""
    monkeypatch.chdir(tmp_path)  # where a shell would have created the files
    marker = tmp_path / "marker"
    name = "gpu1;touch pwned$(touch pwned2)"
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path,
            [target_entry(name, fake.url, {"kind": "command", "argv": marker_argv(marker)})],
        )
        async with running_restarter(config) as (client, restarter):
            await post_alerts(client, payload(alert(name)))
            await settle(restarter)
            assert last_result(restarter)["result"] == "success"
    assert marker_lines(marker) == [name]
    assert not (tmp_path / "pwned").exists()
    assert not (tmp_path / "pwned2").exists()


async def test_failing_command_is_journaled_and_still_starts_the_cooldown(tmp_path: Path) -> None:
    """A command that exits non-zero is a failure; the next alert still meets the cooldown."""
    argv = [sys.executable, "-c", "import sys; print('no such unit'); sys.exit(3)"]
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path, [target_entry("gpu1", fake.url, {"kind": "command", "argv": argv})]
        )
        async with running_restarter(config) as (client, restarter):
            await post_alerts(client, payload(alert(fingerprint="f1")))
            await settle(restarter)
            result = last_result(restarter)
            assert result["result"] == "failure"
            assert "exited 3" in result["detail"]
            assert "no such unit" in result["detail"]
            again = await post_alerts(
                client, payload(alert(fingerprint="f2", starts_at="2026-11-30T06:00:00Z"))
            )
            assert again["decisions"][0]["reason"] == "cooldown"
            metrics = await (await client.get("/metrics")).text()
            assert (
                'stallwatch_restarter_restarts_total{result="failure",target="gpu1"} 1.0' in metrics
            )


async def test_action_timeout_is_journaled_and_cooldown_applies(tmp_path: Path) -> None:
    """An action slower than action_timeout is killed, journaled as timeout, and cools down."""
    pid_file = tmp_path / "pid"
    code = "import os, sys, time\nopen(sys.argv[1], 'w').write(str(os.getpid()))\ntime.sleep(60)\n"
    argv = [sys.executable, "-c", code, str(pid_file)]
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path,
            [
                target_entry(
                    "gpu1", fake.url, {"kind": "command", "argv": argv}, action_timeout="1s"
                )
            ],
        )
        async with running_restarter(config) as (client, restarter):
            await post_alerts(client, payload(alert(fingerprint="f1")))
            await settle(restarter)
            result = last_result(restarter)
            assert result["result"] == "timeout"
            again = await post_alerts(
                client, payload(alert(fingerprint="f2", starts_at="2026-11-30T06:00:00Z"))
            )
            assert again["decisions"][0]["reason"] == "cooldown"
            metrics = await (await client.get("/metrics")).text()
            assert (
                'stallwatch_restarter_restarts_total{result="timeout",target="gpu1"} 1.0' in metrics
            )
    pid = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the timed-out command was killed, not left behind


async def test_docker_restart_over_the_engine_socket(tmp_path: Path) -> None:
    """docker: POST /containers/{name}/restart?t=N on the socket; 204 success, 404 failure."""
    with short_tmp_dir() as short:
        socket_path = short / "docker.sock"
        async with fake_vllm("stalled") as fake, fake_docker(socket_path, {"vllm-a"}) as seen:
            docker = {"kind": "docker", "socket": str(socket_path), "stop_timeout": "20s"}
            config = write_config(
                tmp_path,
                [
                    target_entry("gpu1", fake.url, {**docker, "container": "vllm-a"}),
                    target_entry("gpu2", fake.url, {**docker, "container": "vllm-gone"}),
                ],
            )
            async with running_restarter(config) as (client, restarter):
                await post_alerts(client, payload(alert("gpu1", fingerprint="a")))
                await settle(restarter)
                assert last_result(restarter)["result"] == "success"
                await post_alerts(client, payload(alert("gpu2", fingerprint="b")))
                await settle(restarter)
                failure = last_result(restarter)
                assert failure["result"] == "failure"
                assert "404" in failure["detail"]
                assert "No such container: vllm-gone" in failure["detail"]
    assert seen == ["/containers/vllm-a/restart?t=20", "/containers/vllm-gone/restart?t=20"]


async def test_docker_rounds_a_sub_second_stop_timeout_up(tmp_path: Path) -> None:
    """docker: a stop_timeout of 1.5 s asks for t=2, never less grace than configured."""
    with short_tmp_dir() as short:
        socket_path = short / "docker.sock"
        async with fake_vllm("stalled") as fake, fake_docker(socket_path, {"vllm-a"}) as seen:
            docker = {"kind": "docker", "socket": str(socket_path), "stop_timeout": "1500ms"}
            config = write_config(
                tmp_path, [target_entry("gpu1", fake.url, {**docker, "container": "vllm-a"})]
            )
            async with running_restarter(config) as (client, restarter):
                await post_alerts(client, payload(alert("gpu1", fingerprint="a")))
                await settle(restarter)
                assert last_result(restarter)["detail"] == "docker restarted vllm-a (t=2)"
    assert seen == ["/containers/vllm-a/restart?t=2"]


async def test_systemd_runs_systemctl_restart_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """systemd: `systemctl [--user] restart UNIT` runs as an argv (a fake systemctl records it);
    the detail states the unit's stop bound, as `systemctl show` gives it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "systemctl-calls"
    fake_systemctl = bin_dir / "systemctl"
    fake_systemctl.write_text(
        f"#!{sys.executable}\n"
        "import json, os, sys\n"
        "if 'show' in sys.argv:\n"
        "    print('TimeoutStopUSec=30s\\nKillMode=control-group\\nSendSIGKILL=yes')\n"
        "    sys.exit(0)\n"
        f"with open({str(record)!r}, 'a') as f:\n"
        "    f.write(json.dumps([sys.argv[1:], os.environ.get('STALLWATCH_TARGET')]) + '\\n')\n"
        "sys.exit(1 if 'broken.service' in sys.argv else 0)\n"
    )
    fake_systemctl.chmod(fake_systemctl.stat().st_mode | stat.S_IXUSR)
    (bin_dir / "journalctl").write_text("#!/bin/sh\nexit 0\n")  # an empty journal
    (bin_dir / "journalctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    async with fake_vllm("stalled") as fake:
        config = write_config(
            tmp_path,
            [
                target_entry("gpu1", fake.url, {"kind": "systemd", "unit": "vllm@gpu1.service"}),
                target_entry(
                    "gpu2", fake.url, {"kind": "systemd", "unit": "vllm.service", "user": True}
                ),
                target_entry("gpu3", fake.url, {"kind": "systemd", "unit": "broken.service"}),
            ],
            fleet_window={"max_targets": 5, "window": "15m"},
            # Three of three stalled on purpose here: not the mass stall that rule is for.
            mass_stall={"max_percent": 100},
        )
        async with running_restarter(config) as (client, restarter):
            results = []
            for name in ("gpu1", "gpu2", "gpu3"):
                await post_alerts(client, payload(alert(name, fingerprint=name)))
                await settle(restarter)
                results.append(last_result(restarter))
    assert [result["result"] for result in results] == ["success", "success", "failure"]
    assert results[0]["detail"] == (
        "systemctl exited 0; its stop: SIGTERM to the control-group, SIGKILL after 30s"
    )
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls == [
        [["restart", "vllm@gpu1.service"], "gpu1"],
        [["--user", "restart", "vllm.service"], "gpu2"],
        [["restart", "broken.service"], "gpu3"],
    ]


async def test_http_action_calls_the_supervisor(tmp_path: Path) -> None:
    """http: the configured request reaches the supervisor with its bearer token; 5xx fails."""
    received: list[dict[str, Any]] = []

    async def supervisor(request: web.Request) -> web.Response:
        received.append(
            {
                "method": request.method,
                "path": request.path,
                "authorization": request.headers.get("Authorization"),
                "body": await request.json(),
            }
        )
        return web.Response(status=500 if request.path == "/broken" else 202, text="ok")

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", supervisor)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    (tmp_path / "supervisor.token").write_text("sup-token\n")
    (tmp_path / "supervisor.token").chmod(0o600)  # a secret others can read is refused
    try:
        async with fake_vllm("stalled") as fake:
            config = write_config(
                tmp_path,
                [
                    target_entry(
                        "gpu1",
                        fake.url,
                        {
                            "kind": "http",
                            "method": "PUT",
                            "url": str(server.make_url("/restart/gpu1")),
                            "bearer_token_file": "supervisor.token",
                        },
                    ),
                    target_entry(
                        "gpu2", fake.url, {"kind": "http", "url": str(server.make_url("/broken"))}
                    ),
                ],
            )
            async with running_restarter(config) as (client, restarter):
                await post_alerts(client, payload(alert("gpu1", fingerprint="a")))
                await settle(restarter)
                assert last_result(restarter)["result"] == "success"
                await post_alerts(client, payload(alert("gpu2", fingerprint="b")))
                await settle(restarter)
                assert last_result(restarter)["result"] == "failure"
    finally:
        await server.close()
    assert received == [
        {
            "method": "PUT",
            "path": "/restart/gpu1",
            "authorization": "Bearer sup-token",
            "body": {"target": "gpu1", "action": "restart"},
        },
        {
            "method": "POST",
            "path": "/broken",
            "authorization": None,
            "body": {"target": "gpu2", "action": "restart"},
        },
    ]


# A restart script as a user would write one: stop the old simulator, start a new one,
# and say where it listens. The test cleans up whatever process it leaves behind.
RESTART_SCRIPT = """\
import os, signal, subprocess, sys, time
state = sys.argv[1]
old_pid = int(open(os.path.join(state, "pid")).read())
os.kill(old_pid, signal.SIGTERM)
log = open(os.path.join(state, "new.out"), "w")
new = subprocess.Popen(
    [sys.executable, "-m", "stallwatch", "sim", "--port", "0"],
    stdout=log, stderr=subprocess.DEVNULL, start_new_session=True,
    env={**os.environ, "PYTHONUNBUFFERED": "1"},
)
open(os.path.join(state, "new.pid"), "w").write(str(new.pid))
for _ in range(400):
    text = open(os.path.join(state, "new.out")).read()
    if text.startswith("listening on "):
        open(os.path.join(state, "new.url"), "w").write(text.split()[2])
        sys.exit(0)
    time.sleep(0.05)
sys.exit(1)
"""


async def metrics_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url + "/metrics", timeout=aiohttp.ClientTimeout(total=5)) as response:
        return await response.text()


async def test_command_restarts_a_hung_simulator_process(tmp_path: Path) -> None:
    """A hung simulator (work in flight, counters frozen) is confirmed and replaced."""
    from stallwatch.simulator.testing import start_simulator_process

    state = tmp_path / "state"
    state.mkdir()
    script = tmp_path / "restart_sim.py"
    script.write_text(RESTART_SCRIPT)
    sim = start_simulator_process(["--tokens-per-second", "50"])
    (state / "pid").write_text(str(sim.process.pid))
    try:
        async with aiohttp.ClientSession() as session:
            request = asyncio.create_task(
                session.post(
                    sim.url + "/v1/completions",
                    json={"model": "tiny", "prompt": "hello", "max_tokens": 1500},
                    timeout=aiohttp.ClientTimeout(total=60),
                )
            )
            for _ in range(100):
                if 'vllm:num_requests_running{engine="0",model_name="tiny"} 1.0' in (
                    await metrics_text(session, sim.url)
                ):
                    break
                await asyncio.sleep(0.05)
            async with session.post(sim.url + "/sim/fault", json={"fault": "hang"}) as response:
                assert response.status == 200
            config = write_config(
                tmp_path,
                [
                    target_entry(
                        "sim",
                        sim.url + "/metrics",
                        {"kind": "command", "argv": [sys.executable, str(script), str(state)]},
                        action_timeout="30s",
                    )
                ],
            )
            async with running_restarter(config) as (client, restarter):
                answer = await post_alerts(client, payload(alert("sim")))
                assert answer["decisions"][0]["reason"] == "confirmed"
                await settle(restarter)
                assert last_result(restarter)["result"] == "success"
            request.cancel()
            with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
                await request
            assert sim.process.wait(10) is not None  # the old process is gone
            new_url = (state / "new.url").read_text()
            fresh = await metrics_text(session, new_url)
            assert 'vllm:num_requests_running{engine="0",model_name="tiny"} 0.0' in fresh
    finally:
        sim.stop()
        new_pid = state / "new.pid"
        if new_pid.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(new_pid.read_text()), signal.SIGKILL)


def process_is_gone(pid: int) -> bool:
    """Whether `pid` has exited (a zombie waiting for a reaper counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


async def test_command_that_leaves_a_child_holding_its_output_succeeds_and_kills_it(
    tmp_path: Path,
) -> None:
    """A command exiting 0 while a background child keeps stdout open is a success, at once;
    the child is killed and the detail says so."""
    pid_file = tmp_path / "child.pid"
    script = f"sleep 60 & echo $! > {pid_file}; echo restarted"
    async with asyncio.timeout(30):
        succeeded, detail = await run_argv(["sh", "-c", script], "gpu1")
    assert succeeded, detail
    assert "exited 0: restarted" in detail
    assert "killed the processes it left running" in detail
    child = int(pid_file.read_text())
    for _ in range(100):
        if process_is_gone(child):
            break
        await asyncio.sleep(0.05)
    assert process_is_gone(child)


async def test_command_with_no_leftovers_says_nothing_about_killing(tmp_path: Path) -> None:
    """A command that leaves nothing behind gets a plain detail."""
    succeeded, detail = await run_argv([sys.executable, "-c", "print('ok')"], "gpu1")
    assert succeeded
    assert detail.endswith("exited 0: ok")


async def test_chatty_command_output_is_capped(tmp_path: Path) -> None:
    """64 MiB of output is read and dropped as it comes: only a small tail is ever held."""
    code = (
        "import sys\n"
        "for _ in range(64): sys.stdout.buffer.write(b'y' * (1 << 20))\n"
        "sys.stdout.buffer.write(b'the end')\n"
    )
    tracemalloc.start()
    try:
        succeeded, detail = await run_argv([sys.executable, "-c", code], "gpu1")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert succeeded
    assert detail.endswith("the end")
    assert peak < 8 * (1 << 20), peak
