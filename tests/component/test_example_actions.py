"""The example restart commands in examples/actions/, run as the restarter runs a command."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from stallwatch.restarter.actions import run_argv
from tests.component.docker_fake import fake_docker_engine
from tests.component.wedged import kill_group, start_wedged, wedged_argv
from tests.support.actions import ACTIONS
from tests.support.docker import fake_docker, short_tmp_dir

# What `systemctl show -p TimeoutStopUSec -p KillMode -p SendSIGKILL` prints for
# examples/systemd/vllm@.service.
SHOW = "TimeoutStopUSec=30s\nKillMode=control-group\nSendSIGKILL=yes"


def fake_systemctl(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exit_code: int, *, journal: str = ""
) -> Path:
    """A `systemctl` first on the PATH that records its arguments, and a `journalctl` that
    prints `journal` as the unit's log; returns the record file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    record = tmp_path / "calls"
    program = bin_dir / "systemctl"
    program.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"with open({str(record)!r}, 'a') as f: f.write(json.dumps(sys.argv[1:]) + '\\n')\n"
        f"print({SHOW!r} if 'show' in sys.argv else 'active')\n"
        f"sys.exit({exit_code} if 'restart' in sys.argv else 0)\n"
    )
    program.chmod(0o755)
    journalctl = bin_dir / "journalctl"
    journalctl.write_text(f"#!{sys.executable}\nprint({journal!r})\n")
    journalctl.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return record


async def test_systemd_script_restarts_the_unit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """restart-systemd-unit.sh runs `systemctl [--user] restart -- UNIT` and reports success."""
    record = fake_systemctl(tmp_path, monkeypatch, 0)
    script = str(ACTIONS / "restart-systemd-unit.sh")
    succeeded, detail = await run_argv([script, "vllm@gpu1.service"], "gpu1")
    assert succeeded, detail
    assert (
        "restarted vllm@gpu1.service (active); its stop: SIGTERM to the control-group, "
        "SIGKILL after 30s"
    ) in detail
    assert "ignored SIGTERM" not in detail
    succeeded, _ = await run_argv([script, "--user", "vllm.service"], "gpu1")
    assert succeeded
    calls = [json.loads(line) for line in record.read_text().splitlines()]
    assert calls[0] == ["restart", "--", "vllm@gpu1.service"]
    assert ["--user", "restart", "--", "vllm.service"] in calls
    succeeded, detail = await run_argv([script, "--now"], "gpu1")
    assert not succeeded
    assert "exited 64" in detail


async def test_systemd_script_says_when_systemd_had_to_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the unit's journal shows the stop timed out into SIGKILL, the output says so."""
    fake_systemctl(
        tmp_path,
        monkeypatch,
        0,
        journal="Stopping vLLM server gpu1...\nState 'stop-sigterm' timed out. Killing.",
    )
    script = str(ACTIONS / "restart-systemd-unit.sh")
    succeeded, detail = await run_argv([script, "vllm@gpu1.service"], "gpu1")
    assert succeeded, detail
    assert "restarted vllm@gpu1.service (active): it ignored SIGTERM: SIGKILL after 30s" in detail


async def test_systemd_script_fails_when_systemctl_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed `systemctl restart` is the script's failure (its exit status is the result)."""
    fake_systemctl(tmp_path, monkeypatch, 5)
    succeeded, detail = await run_argv([str(ACTIONS / "restart-systemd-unit.sh"), "x.service"], "g")
    assert not succeeded
    assert "exited 5" in detail


async def test_docker_script_restarts_through_the_engine_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """restart-docker-container.sh POSTs /containers/NAME/restart?t=N: 204 ok, 404 a failure."""
    script = str(ACTIONS / "restart-docker-container.sh")
    with short_tmp_dir() as short:
        socket_path = short / "docker.sock"
        monkeypatch.setenv("DOCKER_SOCKET", str(socket_path))
        async with fake_docker(socket_path, {"vllm-a"}) as seen:
            succeeded, detail = await run_argv([script, "vllm-a", "20"], "gpu1")
            assert succeeded, detail
            assert "restarted container vllm-a" in detail
            succeeded, detail = await run_argv([script, "vllm-gone"], "gpu2")
            assert not succeeded
            assert "docker answered 404" in detail
            assert "No such container: vllm-gone" in detail
    assert seen == ["/containers/vllm-a/restart?t=20", "/containers/vllm-gone/restart?t=30"]


