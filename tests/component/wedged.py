"""A model server wedged mid-decode, as a real process: `/health` answers 200, SIGTERM is
ignored (the server and its EngineCore stand-in both trap it), and only SIGKILL ends it."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

# The server prints "listening on PORT" once both it and its child have their SIGTERM traps in
# place, so a test never sends SIGTERM to a process that would still die of it.
# With the argument `graceful` it is a healthy server instead: SIGTERM ends it and its child.
WEDGED_SERVER = r"""
import http.server, signal, subprocess, sys
wedged = sys.argv[1:] != ["graceful"]
if wedged:
    signal.signal(signal.SIGTERM, lambda signum, frame: print("SIGTERM ignored", flush=True))
child = subprocess.Popen(
    [sys.executable, "-c",
     "import signal, sys, time\n"
     f"signal.signal(signal.SIGTERM, signal.{'SIG_IGN' if wedged else 'SIG_DFL'})\n"
     "print('ready', flush=True)\n"
     "time.sleep(600)\n"],
    stdout=subprocess.PIPE,
)
child.stdout.readline()
if not wedged:
    signal.signal(signal.SIGTERM, lambda signum, frame: (child.terminate(), sys.exit(0)))

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass

server = http.server.HTTPServer(("127.0.0.1", 0), Health)
print(f"listening on {server.server_port}", flush=True)
server.serve_forever()
"""


def wedged_argv(*, graceful: bool = False) -> list[str]:
    return [sys.executable, "-c", WEDGED_SERVER, *(["graceful"] if graceful else [])]


def start_wedged(log: Path) -> subprocess.Popen[bytes]:
    """Start the wedged server (the leader of a session of its own), once its traps are set."""
    with log.open("wb") as out:
        process = subprocess.Popen(
            wedged_argv(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    wait_listening(log, process)
    return process


def wait_listening(
    log: Path, process: subprocess.Popen[bytes] | None = None, timeout: float = 30.0
) -> int:
    """The port the server printed; raises if it exits or says nothing within `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("listening on "):
                return int(line.split()[2])
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"the wedged server exited {process.returncode}: {log.read_text()}")
        time.sleep(0.05)
    raise RuntimeError(f"the wedged server did not listen within {timeout} s")


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_group(pgid: int) -> None:
    """SIGKILL what is left of a process group (a test's clean-up)."""
    if pgid > 1:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
