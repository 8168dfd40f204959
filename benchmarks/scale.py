"""Exporter scale: CPU per poll, and how many targets one exporter process keeps on schedule.

The targets are lightweight aiohttp servers in a separate process (`benchmarks.targets`), each
on its own port and returning the same real vLLM payload, so the exporter's own CPU is measured
alone. The real `ExporterService` polls N of them at a shortened interval; the fraction of
polls on schedule and the CPU per poll are measured; 15 s capacity is extrapolated from the
CPU per poll.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from benchmarks.common import REAL_METRICS, VLLM_PAYLOAD, Section, fmt_seconds, real_payload
from stallwatch import USER_AGENT
from stallwatch.common.exporter_config import ExporterConfig, IdleTestRequestConfig, TargetConfig
from stallwatch.exporter.service import ExporterService

SHIPPED_INTERVAL = 15.0
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, from /proc (Linux)."""
    with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


@dataclass(frozen=True)
class ScaleRun:
    targets: int
    interval: float
    seconds: float
    polls: int
    expected_polls: int
    exporter_cpu: float
    servers_cpu: float
    errors: int

    @property
    def on_schedule(self) -> float:
        return min(1.0, self.polls / self.expected_polls) if self.expected_polls else 0.0

    @property
    def cpu_per_poll(self) -> float:
        return self.exporter_cpu / self.polls if self.polls else float("nan")


class TargetServers:
    """The `benchmarks.targets` subprocess."""

    def __init__(self, count: int, *, moving: bool = False, payload: Path | None = None) -> None:
        """`count` servers of `payload` (the real vLLM one by default); `moving`: its counters
        advance at every answer, as a healthy busy server's do."""
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "benchmarks.targets",
                str(count),
                str(payload or REAL_METRICS / VLLM_PAYLOAD),
                *(["--moving"] if moving else []),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        if not line:
            self.stop()
            raise RuntimeError("the target servers did not start")
        self.ports: list[int] = json.loads(line)["ports"]

    def cpu(self) -> float:
        return process_cpu_seconds(self.process.pid)

    def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


async def measure(servers: TargetServers, count: int, interval: float, seconds: float) -> ScaleRun:
    targets = tuple(
        TargetConfig(
            name=f"gpu-{index}",
            url=f"http://127.0.0.1:{port}",
            interval_seconds=interval,
            timeout_seconds=min(5.0, interval),
            test_request=IdleTestRequestConfig(enabled=False),
        )
        for index, port in enumerate(servers.ports[:count])
    )
    config = ExporterConfig(targets=targets)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=4)
    async with aiohttp.ClientSession(
        connector=connector, headers={"User-Agent": USER_AGENT}
    ) as session:
        service = ExporterService(config, session)
        service.start()
        await asyncio.sleep(interval * 2)  # warm up: connections open, first polls done
        polls_before = sum(h.polls for h in service.histories.values())
        errors_before = sum(sum(h.poll_errors.values()) for h in service.histories.values())
        cpu_before, servers_before = time.process_time(), servers.cpu()
        started = time.monotonic()
        await asyncio.sleep(seconds)
        elapsed = time.monotonic() - started
        cpu = time.process_time() - cpu_before
        servers_cpu = servers.cpu() - servers_before
        polls = sum(h.polls for h in service.histories.values()) - polls_before
        errors = (
            sum(sum(h.poll_errors.values()) for h in service.histories.values()) - errors_before
        )
        await service.stop()
    return ScaleRun(
        targets=count,
        interval=interval,
        seconds=elapsed,
        polls=polls,
        expected_polls=round(count * elapsed / interval),
        exporter_cpu=cpu,
        servers_cpu=servers_cpu,
        errors=errors,
    )


async def _run_all(counts: list[int], interval: float, seconds: float) -> list[ScaleRun]:
    servers = await asyncio.to_thread(TargetServers, max(counts))
    try:
        return [await measure(servers, count, interval, seconds) for count in counts]
    finally:
        await asyncio.to_thread(servers.stop)


def run(quick: bool) -> Section:
    real_payload()  # fail early, with the path, if the fixtures are missing
    counts = [10, 40] if quick else [50, 200, 500, 1000]
    interval = 1.0
    seconds = 2.0 if quick else 10.0
    runs = asyncio.run(_run_all(counts, interval, seconds))
    rows = []
    for result in runs:
        rows.append(
            [
                str(result.targets),
                f"{result.interval:g} s",
                f"{result.polls:,} / {result.expected_polls:,}",
                f"{result.on_schedule:.1%}",
                f"{result.exporter_cpu / result.seconds:.0%}",
                f"{result.servers_cpu / result.seconds:.0%}",
                fmt_seconds(result.cpu_per_poll),
                str(result.errors),
            ]
        )
    on_time = [r for r in runs if r.on_schedule >= 0.99 and r.errors == 0]
    basis = on_time[-1] if on_time else runs[0]
    per_poll = basis.cpu_per_poll
    capacity = SHIPPED_INTERVAL / per_poll
    figures = {
        "runs": [
            r.__dict__ | {"on_schedule": r.on_schedule, "cpu_per_poll": r.cpu_per_poll}
            for r in runs
        ],
        "cpu_per_poll_seconds": per_poll,
        "targets_per_core_at_15s": capacity,
    }
    return Section(
        title="Exporter scale: CPU per poll and targets on schedule",
        command="python -m benchmarks --only scale",
        headers=[
            "targets",
            "interval",
            "polls done / due",
            "on schedule",
            "exporter CPU (of one core)",
            "target servers CPU",
            "exporter CPU per poll",
            "poll errors",
        ],
        rows=rows,
        method=[
            "The real `ExporterService` (one `aiohttp.ClientSession`, the exporter's connector "
            "settings) polls N targets at a 1 s interval, test requests off. Each target is its "
            "own port on a separate process of lightweight aiohttp servers that all return the "
            "captured real vLLM payload (51 KiB), so the exporter's CPU is measured alone.",
            "On schedule = polls done / polls due (targets x window ÷ interval) over the "
            f"measurement window ({seconds:g} s after a 2-interval warm-up). Exporter CPU is "
            "this process's user+system time; the servers' is read from /proc.",
            f"Extrapolation to the shipped 15 s interval: with {fmt_seconds(per_poll)} of CPU per "
            f"poll (measured at {basis.targets} targets), one core keeps about "
            f"**{capacity:,.0f} targets** on schedule at 15 s (100% of the core; "
            f"~{capacity / 2:,.0f} keeping half of it free).",
        ],
        figures=figures,
    )
