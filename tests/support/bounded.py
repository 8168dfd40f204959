"""Run a command that may start processes of its own, bounded in time, and leave none behind.

`subprocess.run(..., capture_output=True, timeout=...)` kills only the command at its timeout and
then waits for its pipes, which a grandchild (a Prometheus, a simulator) may hold open forever:
the test hangs instead of failing. Here the command runs in a session of its own, writes to
files, and the whole session is killed at the bound.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str
    timed_out: bool


def run_bounded(argv: list[str], *, cwd: Path, timeout: float) -> Completed:
    """Run `argv`; past `timeout` seconds kill its whole session and say it timed out."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        process = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=err, start_new_session=True)
        timed_out = False
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            kill_session(process)
        out.seek(0)
        err.seek(0)
        return Completed(process.returncode, out.read(), err.read(), timed_out)


def kill_session(process: subprocess.Popen[str]) -> None:
    """Kill every process left in the command's session (it may have ended, its children not)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


def terminate(process: subprocess.Popen[str], grace_seconds: float = 20) -> None:
    """SIGTERM, then SIGKILL if the process has not ended within `grace_seconds`."""
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=grace_seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