async def test_docker_script_says_when_the_engine_had_to_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """restart-docker-container.sh: a container whose server ignores SIGTERM is SIGKILLed after
    STOP_TIMEOUT by the engine, and the output says so; one that stops on SIGTERM is not."""
    script = str(ACTIONS / "restart-docker-container.sh")
    with short_tmp_dir() as short:
        socket_path = short / "docker.sock"
        monkeypatch.setenv("DOCKER_SOCKET", str(socket_path))
        containers = {
            "wedged": (wedged_argv(), tmp_path / "wedged.log"),
            "healthy": (wedged_argv(graceful=True), tmp_path / "healthy.log"),
        }
        async with fake_docker_engine(socket_path, containers) as engine:
            succeeded, wedged = await run_argv([script, "wedged", "1"], "gpu1")
            assert succeeded, wedged
            # A long grace for the healthy one: on a loaded machine its exit on SIGTERM may take
            # more than a second, which would be a real kill, not what this case is about.
            succeeded, healthy = await run_argv([script, "healthy", "20"], "gpu2")
            assert succeeded, healthy
            assert engine.containers["wedged"].starts == 2
    assert "restarted container wedged: it ignored SIGTERM: SIGKILL after 1 s" in wedged
    assert "restarted container healthy (SIGKILL after 20 s if SIGTERM did not stop it)" in healthy
    assert "ignored SIGTERM" not in healthy


async def test_docker_script_refuses_a_name_that_is_not_a_container_name() -> None:
    """A name that could change the URL is a usage error (64), nothing is sent."""
    script = str(ACTIONS / "restart-docker-container.sh")
    succeeded, detail = await run_argv([script, "a/../../images"], "gpu1")
    assert not succeeded
    assert "exited 64" in detail


def start_in_new_session(argv: list[str]) -> subprocess.Popen[bytes]:
    """The server as started under `setsid`: the leader of its own session and group."""
    return subprocess.Popen(argv, start_new_session=True, stdout=subprocess.DEVNULL)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


async def test_process_group_script_stops_the_whole_group_and_starts_a_new_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old server and its child (an EngineCore stand-in) both go; the new server is the
    leader of its own session, outlives the script and does not hold the restarter's pipe."""
    server = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('serving', flush=True)\n"
        "time.sleep(600)\n"
    )
    old = start_in_new_session([sys.executable, "-c", server])
    pidfile = tmp_path / "server.pgid"
    pidfile.write_text(f"{old.pid}\n")
    logfile = tmp_path / "server.log"
    monkeypatch.setenv("STOP_GRACE_SECONDS", "30")
    # The old server's parent reaps it at once, as init does for a server whose starter left.
    reaper = threading.Thread(target=old.wait, daemon=True)
    reaper.start()
    new_pgid = 0
    try:
        await asyncio.sleep(0.5)  # let the old server start its child
        succeeded, detail = await run_argv(
            [
                str(ACTIONS / "restart-process-group.sh"),
                str(pidfile),
                str(logfile),
                sys.executable,
                "-c",
                server,
            ],
            "gpu1",
        )
        assert succeeded, detail
        assert "killed the processes it left running" not in detail
        assert "stopped on SIGTERM" in detail
        assert "ignored SIGTERM" not in detail
        reaper.join(timeout=10)
        assert old.returncode == -signal.SIGTERM
        assert not group_alive(old.pid)
        new_pgid = int(pidfile.read_text())
        assert new_pgid != old.pid
        assert f"started {sys.executable} as process group {new_pgid}" in detail
        assert group_alive(new_pgid)
        assert os.getsid(new_pgid) == new_pgid
    finally:
        for pgid in (old.pid, new_pgid, int(pidfile.read_text())):
            if pgid and group_alive(pgid):
                os.killpg(pgid, signal.SIGKILL)
        if old.poll() is None:
            old.wait()


async def test_process_group_script_kills_a_group_that_ignores_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wedged server (and its child) that ignore SIGTERM get SIGKILL after STOP_GRACE_SECONDS;
    the output says so, and the new server starts."""
    old = start_wedged(tmp_path / "old.log")
    pidfile = tmp_path / "server.pgid"
    pidfile.write_text(f"{old.pid}\n")
    monkeypatch.setenv("STOP_GRACE_SECONDS", "1")
    reaper = threading.Thread(target=old.wait, daemon=True)  # as init reaps an orphan
    reaper.start()
    new_pgid = 0
    try:
        started = asyncio.get_running_loop().time()
        succeeded, detail = await run_argv(
            [
                str(ACTIONS / "restart-process-group.sh"),
                str(pidfile),
                str(tmp_path / "new.log"),
                *wedged_argv(),
            ],
            "gpu1",
        )
        elapsed = asyncio.get_running_loop().time() - started
        assert succeeded, detail
        assert f"process group {old.pid} ignored SIGTERM: SIGKILL after 1 s" in detail
        reaper.join(timeout=10)
        assert old.returncode == -signal.SIGKILL
        assert "SIGTERM ignored" in (tmp_path / "old.log").read_text()  # it was asked first
        assert not group_alive(old.pid)  # its child, which ignored SIGTERM too, went with it
        assert elapsed < 20, elapsed  # 1 s of grace; generous for a loaded machine
        new_pgid = int(pidfile.read_text())
        assert group_alive(new_pgid)
    finally:
        for pgid in (old.pid, new_pgid, int(pidfile.read_text())):
            kill_group(pgid)
        if old.poll() is None:
            old.wait()
