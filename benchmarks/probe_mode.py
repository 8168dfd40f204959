"""`/probe` mode at the shipped 15 s interval: targets one exporter keeps on schedule, memory
per target, and a cached answer against a real read.

The exporter runs as its own process (`stallwatch exporter`), so its CPU and memory are its
own. The servers are lightweight aiohttp servers on their own ports in another process
(`benchmarks.targets`), returning the captured real vLLM payload. This process plays
Prometheus: it scrapes `/probe` for every server once per 15 s, the scrapes spread evenly over
the interval, as Prometheus spreads its targets.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from benchmarks.common import (
    Section,
    baseline_tree,
    exporter_child,
    fmt_seconds,
    git_describe,
    median,
    percentile,
    real_payload,
)
from benchmarks.scale import TargetServers, process_cpu_seconds

INTERVAL = 15.0
SCRAPE_TIMEOUT = 10.0
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * PAGE_SIZE


@contextlib.contextmanager
def exporter_process(
    workdir: Path, source: Path | None = None, workers: int = 1, arguments: Sequence[str] = ()
) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """`stallwatch exporter` as a child process: this checkout's code, or `source`'s, with
    `workers` worker processes and more `arguments`."""
    port = free_port()
    # The modules share the 10,000 targets /probe remembers; the measured one takes nearly all.
    modules = {
        "vllm": {
            "allow": ["127.0.0.1"],
            "interval": f"{INTERVAL:g}s",
            "timeout": "5s",
            "max_targets": 9_800,
        },
        "cached": {"allow": ["127.0.0.1"], "interval": "1h", "timeout": "5s", "max_targets": 100},
        "fresh": {
            "allow": ["127.0.0.1"],
            "interval": "50ms",
            "timeout": "50ms",
            "max_targets": 100,
        },
    }
    config = {"listen": f"127.0.0.1:{port}", "modules": modules}
    with exporter_child(config, workdir, source, workers, arguments) as running:
        yield running


async def exporter_counter(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(url + "/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise RuntimeError(f"{name} not on the exporter's /metrics")


@dataclass(frozen=True)
class ScheduleRun:
    targets: int
    seconds: float
    reads: int
    reads_due: int
    scrapes: int
    failed_scrapes: int
    p99_scrape_seconds: float
    exporter_cpu: float
    scraper_cpu: float
    servers_cpu: float
    load_average: float
    rss_per_target: float

    @property
    def on_schedule(self) -> float:
        return min(1.0, self.reads / self.reads_due) if self.reads_due else 0.0


def stallwatch_params(port: int) -> dict[str, str]:
    """`stallwatch exporter`'s `/probe` query for the server on `port`, module `vllm`."""
    return {"target": f"127.0.0.1:{port}", "module": "vllm"}


