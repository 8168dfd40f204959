"""Beside blackbox_exporter: the same servers, the same scrape plan, three `/probe` exporters.

Each exporter runs as its own process, one after another on the same target servers
(`benchmarks.targets`, the captured real vLLM payload), scraped by this process as
Prometheus would (`probe_mode.scraping`: every server once per 15 s, phases spread, 10 s scrape
timeout):

- `stallwatch exporter`, module `vllm` (reads, parses and judges the payload, remembers the
  target);
- Debian's `prometheus-blackbox-exporter` (0.23), module `http_2xx` (reads the whole body) and
  a module that also matches a regular expression on the body;
- `benchmarks.bare_exporter`: an aiohttp server that reads the body with one shared session and
  answers a constant, the cost any aiohttp exporter pays for the same reads.

The exporter's CPU and memory are read from /proc (the process and its live children).
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from benchmarks.common import (
    Section,
    fmt_seconds,
    percentile,
    real_payload,
)
from benchmarks.peer_exporters import BLACKBOX, BODY_REGEX, PEERS, WORKERS, Peer
from benchmarks.probe_mode import (
    INTERVAL,
    SCRAPE_TIMEOUT,
    exporter_counter,
    scraping,
)
from benchmarks.process_tree import tree_cpu_seconds, tree_rss_bytes
from benchmarks.scale import TargetServers

# Prometheus tells an exporter its scrape timeout; blackbox_exporter bounds its probe by it.
SCRAPE_HEADERS = {"X-Prometheus-Scrape-Timeout-Seconds": f"{SCRAPE_TIMEOUT:g}"}
LOAD_SAMPLE_SECONDS = 5.0
# Each exporter runs this many times at each size (a window each), in `round_order`.
ROUNDS = 2


@dataclass(frozen=True)
class PeerRun:
    """One exporter's figures at one size."""

    peer: str
    targets: int
    seconds: float
    scrapes_due: int
    scrapes: int
    failed_scrapes: int
    reads: int
    p50_scrape_seconds: float
    p99_scrape_seconds: float
    exporter_cpu: float
    scraper_cpu: float
    servers_cpu: float
    rss_bytes: int
    load_mean: float
    load_max: float
    # Each round's CPU per read, when this run pools several (`pooled`).
    rounds_cpu_per_read: tuple[float, ...] = ()

    @property
    def cpu_per_read(self) -> float:
        return self.exporter_cpu / self.reads if self.reads else float("nan")


def pooled(runs: list[PeerRun]) -> PeerRun:
    """One exporter's rounds at one size as one run: counts, CPU and time summed (CPU per read
    is the rounds' CPU over their reads), the worst round's p99, RSS and load peak, the median
    round's p50, the load's mean weighted by time."""
    if not runs or len({(run.peer, run.targets) for run in runs}) != 1:
        raise ValueError("pooled() takes the rounds of one exporter at one size")
    seconds = sum(run.seconds for run in runs)
    return PeerRun(
        peer=runs[0].peer,
        targets=runs[0].targets,
        seconds=seconds,
        scrapes_due=sum(run.scrapes_due for run in runs),
        scrapes=sum(run.scrapes for run in runs),
        failed_scrapes=sum(run.failed_scrapes for run in runs),
        reads=sum(run.reads for run in runs),
        p50_scrape_seconds=percentile([run.p50_scrape_seconds for run in runs], 0.5),
        p99_scrape_seconds=max(run.p99_scrape_seconds for run in runs),
        exporter_cpu=sum(run.exporter_cpu for run in runs),
        scraper_cpu=sum(run.scraper_cpu for run in runs),
        servers_cpu=sum(run.servers_cpu for run in runs),
        rss_bytes=max(run.rss_bytes for run in runs),
        load_mean=sum(run.load_mean * run.seconds for run in runs) / seconds,
        load_max=max(run.load_max for run in runs),
        rounds_cpu_per_read=tuple(run.cpu_per_read for run in runs),
    )


