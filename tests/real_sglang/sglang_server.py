"""A real SGLang server process for the tests: start, stop, freeze its scheduler, requests."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from stallwatch.localstack.processes import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = REPO_ROOT / "scripts" / "real_sglang.py"
# Seen 14-40 s to ready on a shared 2-core machine; room for one twice as slow and busy.
START_TIMEOUT_S = 180.0
READY_LINE = "The server is fired up and ready to roll"
SCHEDULER_TITLE = b"sglang::scheduler"
STOP_TIMEOUT_S = 20.0
# The idle Python-frontend scheduler busy-polls a core; this stops it where that is not under test.
SLEEP_ON_IDLE = ("--sleep-on-idle",)
RUST_FRONTEND = {"SGLANG_RUST_SERVER": "1"}
FIRST_WORD_ID = 3
QUIET_POLLS = 120


def word_prompt(words: int) -> str:
    """A prompt of exactly `words` tokens with the tiny model's word-level vocabulary."""
    return " ".join(f"w{FIRST_WORD_ID + index % 1000}" for index in range(words))


async def generate(
    session: aiohttp.ClientSession, base_url: str, prompt_words: int, max_new_tokens: int
) -> dict[str, Any]:
    """One native /generate of exactly `max_new_tokens` tokens (EOS ignored); asserts a 200."""
    body = {
        "text": word_prompt(prompt_words),
        "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True},
    }
    async with session.post(base_url + "/generate", json=body) as response:
        answer: dict[str, Any] = await response.json(content_type=None)
        if response.status != 200:
            raise AssertionError(f"/generate answered {response.status}: {answer}")
        return answer


async def metrics_text(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(base_url + "/metrics") as response:
        if response.status != 200:
            raise AssertionError(f"/metrics answered {response.status}")
        return await response.text()


def samples(text: str, name: str) -> list[tuple[str, float]]:
    """(label text, value) of every sample of `name` in an exposition `text`."""
    found = []
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, _, value = line.rpartition(" ")
            found.append((head[len(name) :], float(value)))
    return found


def total(text: str, name: str, containing: str = "") -> float | None:
    """The sum of `name`'s samples whose labels contain `containing`; None without any."""
    values = [value for labels, value in samples(text, name) if containing in labels]
    return sum(values) if values else None


async def wait_until_quiet(session: aiohttp.ClientSession, url: str) -> None:
    """Until the server has dropped every cancelled request (SGLang notices a closed connection
    within seconds): its scheduler idles, and nothing is in flight at its HTTP layer."""
    idle = "sglang:scheduler_idle_seconds_total"
    last: float | None = None
    for _ in range(QUIET_POLLS):
        text = await metrics_text(session, url)
        in_flight = total(text, "sglang:http_requests_active", '"/generate"') or 0.0
        now = total(text, idle)
        if in_flight == 0 and last is not None and now is not None and now > last:
            return
        last = now
        await asyncio.sleep(1.0)
    raise AssertionError(f"the server never went quiet: {idle} {last}")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # The second field (the command) is in parentheses and may hold spaces.
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        if parent == pid:
            found.append(int(entry.name))
    return found


class RealSglangServer:
    """One `scripts/real_sglang.py serve` process (the SGLang server itself, by exec)."""

    def __init__(
        self,
        log_dir: Path,
        extra_args: Sequence[str] = SLEEP_ON_IDLE,
        environment: Mapping[str, str] | None = None,
    ) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.extra_args = tuple(extra_args)
        self.environment = dict(environment or {})
        self.log_path = log_dir / f"sglang-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def launch(self) -> None:
        """Start the server and return at once (it loads for tens of seconds)."""
        self.log_offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        with self.log_path.open("ab") as log:
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
                env={**os.environ, **self.environment},
                start_new_session=True,
            )
        self.starts += 1

    def wait_ready(self) -> None:
        """Until SGLang says it is ready (after its own warm-up request) and /v1/models answers."""
        assert self.process is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"sglang exited with {self.process.returncode}; log {self.log_path}:\n"
                    + self.log_tail()
                )
            if READY_LINE in self._log_since_launch():
                try:
                    with urllib.request.urlopen(self.base_url + "/v1/models", timeout=5) as answer:
                        if answer.status == 200:
                            return
                except (urllib.error.URLError, OSError):
                    pass
            time.sleep(0.2)
        raise AssertionError(f"sglang not ready in {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def start(self) -> None:
        self.launch()
        self.wait_ready()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
            # A stopped scheduler cannot act on SIGTERM.
            self._signal_group(signal.SIGCONT, pgid=process.pid)
            process.terminate()
            try:
                process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(STOP_TIMEOUT_S)
        # The scheduler and detokenizer are in the server's own session: none may outlive it.
        self._signal_group(signal.SIGKILL, pgid=process.pid)

    @staticmethod
    def _signal_group(sig: signal.Signals, *, pgid: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def restart(self) -> None:
        """Stop the process and launch a new one on the same port (not waiting for it)."""
        self.stop()
        self.launch()

    def scheduler_pid(self) -> int:
        assert self.process is not None
        for child in _children(self.process.pid):
            try:
                cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(SCHEDULER_TITLE):
                return child
        raise AssertionError(f"no {SCHEDULER_TITLE.decode()} child of {self.process.pid}")

    def freeze_scheduler(self) -> None:
        os.kill(self.scheduler_pid(), signal.SIGSTOP)

    def resume_scheduler(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.scheduler_pid(), signal.SIGCONT)

    def _log_since_launch(self) -> str:
        try:
            with self.log_path.open("rb") as log:
                log.seek(self.log_offset)
                return log.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 60) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