@contextlib.asynccontextmanager
async def scraping(
    session: aiohttp.ClientSession,
    url: str,
    ports: list[int],
    durations: list[float],
    params: Callable[[int], dict[str, str]] = stallwatch_params,
    succeeded: Callable[[bytes], bool] | None = None,
    headers: dict[str, str] | None = None,
) -> AsyncIterator[list[int]]:
    """Scrape every port's `/probe` (query `params(port)`) once per interval, phases spread;
    yields [failures]: timeouts, errors, non-200 answers and, with `succeeded`, 200 answers
    whose body it rejects."""
    failures = [0]
    stop = asyncio.Event()

    async def scrape_forever(port: int, offset: float) -> None:
        await asyncio.sleep(offset)
        loop = asyncio.get_running_loop()
        next_at = loop.time()
        query = params(port)
        while not stop.is_set():
            started = loop.time()
            try:
                async with session.get(
                    url + "/probe",
                    params=query,
                    headers=headers,
                    timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT),
                ) as response:
                    body = await response.read()
                    if response.status != 200 or (succeeded is not None and not succeeded(body)):
                        failures[0] += 1
            except (TimeoutError, aiohttp.ClientError):
                failures[0] += 1
            durations.append(loop.time() - started)
            next_at += INTERVAL
            await asyncio.sleep(max(0.0, next_at - loop.time()))

    tasks = [
        asyncio.create_task(scrape_forever(port, INTERVAL * index / len(ports)))
        for index, port in enumerate(ports)
    ]
    try:
        yield failures
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def measure_schedule(
    pid: int, url: str, servers: TargetServers, count: int, window: float, base_rss: int
) -> ScheduleRun:
    ports = servers.ports[:count]
    connector = aiohttp.TCPConnector(limit=256)
    async with aiohttp.ClientSession(connector=connector) as session:
        durations: list[float] = []
        async with scraping(session, url, ports, durations) as failures:
            await asyncio.sleep(INTERVAL + 1)  # warm-up: every server read once
            reads_before = await exporter_counter(session, url, "stallwatch_probe_reads_total")
            cpu_before, failed_before = process_cpu_seconds(pid), failures[0]
            scraper_before, servers_before = time.process_time(), servers.cpu()
            scrapes_before = len(durations)
            started = time.monotonic()
            await asyncio.sleep(window)
            elapsed = time.monotonic() - started
            cpu = process_cpu_seconds(pid) - cpu_before
            scraper_cpu = time.process_time() - scraper_before
            servers_cpu = servers.cpu() - servers_before
            load_average = os.getloadavg()[0]
            reads = await exporter_counter(session, url, "stallwatch_probe_reads_total")
            failed = failures[0] - failed_before
            measured = durations[scrapes_before:]
        rss = rss_bytes(pid)
    return ScheduleRun(
        targets=len(ports),
        seconds=elapsed,
        reads=int(reads - reads_before),
        reads_due=round(len(ports) * elapsed / INTERVAL),
        scrapes=len(measured),
        failed_scrapes=failed,
        p99_scrape_seconds=percentile(measured, 0.99),
        exporter_cpu=cpu,
        scraper_cpu=scraper_cpu,
        servers_cpu=servers_cpu,
        load_average=load_average,
        rss_per_target=(rss - base_rss) / len(ports),
    )


async def cost_per_answer(
    pid: int, url: str, ports: list[int], module: str, rounds: int
) -> tuple[float, float]:
    """Exporter CPU and client-side latency per `/probe` answered under `module`."""
    async with aiohttp.ClientSession() as session:

        async def one_round() -> list[float]:
            latencies = []
            for port in ports:
                params = {"target": f"127.0.0.1:{port}", "module": module}
                started = time.perf_counter()
                async with session.get(url + "/probe", params=params) as response:
                    await response.read()
                    assert response.status == 200, await response.text()
                latencies.append(time.perf_counter() - started)
            return latencies

        await one_round()  # first reads, connections open
        cpu_before = process_cpu_seconds(pid)
        latencies = []
        for _ in range(rounds):
            latencies += await one_round()
        cpu = process_cpu_seconds(pid) - cpu_before
    return cpu / len(latencies), median(latencies)


@dataclass(frozen=True)
class VersionResult:
    """One version of the exporter's figures: per size, and a cached answer vs a real read."""

    version: str
    runs: list[ScheduleRun]
    cached: tuple[float, float]
    fresh: tuple[float, float]


async def _answer_costs(
    source: Path | None, servers: TargetServers, rounds: int, workdir: Path
) -> tuple[tuple[float, float], tuple[float, float]]:
    with exporter_process(workdir, source) as (process, url):
        sample = servers.ports[:100]
        cached = await cost_per_answer(process.pid, url, sample, "cached", rounds)
        fresh = await cost_per_answer(process.pid, url, sample, "fresh", rounds)
    return cached, fresh


async def _schedule(
    source: Path | None, servers: TargetServers, count: int, window: float, workdir: Path
) -> ScheduleRun:
    # A fresh exporter per size: its memory grows with the targets it remembers.
    with exporter_process(workdir, source) as (process, url):
        await asyncio.sleep(0.5)
        base_rss = rss_bytes(process.pid)
        return await measure_schedule(process.pid, url, servers, count, window, base_rss)


async def _run(
    counts: list[int], window: float, rounds: int, baseline: str | None
) -> list[VersionResult]:
    """Each version's figures, the versions taking turns size by size."""
    servers = await asyncio.to_thread(TargetServers, max(counts), moving=True)
    try:
        with tempfile.TemporaryDirectory() as workdir, baseline_tree(baseline) as source:
            versions: list[tuple[str, Path | None]] = [("this tree", None)]
            if baseline is not None:
                versions.insert(0, (git_describe(baseline), source))
            costs = [
                await _answer_costs(tree, servers, rounds, Path(workdir)) for _, tree in versions
            ]
            runs: list[list[ScheduleRun]] = [[] for _ in versions]
            for count in counts:
                for index, (_, tree) in enumerate(versions):
                    runs[index].append(await _schedule(tree, servers, count, window, Path(workdir)))
            return [
                VersionResult(name, version_runs, cached, fresh)
                for (name, _), version_runs, (cached, fresh) in zip(
                    versions, runs, costs, strict=True
                )
            ]
    finally:
        await asyncio.to_thread(servers.stop)


