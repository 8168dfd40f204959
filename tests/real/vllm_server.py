"""A real vLLM server as a subprocess, for the tests in tests/real.

The server runs from the separate environment that `scripts/real_vllm.py setup` builds, serves the
tiny random-weight model as `tiny` on a free loopback port, and logs to a file. Readiness is
checked through `/health` and `/v1/models` only: no completion is sent, so no slot is taken.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.localstack.processes import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = REPO_ROOT / "scripts" / "real_vllm.py"
SERVED_MODEL_NAME = "tiny"
ENGINE_CORE_MARKER = "EngineCore"
# The processes that run the model: the engine core and any executor worker.
COMPUTE_MARKERS = (ENGINE_CORE_MARKER, "VLLM::Worker")
# On a GPU host the model's arithmetic runs on the GPU, and the API server and the host's other
# processes keep their CPU; here it runs on the same two cores as the API server and the test.
# The processes that compute get this niceness, so that a saturated engine does not starve the
# API server's answers or the test's own clients (a /v1/models answer once took over 2 s and a
# test's clients were not scheduled in time to re-send, under load, CI). Idle CPU still goes to
# them: the engine runs as fast when nothing else wants the cores.
COMPUTE_NICENESS = 10
FIRST_WORD_ID = 3
VOCAB_SIZE = 1024

START_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 30.0
HTTP_TIMEOUT_S = 5.0
LOG_TAIL_LINES = 80
WARM_UP_TIMEOUT_S = 120.0
# What vLLM logs when a worker or the engine core dies under it (SIGILL on an unsupported
# instruction, an out-of-memory kill, a crash in a kernel).
WORKER_DEATH_MARKERS = ("died unexpectedly", "EngineDeadError", "Engine core initialization failed")


class RealVllmError(RuntimeError):
    """The real server did not start, or did something a test helper cannot recover from."""


def free_loopback_port() -> int:
    return free_port()


def word_prompt(word_count: int) -> str:
    """A prompt of exactly `word_count` tokens for the tiny model's word-level tokenizer."""
    span = VOCAB_SIZE - FIRST_WORD_ID
    return " ".join(f"w{FIRST_WORD_ID + index % span}" for index in range(word_count))


# --- /proc -------------------------------------------------------------------------------------


def _parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # The command name in parentheses may contain spaces; the fields after it do not.
    fields = stat.rsplit(")", 1)[1].split()
    return int(fields[1])


def process_tree(root_pid: int) -> list[int]:
    """root_pid and all its live descendants (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        parent = _parent_pid(int(entry.name))
        if parent is not None:
            children.setdefault(parent, []).append(int(entry.name))
    tree: list[int] = []
    pending = [root_pid]
    while pending:
        pid = pending.pop()
        if Path(f"/proc/{pid}").exists():
            tree.append(pid)
            pending.extend(children.get(pid, []))
    return tree


def process_title(pid: int) -> str:
    """The command line as the process shows it (vLLM retitles workers: VLLM::EngineCore)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode("utf-8", errors="replace").strip()