async def measure(
    peer: Peer, servers: TargetServers, count: int, warmup: float, window: float, workdir: Path
) -> PeerRun:
    """Start `peer`'s exporter, scrape `count` servers through it, measure `window` seconds
    after `warmup`."""
    ports = servers.ports[:count]
    with peer.start(workdir) as (process, url):
        connector = aiohttp.TCPConnector(limit=256)
        async with aiohttp.ClientSession(connector=connector) as session:

            async def reads_so_far(succeeded: int) -> int:
                if peer.reads_counter is None:
                    return succeeded
                return int(await exporter_counter(session, url, peer.reads_counter))

            durations: list[float] = []
            async with scraping(
                session, url, ports, durations, peer.params, peer.succeeded, SCRAPE_HEADERS
            ) as failures:
                await asyncio.sleep(warmup)
                scrapes_before, failed_before = len(durations), failures[0]
                reads_before = await reads_so_far(scrapes_before - failed_before)
                cpu_before = tree_cpu_seconds(process.pid)
                scraper_before, servers_before = time.process_time(), servers.cpu()
                started = time.monotonic()
                loads = []
                while (left := started + window - time.monotonic()) > 0:
                    await asyncio.sleep(min(LOAD_SAMPLE_SECONDS, left))
                    loads.append(os.getloadavg()[0])
                elapsed = time.monotonic() - started
                succeeded_after = len(durations) - failures[0]
                cpu = tree_cpu_seconds(process.pid) - cpu_before
                scraper_cpu = time.process_time() - scraper_before
                servers_cpu = servers.cpu() - servers_before
                rss = tree_rss_bytes(process.pid)
                measured = durations[scrapes_before:]
                failed = failures[0] - failed_before
                reads = await reads_so_far(succeeded_after) - reads_before
    return PeerRun(
        peer=peer.name,
        targets=count,
        seconds=elapsed,
        scrapes_due=round(count * elapsed / INTERVAL),
        scrapes=len(measured),
        failed_scrapes=failed,
        reads=reads,
        p50_scrape_seconds=percentile(measured, 0.5),
        p99_scrape_seconds=percentile(measured, 0.99),
        exporter_cpu=cpu,
        scraper_cpu=scraper_cpu,
        servers_cpu=servers_cpu,
        rss_bytes=rss,
        load_mean=sum(loads) / len(loads),
        load_max=max(loads),
    )


def round_order(round_index: int) -> tuple[Peer, ...]:
    """The peers in the order round `round_index` runs them: forward, then backward (two
    rounds run each peer once early and once late, so a load that drifts through the run
    weighs on every peer alike)."""
    return PEERS if round_index % 2 == 0 else PEERS[::-1]


async def _run(counts: list[int], warmup: float, window: float, rounds: int) -> list[list[PeerRun]]:
    """Per size, every peer's rounds pooled (`pooled`), in the order of PEERS."""
    servers = await asyncio.to_thread(TargetServers, max(counts), moving=True)
    try:
        with tempfile.TemporaryDirectory() as workdir:
            sizes = []
            for count in counts:
                runs: dict[str, list[PeerRun]] = {peer.name: [] for peer in PEERS}
                for round_index in range(rounds):
                    for peer in round_order(round_index):
                        run = await measure(peer, servers, count, warmup, window, Path(workdir))
                        runs[peer.name].append(run)
                        print(
                            f"peer: {count:,} targets, round {round_index + 1}/{rounds}, "
                            f"{peer.name}: {fmt_seconds(run.cpu_per_read)} per read, "
                            f"{run.failed_scrapes} failed scrapes",
                            flush=True,
                        )
                sizes.append([pooled(runs[peer.name]) for peer in PEERS])
            return sizes
    finally:
        await asyncio.to_thread(servers.stop)


def per_round(run: PeerRun) -> str:
    """CPU per read, and each round's when there are several."""
    pooled_figure = fmt_seconds(run.cpu_per_read)
    if len(run.rounds_cpu_per_read) < 2:
        return pooled_figure
    return f"{pooled_figure} ({', '.join(fmt_seconds(r) for r in run.rounds_cpu_per_read)})"


