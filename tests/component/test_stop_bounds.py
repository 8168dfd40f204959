"""Every action ends a wedged server that ignores SIGTERM within the bound it states, and the
journal says when the kill escalated: a real process that traps SIGTERM (tests/component/wedged.py)
behind the command action, a Docker Engine API, an http receiver and the demo's supervisor;
systemd's tools as stand-ins, and the grace period a Kubernetes API is sent."""

from __future__ import annotations

import asyncio
import io
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from stallwatch.common.kubernetes_config import KubernetesAction, KubernetesSettings
from stallwatch.demo.supervisor import RESTART_STOP_SECONDS, ServerProcess, Supervisor
from stallwatch.demo.timeline import Timeline
from stallwatch.localstack.processes import ManagedProcess, free_port
from stallwatch.restarter.kube.action import PodRestarter
from stallwatch.restarter.kube.api import KubeApi
from stallwatch.restarter.service import Restarter
from tests.component.docker_fake import fake_docker_engine
from tests.component.wedged import (
    group_alive,
    kill_group,
    start_wedged,
    wait_listening,
    wedged_argv,
)
from tests.support.actions import ACTIONS
from tests.support.docker import fake_docker, short_tmp_dir
from tests.support.kube_fake import make_pod
from tests.support.kube_restarter import fake_kube
from tests.support.restarter import (
    alert,
    fake_vllm,
    payload,
    post_alerts,
    running_restarter,
    settle,
    target_entry,
    write_config,
)


def action_result(restarter: Restarter) -> dict[str, Any]:
    entry = restarter.journal.recent(1)[0]
    assert entry.decision == "action_result"
    return entry.as_json()