def run(quick: bool, baseline: str | None = None) -> Section:
    real_payload()
    counts = [20] if quick else [2000, 3000, 5000, 6000]
    window = 2.0 if quick else 2 * INTERVAL
    rounds = 2 if quick else 10
    results = asyncio.run(_run(counts, window, rounds, baseline))
    rows = [
        [
            result.version,
            f"{r.targets:,}",
            f"{r.reads:,} / {r.reads_due:,}",
            f"{r.on_schedule:.1%}",
            f"{r.failed_scrapes}",
            fmt_seconds(r.p99_scrape_seconds),
            f"{r.exporter_cpu / r.seconds:.0%}",
            f"{r.scraper_cpu / r.seconds:.0%} / {r.servers_cpu / r.seconds:.0%}",
            f"{r.load_average:.1f}",
            f"{r.rss_per_target / 1024:.1f} KiB",
        ]
        for r_index in range(len(counts))
        for result in results
        for r in (result.runs[r_index],)
    ]
    figures: dict[str, object] = {}
    answers = []
    for result in results:
        on_time = [r for r in result.runs if r.on_schedule >= 0.99 and r.failed_scrapes == 0]
        cached_cpu, cached_latency = result.cached
        fresh_cpu, fresh_latency = result.fresh
        figures[result.version] = {
            "runs": [r.__dict__ | {"on_schedule": r.on_schedule} for r in result.runs],
            "cached_cpu_seconds": cached_cpu,
            "cached_latency_seconds": cached_latency,
            "read_cpu_seconds": fresh_cpu,
            "read_latency_seconds": fresh_latency,
            "largest_on_schedule": on_time[-1].targets if on_time else 0,
        }
        answers.append(
            f"{result.version}: from memory **{fmt_seconds(cached_cpu)}** of exporter CPU "
            f"({fmt_seconds(cached_latency)} median latency), by reading the server "
            f"**{fmt_seconds(fresh_cpu)}** ({fmt_seconds(fresh_latency)})"
        )
    return Section(
        title="/probe mode at 15 s: targets on schedule, memory, cached answer vs real read",
        command="python -m benchmarks --only probe [--baseline REF]",
        headers=[
            "code",
            "targets",
            "reads done / due",
            "on schedule",
            "failed scrapes",
            "p99 scrape",
            "exporter CPU (of one core)",
            "Prometheus stand-in / servers CPU",
            "machine load (1 min)",
            "memory per target",
        ],
        rows=rows,
        method=[
            "The exporter runs as its own process (`stallwatch exporter`, one event loop, so "
            "one core at most) with a module at `interval: 15s`. This process plays Prometheus: "
            "it scrapes `/probe` for each server once per 15 s, the scrapes spread evenly over "
            "the interval, with a 10 s scrape timeout, over kept-alive connections. The servers "
            "are lightweight aiohttp servers, one port each, in a third process, all returning "
            "the captured real vLLM payload (51 KiB) with its step and token counters advanced "
            "at every answer (a busy server making progress), and closing a connection idle "
            "for 5 s as uvicorn and llama.cpp do: every read opens a new connection.",
            f"Measured directly at 15 s: a {INTERVAL:g} s warm-up (every server read once), "
            f"then {window:g} s. Reads done = the exporter's `stallwatch_probe_reads_total`; "
            "due = servers x window / 15 s. Exporter CPU from /proc; memory per target = the "
            "exporter's RSS growth over a fresh start / servers remembered. The machine "
            "(2 cores) is shared: the 1-minute load average at the end of each run says how "
            "much else ran; the Prometheus stand-in and the servers take CPU from the same "
            "two cores.",
            "With `--baseline REF` the same runs are made with the code at git REF (extracted "
            "to a temporary directory), the two versions taking turns at each size, so both "
            "meet the same machine.",
            f"Cached answer vs real read, on one exporter (100 servers, {rounds} rounds of "
            "sequential `/probe`s): " + "; ".join(answers) + ".",
        ],
        figures=figures,
    )
