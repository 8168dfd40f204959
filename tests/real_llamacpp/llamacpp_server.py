"""A real llama-server process for the tests: start, stop, SIGSTOP/SIGCONT, restart, requests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp

from stallwatch.localstack.processes import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
SETUP_SCRIPT = REPO_ROOT / "scripts" / "real_llamacpp.py"
START_TIMEOUT_S = 60.0
# A prompt is one token per character with the tiny model; a small logical batch keeps every
# llama_decode call (one chunk of a prompt) well under the exporter's interval.
BATCH_ARGS = ("-b", "128", "-ub", "128")
# llama.cpp's own form of logit_bias: these token ids are never sampled. The model already types
# the bytes 0x80-0xFF as control tokens; banning them too keeps every answer valid UTF-8.
HIGH_BYTE_BIAS = [[token, False] for token in range(3 + 0x80, 3 + 0x100)]
WORDS = ("the", "of", "and", "to", "in", "is", "that", "it", "for", "was")


def prompt_of(chars: int) -> str:
    """A prompt of about `chars` tokens (one per character, with this model)."""
    text = ""
    index = 0
    while len(text) < chars:
        text += WORDS[index % len(WORDS)] + " "
        index += 1
    return text[:chars]


async def complete(
    session: aiohttp.ClientSession, base_url: str, prompt_chars: int, n_predict: int
) -> dict[str, Any]:
    """One native /completion of exactly `n_predict` tokens (EOS ignored); asserts a 200."""
    body = {
        "prompt": prompt_of(prompt_chars),
        "n_predict": n_predict,
        "ignore_eos": True,
        "logit_bias": HIGH_BYTE_BIAS,
    }
    async with session.post(base_url + "/completion", json=body) as response:
        answer: dict[str, Any] = await response.json(content_type=None)
        if response.status != 200:
            raise AssertionError(f"/completion answered {response.status}: {answer}")
        return answer


async def metrics_text(session: aiohttp.ClientSession, base_url: str) -> str:
    async with session.get(base_url + "/metrics") as response:
        if response.status != 200:
            raise AssertionError(f"/metrics answered {response.status}")
        return await response.text()


def metric_value(text: str, name: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split(" ", 1)[1])
    return None


class RealLlamaServer:
    """One `scripts/real_llamacpp.py serve` process (the llama-server itself, by exec)."""

    def __init__(self, log_dir: Path, extra_args: tuple[str, ...] = BATCH_ARGS) -> None:
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.extra_args = extra_args
        self.log_path = log_dir / f"llama-server-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
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
            )
        self.starts += 1
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(
                    f"llama-server exited with {self.process.returncode}; log {self.log_path}:\n"
                    + self.log_tail()
                )
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as answer:
                    if answer.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.1)
        raise AssertionError(f"llama-server not healthy in {START_TIMEOUT_S} s:\n{self.log_tail()}")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)

    def restart(self) -> None:
        """Stop the process and start a new one on the same port."""
        self.stop()
        self.start()

    def sigstop(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def sigcont(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.kill(self.process.pid, signal.SIGCONT)

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])