def _status_kib(pid: int, field: str) -> int:
    try:
        lines = Path(f"/proc/{pid}/status").read_text(encoding="utf-8").splitlines()
    except OSError:
        return 0
    for line in lines:
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def _is_stopped(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t")


# --- metrics -----------------------------------------------------------------------------------


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample called `name` (e.g. `vllm:num_requests_running`) in a /metrics payload."""
    return [
        (dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def metric_sum(text: str, name: str) -> float | None:
    """The sum of all samples called `name`, or None when there is no such sample."""
    samples = metric_samples(text, name)
    if not samples:
        return None
    return sum(value for _, value in samples)


def has_metric(text: str, name: str) -> bool:
    return bool(metric_samples(text, name))


async def fetch_metrics(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(f"{base_url}/metrics") as response:
        response.raise_for_status()
        return await response.text()


async def complete(
    session: aiohttp.ClientSession,
    base_url: str,
    prompt: str,
    max_tokens: int,
    *,
    ignore_eos: bool = True,
    timeout_s: float = 600.0,
) -> dict[str, Any]:
    """One /v1/completions request (greedy); returns the decoded JSON answer."""
    payload = {
        "model": SERVED_MODEL_NAME,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "ignore_eos": ignore_eos,
    }
    async with session.post(
        f"{base_url}/v1/completions",
        json=payload,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    ) as response:
        response.raise_for_status()
        answer: dict[str, Any] = await response.json()
        return answer


async def wait_for_metric(
    session: aiohttp.ClientSession,
    base_url: str,
    name: str,
    predicate: Any,
    *,
    timeout_s: float = 120.0,
    interval_s: float = 0.2,
) -> str:
    """Polls /metrics until predicate(metric_sum(payload, name)) holds; returns that payload."""
    deadline = time.monotonic() + timeout_s
    last: float | None = None
    while time.monotonic() < deadline:
        text = await fetch_metrics(session, base_url)
        last = metric_sum(text, name)
        if predicate(last):
            return text
        await asyncio.sleep(interval_s)
    raise AssertionError(f"{name} never satisfied the condition in {timeout_s} s (last: {last})")


# --- the server --------------------------------------------------------------------------------


class RealVllmServer:
    """A real vLLM OpenAI-compatible server on 127.0.0.1, in its own process group."""

    def __init__(
        self,
        log_dir: Path,
        extra_args: Sequence[str] = (),
        *,
        port: int | None = None,
        name: str = "vllm",
    ) -> None:
        self.extra_args = tuple(extra_args)
        self.port = port if port is not None else free_loopback_port()
        self.name = name
        self.log_dir = log_dir
        self.log_path = log_dir / f"{name}-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.last_start_seconds: float | None = None
        self._log_offset = 0
        self._engine_killed_on_purpose = False

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        if self.process is None:
            raise RealVllmError(f"{self.name} is not started")
        return self.process.pid

    # lifecycle

    def start(self, timeout_s: float = START_TIMEOUT_S, *, warm_up: bool = False) -> float:
        """Starts the server, waits until /health and /v1/models answer; returns the seconds.

        With `warm_up`, one short completion must also answer: a worker that dies at its first
        request (an instruction the CPU lacks) fails here, with the log, not in a later test.
        """
        if self.process is not None and self.process.poll() is None:
            raise RealVllmError(f"{self.name} is already running (pid {self.process.pid})")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self._engine_killed_on_purpose = False
        self._log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        started = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"\n===== start #{self.starts}: {self.describe()}\n".encode())
            log.flush()
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    str(SETUP_SCRIPT),
                    "serve",
                    "--port",
                    str(self.port),
                    *self.extra_args,
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=REPO_ROOT,
            )
        try:
            self._wait_ready(started + timeout_s)
            if warm_up:
                self._warm_up()
            self.raise_if_worker_died()
            self._deprioritise_compute()
        except BaseException:
            self.stop()
            raise
        self.last_start_seconds = time.monotonic() - started
        self._log(f"ready after {self.last_start_seconds:.1f} s")
        return self.last_start_seconds

    def stop(self, timeout_s: float = STOP_TIMEOUT_S) -> None:
        """Terminates the whole process group and any descendant left; waits for all of them."""
        process = self.process
        if process is None:
            return
        leftovers = set(process_tree(process.pid))
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
            # A stopped engine core cannot handle SIGTERM until it runs again.
            os.killpg(process.pid, signal.SIGCONT)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self._log(f"no exit {timeout_s} s after SIGTERM: SIGKILL")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            leftovers = {pid for pid in leftovers | set(process_tree(process.pid)) if _alive(pid)}
            if not leftovers and process.poll() is not None:
                break
            time.sleep(0.2)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        process.wait(timeout=timeout_s)
        self._log(f"stopped (exit code {process.returncode})")
        self.process = None

    def restart(self, timeout_s: float = START_TIMEOUT_S) -> float:
        """Stops the server and starts it again on the same port; returns the seconds to ready."""
        self.stop()
        return self.start(timeout_s)

    def is_alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def recover(self) -> None:
        """Undoes what a test may have done: resumes stopped processes, restarts a dead server."""
        if self.process is not None:
            for pid in process_tree(self.process.pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        if not self.is_alive() or not self._healthy():
            self._log("recovering: restart")
            self.restart()

    # the engine core

    def _deprioritise_compute(self) -> None:
        """COMPUTE_NICENESS for every thread of the processes that run the model (Linux keeps a
        niceness per thread; threads they start later inherit it), and for the server's session
        as a whole where the kernel groups sessions (autogroup): between sessions only the
        group's niceness counts, so without it the test's own process would still wait for CPU
        behind the model (run-queue waits of up to 2.2 s, measured)."""
        with contextlib.suppress(OSError):
            Path(f"/proc/{self.pid}/autogroup").write_text(f"{COMPUTE_NICENESS}\n")
        for pid in self._descendants_titled(*COMPUTE_MARKERS):
            with contextlib.suppress(OSError):
                for thread in Path(f"/proc/{pid}/task").iterdir():
                    with contextlib.suppress(OSError):
                        os.setpriority(os.PRIO_PROCESS, int(thread.name), COMPUTE_NICENESS)

    def _descendants_titled(self, *markers: str) -> list[int]:
        """The server's processes whose title holds any of `markers`."""
        return [
            pid
            for pid in process_tree(self.pid)
            if any(marker in process_title(pid) for marker in markers)
        ]

    def engine_core_pids(self) -> list[int]:
        return self._descendants_titled(ENGINE_CORE_MARKER)

    def engine_core_pid(self) -> int:
        """The pid of the single `VLLM::EngineCore` process (a descendant of the server)."""
        pids = self.engine_core_pids()
        if len(pids) != 1:
            titles = {pid: process_title(pid) for pid in process_tree(self.pid)}
            raise RealVllmError(f"expected one {ENGINE_CORE_MARKER} process, found {titles}")
        return pids[0]

    def sigstop_engine(self) -> int:
        """Freezes the engine core (a hung engine); returns its pid."""
        return self._signal_engine(signal.SIGSTOP)

    def sigcont_engine(self) -> int:
        return self._signal_engine(signal.SIGCONT)

    def sigkill_engine(self) -> int:
        """Kills the engine core; the API server notices and exits within seconds."""
        self._engine_killed_on_purpose = True
        return self._signal_engine(signal.SIGKILL)

    def worker_death(self) -> str | None:
        """The log line saying a worker or the engine core died since the last start, if any.

        A death the test caused itself (`sigkill_engine`) is not reported.
        """
        if self._engine_killed_on_purpose:
            return None
        try:
            with self.log_path.open("rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode("utf-8", errors="replace")
        except OSError:
            return None
        for line in text.splitlines():
            if any(marker in line for marker in WORKER_DEATH_MARKERS):
                return line.strip()
        return None

    def raise_if_worker_died(self) -> None:
        death = self.worker_death()
        if death is not None:
            raise RealVllmError(
                f"{self.describe()}: a worker died ({death}); log {self.log_path}:\n"
                f"{self.log_tail()}"
            )

    def engine_is_stopped(self) -> bool:
        return _is_stopped(self.engine_core_pid())

    def wait_exit(self, timeout_s: float) -> int | None:
        """Waits for the server's main process to exit; its exit code, or None if it did not."""
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            return None

    # HTTP (blocking, for lifecycle; tests use aiohttp)

    def metrics_text(self) -> str:
        status, body = _http_get(f"{self.base_url}/metrics")
        if status != 200:
            raise RealVllmError(f"GET /metrics answered {status}")
        return body

    # resources

    def tree_rss_bytes(self) -> int:
        """Resident memory of the server's whole process tree now."""
        return sum(_status_kib(pid, "VmRSS") for pid in process_tree(self.pid)) * 1024

    def tree_peak_rss_bytes(self) -> int:
        """Sum of each live process's own peak resident memory (>= the tree's peak)."""
        return sum(_status_kib(pid, "VmHWM") for pid in process_tree(self.pid)) * 1024

    def describe(self) -> str:
        return f"{self.name} on port {self.port} with extra args {list(self.extra_args)}"

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    # internals

    def _signal_engine(self, signum: signal.Signals) -> int:
        pid = self.engine_core_pid()
        os.kill(pid, signum)
        self._log(f"sent {signum.name} to engine core {pid}")
        return pid

    def _healthy(self) -> bool:
        return _http_get(f"{self.base_url}/health")[0] == 200

    def _wait_ready(self, deadline: float) -> None:
        assert self.process is not None
        for path, ready in (("/health", _is_ok), ("/v1/models", _lists_served_model)):
            while True:
                if self.process.poll() is not None:
                    raise RealVllmError(
                        f"{self.describe()} exited with code {self.process.returncode} before "
                        f"{path} answered; log {self.log_path}:\n{self.log_tail()}"
                    )
                status, body = _http_get(f"{self.base_url}{path}")
                if ready(status, body):
                    break
                if time.monotonic() > deadline:
                    raise RealVllmError(
                        f"{self.describe()}: {path} not ready in time (last status {status}); "
                        f"log {self.log_path}:\n{self.log_tail()}"
                    )
                time.sleep(0.5)

    def _warm_up(self) -> None:
        payload = json.dumps(
            {"model": SERVED_MODEL_NAME, "prompt": word_prompt(4), "max_tokens": 2}
        ).encode()
        request = urllib.request.Request(
            f"{self.base_url}/v1/completions",
            data=payload,
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=WARM_UP_TIMEOUT_S) as response:
                response.read()
        except (OSError, ValueError) as error:
            raise RealVllmError(
                f"{self.describe()}: the warm-up completion failed ({error}); "
                f"log {self.log_path}:\n{self.log_tail()}"
            ) from error

    def _log(self, message: str) -> None:
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(f"===== {time.strftime('%H:%M:%S')} {message}\n")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def _http_get(url: str) -> tuple[int, str]:
    """(status, body); status 0 when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return response.status, response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, ""
    except (OSError, ValueError):
        return 0, ""


def _is_ok(status: int, _body: str) -> bool:
    return status == 200


def _lists_served_model(status: int, body: str) -> bool:
    return status == 200 and f'"{SERVED_MODEL_NAME}"' in body


def stop_all(servers: Iterable[RealVllmServer]) -> None:
    for server in servers:
        server.stop()


# What the `real_vllm_factory` fixture gives: factory(*extra_args, name=...) -> a started server.
RealVllmFactory = Callable[..., RealVllmServer]