def ratio(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator else float("nan")


def ratios_of(ours: PeerRun, other: PeerRun) -> dict[str, float]:
    """`ours` ÷ `other`: CPU per read, p99 scrape, RSS."""
    return {
        "cpu_per_read": ratio(ours.cpu_per_read, other.cpu_per_read),
        "p99_scrape": ratio(ours.p99_scrape_seconds, other.p99_scrape_seconds),
        "rss": ratio(ours.rss_bytes, other.rss_bytes),
    }


def skipped(reason: str) -> Section:
    print(f"peer: skipped: {reason}", flush=True)
    return Section(
        title="Beside blackbox_exporter: the same servers, the same scrape plan",
        command="python -m benchmarks --only peer",
        headers=["skipped"],
        rows=[[reason]],
        method=[],
        figures={"skipped": reason},
    )


def run(quick: bool) -> Section:
    real_payload()
    if shutil.which(BLACKBOX) is None:
        return skipped(
            f"{BLACKBOX} not found (Debian: apt-get install -y prometheus-blackbox-exporter)"
        )
    said = subprocess.run([BLACKBOX, "--version"], capture_output=True, text=True, check=False)
    found = re.search(r"version (\S+)", said.stdout + said.stderr)
    version = f"blackbox_exporter {found[1] if found else '(version unknown)'}"
    counts = [50] if quick else [2500, 5000, 7500]
    # Quick: enough scrapes of each exporter to show it reads (the smoke test), no figure.
    warmup = 2.0 if quick else INTERVAL
    window = 6.0 if quick else 2 * INTERVAL
    rounds = 1 if quick else ROUNDS
    sizes = asyncio.run(_run(counts, warmup, window, rounds))
    rows = []
    figures: dict[str, object] = {"blackbox_version": version, "sizes": []}
    for runs in sizes:
        ours, workers = runs[0], runs[1]
        ratios = {r.peer: ratios_of(ours, r) for r in runs[1:]}
        workers_ratios = {r.peer: ratios_of(workers, r) for r in runs[2:]}
        for r in runs:
            beside = "-"
            if r.peer in workers_ratios:
                one, many = ratios[r.peer]["cpu_per_read"], workers_ratios[r.peer]["cpu_per_read"]
                beside = f"{one:.2f} / {many:.2f}"
            rows.append(
                [
                    f"{r.targets:,}",
                    r.peer,
                    f"{r.scrapes - r.failed_scrapes:,} / {r.scrapes_due:,}",
                    f"{r.failed_scrapes:,}",
                    f"{r.reads:,}",
                    f"{fmt_seconds(r.p50_scrape_seconds)} / {fmt_seconds(r.p99_scrape_seconds)}",
                    per_round(r),
                    f"{r.exporter_cpu / r.seconds:.0%}",
                    beside,
                    f"{r.rss_bytes / 2**20:.0f} MiB",
                    f"{r.scraper_cpu / r.seconds:.0%} / {r.servers_cpu / r.seconds:.0%}",
                    f"{r.load_mean:.1f} ({r.load_max:.1f})",
                ]
            )
        figures["sizes"].append(  # type: ignore[attr-defined]
            {
                "targets": ours.targets,
                "runs": [r.__dict__ | {"cpu_per_read": r.cpu_per_read} for r in runs],
                "ratios": ratios,
                "workers_ratios": workers_ratios,
                "round_cpu_ratios": {
                    r.peer: [
                        ratio(mine, theirs)
                        for mine, theirs in zip(
                            ours.rounds_cpu_per_read, r.rounds_cpu_per_read, strict=True
                        )
                    ]
                    for r in runs[1:]
                },
            }
        )
    return Section(
        title="Beside blackbox_exporter: the same servers, the same scrape plan",
        command="python -m benchmarks --only peer",
        headers=[
            "targets",
            "exporter",
            "scrapes done / due",
            "failed scrapes",
            "reads",
            "p50 / p99 scrape",
            "exporter CPU per read",
            "exporter CPU (of one core)",
            f"stallwatch ÷ this, CPU per read (1 / {WORKERS} workers)",
            "exporter RSS",
            "Prometheus stand-in / servers CPU",
            "load (1 min): mean (max)",
        ],
        rows=rows,
        method=[
            f"Each exporter runs as its own process, one after another on the same {max(counts):,} "
            "lightweight aiohttp servers (one port each, the captured real vLLM payload, 51 KiB, "
            "counters advancing, idle connections closed after 5 s: every read opens a "
            "connection): `stallwatch exporter` (module `vllm`, `interval: 15s`, `timeout: "
            f"5s`; on uvloop, its default where installed, with {WORKERS} workers, and on "
            f"asyncio's own loop with `--event-loop=asyncio`); {version} (module `http_2xx`, "
            "whole body read, and module `vllm_regex`, "
            f"`fail_if_body_not_matches_regexp: {BODY_REGEX}`, both `timeout: 5s`, ip4); and "
            "`benchmarks/bare_exporter.py` (aiohttp, one shared `ClientSession`, reads the body "
            "and answers a constant), on asyncio's loop and on uvloop. "
            f"At each size every exporter runs {rounds} time(s), started anew each time: the "
            "first round in the table's order, the second in the reverse order; its figures "
            "pool the rounds (counts, CPU and time summed: CPU per read is the rounds' CPU over "
            "their reads, each round's in parentheses; the worst round's p99, RSS and load "
            "peak, the median round's p50).",
            f"This process plays Prometheus, the same plan for each: every server's `/probe` "
            f"once per {INTERVAL:g} s, phases spread, {SCRAPE_TIMEOUT:g} s scrape timeout (sent "
            "as `X-Prometheus-Scrape-Timeout-Seconds`), kept-alive connections. A scrape fails "
            "on a timeout, an error, a non-200 answer or an answer that does not say the read "
            f"succeeded. Each round measured over {window:g} s after a {warmup:g} s warm-up.",
            "Reads: stallwatch's `stallwatch_probe_reads_total` and the bare exporter's own "
            "counter; for blackbox_exporter (no cache: every `/probe` reads the server), the "
            "scrapes that succeeded. Exporter CPU per read = utime + stime of the exporter "
            "process and its live children (/proc) ÷ reads; RSS at the end of the window. "
            "stallwatch ÷ this: above 1, stallwatch spends more CPU per read than that exporter. "
            "The load average (1 min) is sampled every 5 s through the window: the machine is "
            "shared, and the stand-in, the servers and the exporter run on the same cores "
            "(blackbox_exporter, a Go program, may use every core; the Python exporters one).",
        ],
        figures=figures,
    )
