"""Bounds on test runs: a hang stops its tier or its command, and the run goes on and says so."""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

from tests.support.bounded import run_bounded as run_command
from tests.support.tier_runner import tier_runner

REPO = Path(__file__).resolve().parents[2]


def test_a_tier_past_its_bound_is_stopped_with_its_children(tmp_path: Path) -> None:
    """A tier still running at its bound is killed, its child processes too, and marked stopped."""
    runner = tier_runner()
    pid_file = tmp_path / "child.pid"
    hanging = _hanging(pid_file)
    started = time.monotonic()
    status = runner.run_bounded([sys.executable, "-c", hanging], dict(os.environ), 3.0)
    assert status == runner.TIER_STOPPED
    assert time.monotonic() - started < 60
    child = _gone_within(pid_file, 10)
    assert not _alive(child), "the tier's child process outlived the stopped tier"


def test_a_tier_within_its_bound_gives_its_own_status() -> None:
    """A tier that ends in time returns pytest's own exit status, failure included."""
    runner = tier_runner()
    assert (
        runner.run_bounded([sys.executable, "-c", "raise SystemExit(3)"], dict(os.environ), 60) == 3
    )


def test_every_tier_has_both_bounds() -> None:
    """Each tier has a per-test bound below its whole-tier bound."""
    runner = tier_runner()
    for tier in runner.TIERS:
        assert 0 < runner.TEST_TIMEOUT_SECONDS[tier] < runner.TIER_TIMEOUT_SECONDS[tier]


def _hanging(pid_file: Path) -> str:
    """A program that starts a sleeping child, writes its pid, says `running` and sleeps."""
    return (
        "import subprocess, sys, time, pathlib\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        f"pathlib.Path({str(pid_file)!r}).write_text(str(child.pid))\n"
        "print('running', flush=True)\n"
        "time.sleep(600)\n"
    )


def _gone_within(pid_file: Path, seconds: float) -> int:
    """The child pid written in `pid_file`, once it is gone or `seconds` have passed."""
    child = int(pid_file.read_text())
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.1)
    return child


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A killed child whose parent died is reaped by init; until then it is a zombie.
    status = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    return status != "Z"


def test_a_bounded_command_whose_grandchild_holds_its_output_still_ends() -> None:
    """A command past its bound ends the test even when a process it started holds its output."""
    holds_output = (
        "import subprocess, sys, time\n"
        "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
        "print('started', flush=True)\n"
        "time.sleep(600)\n"
    )
    started = time.monotonic()
    completed = run_command([sys.executable, "-c", holds_output], cwd=REPO, timeout=2.0)
    assert completed.timed_out
    assert completed.stdout == "started\n"
    assert time.monotonic() - started < 60


def test_a_tier_beside_is_stopped_with_its_children_when_the_run_is_interrupted(
    tmp_path: Path,
) -> None:
    """A tier running in a thread is stopped, children too, when its stop event is set."""
    runner = tier_runner()
    pid_file = tmp_path / "child.pid"
    hanging = _hanging(pid_file)
    stop = threading.Event()
    log = tmp_path / "tier.log"
    statuses: list[int] = []
    with log.open("wb") as out:
        thread = threading.Thread(
            target=lambda: statuses.append(
                runner.run_bounded(
                    [sys.executable, "-c", hanging], dict(os.environ), 600, out=out, stop=stop
                )
            )
        )
        thread.start()
        deadline = time.monotonic() + 30
        while not pid_file.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        stop.set()
        thread.join(60)
    assert statuses == [runner.TIER_STOPPED]
    assert log.read_text() == "running\n"
    child = _gone_within(pid_file, 10)
    assert not _alive(child), "the stopped tier's child process outlived it"


def test_a_tier_beside_that_ends_gives_its_own_status_and_output(tmp_path: Path) -> None:
    """In a thread with a stop event never set, the tier's status and output are its own."""
    runner = tier_runner()
    log = tmp_path / "tier.log"
    with log.open("wb") as out:
        status = runner.run_bounded(
            [sys.executable, "-c", "print('done'); raise SystemExit(3)"],
            dict(os.environ),
            60,
            out=out,
            stop=threading.Event(),
        )
    assert status == 3
    assert log.read_text() == "done\n"
