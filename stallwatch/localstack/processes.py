"""Subprocesses in their own process groups, found on PATH, started on free ports, awaited."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path

from stallwatch.localstack.errors import LocalStackError, MissingBinaryError

HTTP_TIMEOUT_SECONDS = 5.0
STARTUP_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0


def find_binary(*names: str) -> str:
    """The first of `names` found on PATH."""
    for name in names:
        path = shutil.which(name)
        if path is not None:
            return path
    raise MissingBinaryError(
        f"none of {', '.join(names)} is on PATH; install Debian's prometheus and "
        "prometheus-alertmanager packages (`make demo` and `make test` do it when run as root)"
    )


EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST_CHOSEN_PORT = 10_000
_handed_out: set[int] = set()


def ephemeral_port_range(path: Path = EPHEMERAL_RANGE_FILE) -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (Linux's default
    when it cannot be read)."""
    try:
        low, high = (int(field) for field in path.read_text().split())
    except (OSError, ValueError):
        return 32_768, 60_999
    return low, high


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago, from below the ephemeral range.

    A port the kernel picks (bind to 0) comes from the ephemeral range, which is also where
    every outgoing connection takes its local port: between the pick and the server's own
    bind, a connection may take it ("address already in use"). Below that range only
    listeners take ports, and this process never hands out one port twice.
    """
    low, _ = ephemeral_port_range()
    if low - LOWEST_CHOSEN_PORT >= 1_000:
        for _ in range(200):
            port = random.randrange(LOWEST_CHOSEN_PORT, low)
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        chosen: int = sock.getsockname()[1]
        return chosen


def log_tail(path: Path, lines: int = 30) -> str:
    """The last `lines` lines of a log file."""
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


class ManagedProcess:
    """A subprocess in its own process group, its output in a log file.

    Its own session keeps a Ctrl-C in the terminal from reaching it directly, so the owner
    decides the order of shutdown; `stop()` ends the whole group (terminate, wait, kill).
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._env = dict(env) if env is not None else None
        self._cwd = cwd
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise LocalStackError(f"{self.name} was not started")
        return self._process.pid

    @property
    def started(self) -> bool:
        return self._process is not None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def returncode(self) -> int | None:
        return None if self._process is None else self._process.poll()

    def start(self) -> ManagedProcess:
        with self.log_path.open("ab") as log_file:
            self._process = subprocess.Popen(
                self.argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=self._cwd,
                env=self._env,
                start_new_session=True,
            )
        return self

    def signal_group(self, signum: int) -> None:
        """Send `signum` to the process group (if any of it is left)."""
        if self._process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._process.pid, signum)

    def stop(self, timeout: float = STOP_TIMEOUT_SECONDS, *, kill_first: bool = False) -> bool:
        """Terminate the group (or kill it right away), wait, kill what is left; always reap.

        True when the leader outlived SIGTERM by `timeout` and SIGKILL ended it.
        """
        if self._process is None:
            return False
        escalated = False
        if self._process.poll() is None:
            self.signal_group(signal.SIGKILL if kill_first else signal.SIGTERM)
            try:
                self._process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.signal_group(signal.SIGKILL)
                escalated = True
                self._process.wait(timeout)
        # Anything the leader left behind in its group goes too.
        self.signal_group(signal.SIGKILL)
        return escalated

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)

    def check_alive(self) -> None:
        """Raise LocalStackError with the log's tail if the process has exited."""
        code = self.returncode
        if code is not None:
            raise LocalStackError(f"{self.name} exited with {code}:\n{self.log_tail()}")


def http_get(url: str, timeout: float = HTTP_TIMEOUT_SECONDS) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as response:
        body: bytes = response.read()
        return body


def wait_until_ready(
    process: ManagedProcess, url: str, timeout: float = STARTUP_TIMEOUT_SECONDS
) -> None:
    """Poll `url` until it answers 200; fail early if `process` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        process.check_alive()
        try:
            with urllib.request.urlopen(url, timeout=1.0) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.05)
    raise LocalStackError(
        f"{process.name} not ready at {url} after {timeout:g} s:\n{process.log_tail()}"
    )
