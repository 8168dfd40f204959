"""Helpers to run the simulator from tests, the demo and benchmarks.

In-process (fast, direct access to the engines)::

    async with running_simulator(SimConfig(max_num_seqs=2)) as sim:
        sim.url          # "http://127.0.0.1:PORT"
        sim.engine       # engine 0 (simulator.engine.Engine)
        sim.apply_fault("hang")

As a real process (`python -m stallwatch.simulator --port 0 ARGS...`, the same as `stallwatch sim`),
e.g. to be killed or restarted::

    with simulator_process(["--max-num-seqs", "2"]) as proc:
        proc.url
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.simulator.config import SimConfig
from stallwatch.simulator.engine import Engine
from stallwatch.simulator.server import SimServer

LISTENING_PREFIX = "listening on "


@dataclass
class SimHandle:
    """A simulator running in this process."""

    server: SimServer
    url: str

    @property
    def engine(self) -> Engine:
        """Engine 0 (the only one unless data_parallel_size > 1)."""
        return self.server.engines[0]

    @property
    def engines(self) -> list[Engine]:
        return self.server.engines

    def apply_fault(self, fault: str, **options: Any) -> str:
        """Same as `POST /sim/fault {"fault": fault, **options}`."""
        return self.server.apply_fault(fault, options)

    def stats(self) -> dict[str, Any]:
        """Same document as `GET /sim/stats`."""
        return self.server.stats()


@contextlib.asynccontextmanager
async def running_simulator(
    config: SimConfig | None = None, **overrides: Any
) -> AsyncIterator[SimHandle]:
    """Run a simulator on 127.0.0.1 (random port) for the duration of the block.

    `overrides` replace fields of `config` (default `SimConfig()`), e.g.
    `running_simulator(tokens_per_second=50, max_num_seqs=2)`.
    """
    base = config if config is not None else SimConfig()
    server = SimServer(dataclasses.replace(base, **overrides))
    url = await server.start("127.0.0.1", 0)
    try:
        yield SimHandle(server, url)
    finally:
        await server.stop()


@dataclass
class SimProcess:
    """A `stallwatch sim` subprocess and the URL it printed."""

    process: subprocess.Popen[str]
    url: str

    def stop(self, timeout: float = 5.0) -> None:
        """Terminate the process (kill it if it does not exit in time)."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout)
        if self.process.stdout is not None:
            self.process.stdout.close()


def start_simulator_process(args: Sequence[str] = (), timeout: float = 20.0) -> SimProcess:
    """Start `stallwatch sim --port 0 ARGS` (`python -m stallwatch.simulator`); wait for its URL."""
    command = [sys.executable, "-m", "stallwatch.simulator", "--port", "0", *args]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    first_line: list[str] = []
    reader = threading.Thread(
        target=lambda: first_line.append(process.stdout.readline() if process.stdout else ""),
        daemon=True,
    )
    reader.start()
    reader.join(timeout)
    line = first_line[0].strip() if first_line else ""
    if not line.startswith(LISTENING_PREFIX):
        process.kill()
        process.wait()
        raise RuntimeError(f"the simulator did not start (first line: {line!r})")
    return SimProcess(process, line.removeprefix(LISTENING_PREFIX))


@contextlib.contextmanager
def simulator_process(args: Sequence[str] = (), timeout: float = 20.0) -> Iterator[SimProcess]:
    """`start_simulator_process` as a context manager that always stops the process."""
    proc = start_simulator_process(args, timeout)
    try:
        yield proc
    finally:
        proc.stop()


def parse_samples(text: str) -> dict[str, float]:
    """A `/metrics` body as `{"name{k=v,...}": value}` (labels sorted, no quotes)."""
    result: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            result[f"{sample.name}{{{labels}}}"] = sample.value
    return result


def engine_sample(name: str, engine: str = "0", model: str = "tiny") -> str:
    """The `parse_samples` key of an engine series: `engine_sample("vllm:prompt_tokens_total")`."""
    return f"{name}{{engine={engine},model_name={model}}}"


async def read_metrics(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """GET url/metrics and parse it with `parse_samples` (asserts a 200)."""
    async with session.get(url.rstrip("/") + "/metrics") as response:
        if response.status != 200:
            raise AssertionError(f"/metrics answered {response.status}")
        return parse_samples(await response.text())