def fresh_dir(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


async def restart_once(config_dir: Path, action: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One confirmed LLMServerStuck for a target with `action`; its journaled action result."""
    async with fake_vllm("stalled") as fake:
        config = write_config(config_dir, [target_entry("gpu1", fake.url, action, **extra)])
        async with running_restarter(config) as (client, restarter):
            answer = await post_alerts(client, payload(alert("gpu1")))
            assert answer["decisions"][0]["decision"] == "restart", answer
            await settle(restarter)
            return action_result(restarter)


async def test_command_action_with_the_example_script_kills_and_journals_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """command (restart-process-group.sh): a server ignoring SIGTERM is SIGKILLed after
    STOP_GRACE_SECONDS, and the journaled detail says "ignored SIGTERM: SIGKILL after 1 s"."""
    old = start_wedged(tmp_path / "old.log")
    pidfile = tmp_path / "server.pgid"
    pidfile.write_text(f"{old.pid}\n")
    monkeypatch.setenv("STOP_GRACE_SECONDS", "1")
    reaper = threading.Thread(target=old.wait, daemon=True)  # as init reaps an orphan
    reaper.start()
    argv = [str(ACTIONS / "restart-process-group.sh"), str(pidfile), str(tmp_path / "new.log")]
    try:
        result = await restart_once(
            tmp_path, {"kind": "command", "argv": [*argv, *wedged_argv()]}, action_timeout="30s"
        )
        assert result["result"] == "success", result
        assert f"process group {old.pid} ignored SIGTERM: SIGKILL after 1 s" in result["detail"]
        reaper.join(timeout=10)
        assert old.returncode == -signal.SIGKILL
        assert not group_alive(old.pid)
        assert result["duration_seconds"] < 20, result  # 1 s of grace, generous for a slow box
    finally:
        kill_group(old.pid)
        kill_group(int(pidfile.read_text()))  # the new server, if one was started
        if old.poll() is None:
            old.wait()


async def test_docker_action_says_when_the_engine_had_to_kill(tmp_path: Path) -> None:
    """docker: the engine SIGKILLs a container that ignores SIGTERM after t; the detail says so
    (read from the engine's events), and says nothing of a kill for one that stops on SIGTERM."""
    with short_tmp_dir() as short:
        socket_path = short / "docker.sock"
        containers = {
            "wedged": (wedged_argv(), tmp_path / "wedged.log"),
            "healthy": (wedged_argv(graceful=True), tmp_path / "healthy.log"),
        }
        async with fake_docker_engine(socket_path, containers) as engine:
            docker = {"kind": "docker", "socket": str(socket_path), "stop_timeout": "1s"}
            wedged = await restart_once(
                fresh_dir(tmp_path / "a"), {**docker, "container": "wedged"}, action_timeout="30s"
            )
            # A long grace for the healthy one: on a loaded machine its exit on SIGTERM may take
            # more than a second, which would be a real kill, not what this case is about.
            healthy = await restart_once(
                fresh_dir(tmp_path / "b"),
                {**docker, "container": "healthy", "stop_timeout": "20s"},
                action_timeout="60s",
            )
            assert engine.containers["wedged"].starts == 2
            assert engine.containers["healthy"].starts == 2
    assert wedged["result"] == "success", wedged
    assert wedged["detail"] == (
        "docker restarted wedged (t=1): it ignored SIGTERM: SIGKILL after 1 s"
    )
    assert healthy["result"] == "success", healthy
    assert healthy["detail"] == "docker restarted healthy (t=20)"
    assert "POST /containers/wedged/restart?t=1" in engine.requests
    assert "GET /events" in engine.requests


async def test_docker_action_without_the_events_api_still_succeeds(tmp_path: Path) -> None:
    """docker: an engine (or socket proxy) that does not answer /events leaves the restart a
    success that states its bound (t), and claims no kill."""
    with short_tmp_dir() as short:
        socket_path = short / "docker.sock"
        async with fake_docker(socket_path, {"vllm-a"}):
            docker = {"kind": "docker", "socket": str(socket_path), "stop_timeout": "5s"}
            result = await restart_once(tmp_path, {**docker, "container": "vllm-a"})
    assert result["result"] == "success", result
    assert result["detail"] == "docker restarted vllm-a (t=5)"


async def test_http_action_journals_what_the_receiver_says_about_its_kill(tmp_path: Path) -> None:
    """http: the receiver owns the stop (here SIGTERM, SIGKILL after 1 s, of a real wedged
    server); its answer, which says it had to kill, is the journaled detail."""
    server = start_wedged(tmp_path / "wedged.log")
    reaper = threading.Thread(target=server.wait, daemon=True)
    reaper.start()

    async def restart(request: web.Request) -> web.Response:
        server.send_signal(signal.SIGTERM)
        await asyncio.to_thread(reaper.join, 1.0)
        if server.poll() is None:
            kill_group(server.pid)
            await asyncio.to_thread(reaper.join, 10)
            return web.Response(text=f"pid {server.pid} ignored SIGTERM: SIGKILL after 1 s")
        return web.Response(text=f"pid {server.pid} stopped on SIGTERM")

    app = web.Application()
    app.router.add_post("/restart", restart)
    receiver = TestServer(app, host="127.0.0.1")
    await receiver.start_server()
    try:
        action = {"kind": "http", "url": str(receiver.make_url("/restart"))}
        result = await restart_once(tmp_path, action, action_timeout="30s")
    finally:
        await receiver.close()
        kill_group(server.pid)
        reaper.join(timeout=10)
    assert result["result"] == "success", result
    assert result["detail"].endswith(
        f"answered 200: pid {server.pid} ignored SIGTERM: SIGKILL after 1 s"
    ), result
    assert server.returncode == -signal.SIGKILL


async def test_systemd_action_journals_a_stop_systemd_had_to_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """systemd: when the unit's journal since the restart has systemd's "State 'stop-sigterm'
    timed out. Killing.", the journaled detail says the kill and its bound (TimeoutStopSec).
    systemd cannot run here: systemctl and journalctl are stand-ins printing what they print."""
    bin_dir = fresh_dir(tmp_path / "bin")
    asked = tmp_path / "journalctl-args"
    write_program(
        bin_dir / "systemctl",
        "import sys\n"
        "if 'show' in sys.argv:\n"
        "    print('TimeoutStopUSec=30s\\nKillMode=control-group\\nSendSIGKILL=yes')\n",
    )
    write_program(
        bin_dir / "journalctl",
        "import sys\n"
        f"open({str(asked)!r}, 'w').write(' '.join(sys.argv[1:]))\n"
        "print('Stopping vLLM server gpu1...')\n"
        "print(\"vllm@gpu1.service: State 'stop-sigterm' timed out. Killing.\")\n",
    )
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    before = int(time.time())
    result = await restart_once(tmp_path, {"kind": "systemd", "unit": "vllm@gpu1.service"})
    assert result["result"] == "success", result
    assert result["detail"] == "systemctl exited 0: it ignored SIGTERM: SIGKILL after 30s"
    arguments = asked.read_text().split()
    assert arguments[:2] == ["--unit", "vllm@gpu1.service"]
    since = int(next(a for a in arguments if a.startswith("--since=@")).split("@")[1])
    assert before - 1 <= since <= time.time()  # this restart's lines only


def write_program(path: Path, body: str) -> None:
    path.write_text(f"#!{sys.executable}\n{body}")
    path.chmod(0o755)


def test_managed_process_stop_says_whether_it_had_to_kill(tmp_path: Path) -> None:
    """ManagedProcess.stop: True only when the group outlived SIGTERM and SIGKILL ended it."""
    wedged = ManagedProcess("wedged", wedged_argv(), tmp_path / "wedged.log").start()
    healthy = ManagedProcess("ok", wedged_argv(graceful=True), tmp_path / "ok.log").start()
    try:
        for process in (wedged, healthy):
            wait_listening(process.log_path)
        started = time.monotonic()
        assert wedged.stop(1.0) is True
        assert time.monotonic() - started < 15
        assert wedged.returncode == -signal.SIGKILL
        assert healthy.stop(10.0) is False
        assert healthy.returncode == 0
    finally:
        wedged.stop(0.1, kill_first=True)
        healthy.stop(0.1, kill_first=True)


async def test_demo_supervisor_says_when_it_killed_the_old_server(tmp_path: Path) -> None:
    """The demo's restart helper answer (the journal's detail) says the old server ignored
    SIGTERM and got SIGKILL after the supervisor's stop bound."""
    supervisor = Supervisor(tmp_path, Timeline(io.StringIO(), time.monotonic(), False), "t")
    old = ManagedProcess("sim-gpu1", wedged_argv(), tmp_path / "old.log").start()
    supervisor.all_processes.append(old)
    wait_listening(old.log_path)
    supervisor.servers["gpu1"] = ServerProcess("gpu1", free_port(), old)
    try:
        detail = await supervisor.restart("gpu1")
    finally:
        supervisor.stop_all()
    assert detail.startswith(
        f"pid {old.pid} ignored SIGTERM: SIGKILL after {RESTART_STOP_SECONDS:g} s, started pid "
    ), detail
    assert old.returncode == -signal.SIGKILL


@pytest.mark.parametrize(
    ("mode", "grace_period", "sent", "stated"),
    [
        ("evict", None, None, "SIGKILL after 45 s (terminationGracePeriodSeconds)"),
        ("evict", 10, 10, "SIGKILL after 10 s (grace_period)"),
        ("delete", None, None, "SIGKILL after 45 s (terminationGracePeriodSeconds)"),
        ("delete", 5, 5, "SIGKILL after 5 s (grace_period)"),
    ],
)
async def test_kubernetes_action_sends_and_states_the_grace_period(
    tmp_path: Path, mode: str, grace_period: int | None, sent: int | None, stated: str
) -> None:
    """kubernetes: gracePeriodSeconds goes with the eviction or delete when the action sets
    one; the detail states the bound that applies (else the pod's own, 45 s here)."""
    async with fake_kube() as fake:
        fake.add_pod(make_pod("llm", "vllm-0", grace_period=45))
        api = await KubeApi.connect(KubernetesSettings(kubeconfig=str(fake.kubeconfig(tmp_path))))
        try:
            action = KubernetesAction(
                mode=mode,  # type: ignore[arg-type]
                namespace="llm",
                pod="vllm-0",
                grace_period=grace_period,
            )
            result, detail = await PodRestarter(api).restart(action)
        finally:
            await api.close()
    assert result == "success", detail
    assert fake.grace_periods == {("llm", "vllm-0"): sent}
    assert detail.endswith(f": SIGTERM, then the kubelet's {stated}"), detail
