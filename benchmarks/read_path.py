"""One real read, stage by stage, and the event loop beside the heaviest legal payload.

The breakdown times each stage of a `/probe` read of a captured real payload in this process:
the HTTP GET (a new connection, as a real server that closes idle connections after 5 s
forces at 15 s; and a kept-alive one), decoding, parsing, judging and keeping the history, and
rendering the answer. Where the stage changed, the way before (parsing line by line,
prometheus_client's `generate_latest`) is timed beside the way now, on the same input.

The event-loop check runs `stallwatch exporter` (this tree, and with `--baseline REF` the code
at REF) with a healthy target polled every second beside one serving an 8 MiB payload (the
largest the default cap takes) read every second, and measures how late the healthy target's
polls come: every poll's finish time is read back from the exporter's own series.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest

from benchmarks.common import (
    REAL_METRICS,
    Section,
    baseline_tree,
    exporter_child,
    fmt_seconds,
    git_describe,
)
from benchmarks.parsing import time_per_call
from benchmarks.scale import TargetServers
from stallwatch import USER_AGENT
from stallwatch.common.exporter_config import ExporterConfig, exporter_config_from_mapping
from stallwatch.core.classify import classify
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.core.reading import parse_reading
from stallwatch.exporter.collector import TargetCollector
from stallwatch.exporter.exposition import exposition
from stallwatch.localstack.processes import free_port
from stallwatch.net import fetch
from stallwatch.net.fetch import DEFAULT_MAX_BYTES, IDENTITY_HEADERS
from stallwatch.net.plain_get import plain_request

PAYLOADS = {
    "vLLM 0.32": ("vllm-0.32.0-cpu-busy-1.txt", "vllm-0.32.0-cpu-busy-2.txt"),
    "llama.cpp": ("llamacpp-0c1e57098-cpu-busy-1.txt", "llamacpp-0c1e57098-cpu-busy-2.txt"),
    "SGLang 0.5.23": ("sglang-0.5.23-cpu-busy-1.txt", "sglang-0.5.23-cpu-busy-2.txt"),
}
HTTP_READS = 600
# 141 644 engine series of vLLM, one per `engine` label: about 8 MiB, under the default cap.
HEAVY_SERIES = 141_644
HEALTHY_INTERVAL = 1.0
POLL_TIMESTAMP = "stallwatch_last_poll_timestamp_seconds"


def heavy_payload() -> bytes:
    lines = [
        f'vllm:num_requests_running{{model_name="m",engine="{i}"}} 1' for i in range(HEAVY_SERIES)
    ]
    return ("\n".join(lines) + "\n").encode()


def _cpu() -> float:
    times = os.times()
    return times.user + times.system


async def _http_cpu_per_read(ports: list[int], *, way: str, reads: int) -> float:
    """CPU of this process per GET of the real payload, no parse: `plain` the exporter's read
    of a server named by its address (a new connection each time), `aiohttp new` and `aiohttp
    kept` the same GET through aiohttp's client (what the plain read replaced, and what a
    server named by a host name still gets)."""
    kept_alive = way == "aiohttp kept"
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=4, force_close=not kept_alive)
    async with aiohttp.ClientSession(
        connector=connector, headers={"User-Agent": USER_AGENT}
    ) as session:
        urls = [f"http://127.0.0.1:{port}/metrics" for port in ports]

        async def read(url: str) -> None:
            if way == "plain":
                plain = plain_request(url, IDENTITY_HEADERS)
                assert plain is not None
                got = await fetch._read_plain(plain, timeout=5.0, max_bytes=DEFAULT_MAX_BYTES)
            else:
                got = await fetch._read_through(
                    session, url, timeout=5.0, max_bytes=DEFAULT_MAX_BYTES
                )
            assert isinstance(got, tuple), got

        for url in urls:
            await read(url)
        started = _cpu()
        done = 0
        while done < reads:
            for url in urls:
                await read(url)
            done += len(urls)
        return (_cpu() - started) / done


def _stage_times(first: str, second: str, budget: float) -> dict[str, float]:
    """Seconds per call of each pure stage, on two consecutive real payloads."""
    body = second.encode()
    earlier = parse_reading(first, taken_at=1e9)
    later = parse_reading(second, taken_at=1e9 + 15)
    config = exporter_config_from_mapping(
        {"modules": {"m": {"allow": ["127.0.0.1"], "interval": "15s"}}}, "benchmark"
    )
    target = config.modules["m"].target("127.0.0.1:8000", "http://127.0.0.1:8000")
    history = TargetHistory().advance(
        PollOutcome(classify(None, earlier), earlier, earlier.taken_at, 0.01)
    )
    one_target = ExporterConfig(targets=(target,))

    def judged() -> TargetHistory:
        verdict = classify(history.baseline, later)
        return history.advance(PollOutcome(verdict, later, later.taken_at, 0.01))

    after = judged()
    collector = TargetCollector(lambda: one_target, lambda: {target.name: after})

    def reference() -> bytes:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        return generate_latest(registry)

    def timed(work: Callable[[], object]) -> float:
        return time_per_call(lambda _text: (work(), 0)[1], "", budget)

    return {
        "decode": timed(lambda: body.decode("utf-8", errors="replace")),
        "parse_before": timed(lambda: parse_reading(second, taken_at=1.0, line_by_line=True)),
        "parse_now": timed(lambda: parse_reading(second, taken_at=1.0)),
        "judge": timed(judged),
        "render_before": timed(reference),
        "render_now": timed(lambda: exposition(collector.collect())),
    }


async def _poll_times(session: aiohttp.ClientSession, url: str, target: str) -> float | None:
    async with session.get(url + "/metrics") as response:
        for line in (await response.text()).splitlines():
            if line.startswith(f'{POLL_TIMESTAMP}{{target="{target}"'):
                return float(line.rsplit(" ", 1)[1])
    return None


async def _lateness(
    healthy_port: int, heavy_port: int, source: Path | None, seconds: float
) -> tuple[float, int, int]:
    """(largest lateness of the healthy target's polls past its interval, its polls, the
    heavy target's reads), over `seconds`."""
    targets = [
        {"name": "healthy", "url": f"http://127.0.0.1:{healthy_port}", "kind": "vllm"},
        {"name": "heavy", "url": f"http://127.0.0.1:{heavy_port}", "kind": "vllm"},
    ]
    for entry in targets:
        entry |= {"interval": "1s", "timeout": "1s"}
    config: dict[str, object] = {"listen": f"127.0.0.1:{free_port()}", "targets": targets}
    seen: set[float] = set()
    heavy_reads: set[float] = set()
    with (
        tempfile.TemporaryDirectory() as workdir,
        exporter_child(config, Path(workdir), source) as (_, url),
    ):
        async with aiohttp.ClientSession() as session:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + seconds
            while loop.time() < deadline:
                healthy = await _poll_times(session, url, "healthy")
                heavy = await _poll_times(session, url, "heavy")
                if healthy is not None:
                    seen.add(healthy)
                if heavy is not None:
                    heavy_reads.add(heavy)
                await asyncio.sleep(0.1)
    finished = sorted(seen)[1:]  # from the second poll on: the first one sets the schedule
    gaps = [later - earlier for earlier, later in itertools.pairwise(finished)]
    lateness = max((gap - HEALTHY_INTERVAL for gap in gaps), default=float("nan"))
    return max(lateness, 0.0), len(finished), len(heavy_reads)


async def _http_figures(reads: int) -> dict[str, float]:
    servers = await asyncio.to_thread(TargetServers, 50, moving=True)
    try:
        return {
            way: await _http_cpu_per_read(servers.ports, way=way, reads=reads)
            for way in ("plain", "aiohttp new", "aiohttp kept")
        }
    finally:
        await asyncio.to_thread(servers.stop)


async def _event_loop_figures(
    baseline: str | None, seconds: float
) -> list[tuple[str, tuple[float, int, int]]]:
    with tempfile.TemporaryDirectory() as workdir:
        heavy_file = Path(workdir) / "heavy.txt"
        heavy_file.write_bytes(heavy_payload())
        healthy = await asyncio.to_thread(TargetServers, 1, moving=True)
        heavy = await asyncio.to_thread(TargetServers, 1, payload=heavy_file)
        try:
            results = []
            with baseline_tree(baseline) as source:
                versions: list[tuple[str, Path | None]] = [("this tree", None)]
                if baseline is not None:
                    versions.insert(0, (git_describe(baseline), source))
                for name, tree in versions:
                    figures = await _lateness(healthy.ports[0], heavy.ports[0], tree, seconds)
                    results.append((name, figures))
            return results
        finally:
            await asyncio.to_thread(healthy.stop)
            await asyncio.to_thread(heavy.stop)


def run(quick: bool, baseline: str | None = None) -> Section:
    budget = 0.2 if quick else 2.0
    rows: list[list[str]] = []
    figures: dict[str, object] = {}
    http_reads = 100 if quick else HTTP_READS
    http = asyncio.run(_http_figures(http_reads))
    vllm_stages = _stage_times(*_texts(PAYLOADS["vLLM 0.32"]), budget)
    figures["http_plain_seconds"] = http["plain"]
    figures["http_aiohttp_new_connection_seconds"] = http["aiohttp new"]
    figures["http_aiohttp_kept_alive_seconds"] = http["aiohttp kept"]
    for label, names in PAYLOADS.items():
        stages = vllm_stages if label == "vLLM 0.32" else _stage_times(*_texts(names), budget)
        figures[label] = stages
        rows.append(
            [
                label,
                f"{len(_texts(names)[1].encode()) / 1024:,.0f} KiB",
                fmt_seconds(stages["decode"]),
                f"{fmt_seconds(stages['parse_before'])} → {fmt_seconds(stages['parse_now'])}",
                fmt_seconds(stages["judge"]),
                f"{fmt_seconds(stages['render_before'])} → {fmt_seconds(stages['render_now'])}",
            ]
        )
    loop_seconds = 8.0 if quick else 30.0
    lateness = asyncio.run(_event_loop_figures(baseline, loop_seconds))
    figures["event_loop"] = {
        name: {"largest_lateness_seconds": late, "healthy_polls": polls, "heavy_reads": heavy}
        for name, (late, polls, heavy) in lateness
    }
    lateness_text = "; ".join(
        f"{name}: **{fmt_seconds(late)}** at most ({polls} polls of the healthy target, "
        f"{heavy} reads of the heavy one)"
        for name, (late, polls, heavy) in lateness
    )
    return Section(
        title="One real read, stage by stage, and the event loop beside an 8 MiB payload",
        command="python -m benchmarks --only readpath [--baseline REF]",
        headers=[
            "payload",
            "size",
            "decode",
            "parse: line by line → searched",
            "judge + history",
            "render /probe answer: generate_latest → own writer",
        ],
        rows=rows,
        method=[
            "Each pure stage timed in this process on two consecutive captured payloads of a "
            "busy server (the second read judged against the first): best of 5 rounds of "
            "repeated calls. The way before and the way now run on the same input, one after "
            "the other (a test holds their results equal).",
            f"HTTP, {http_reads} sequential GETs of 50 lightweight servers returning the real "
            "vLLM payload, CPU per read, parse excluded: the exporter's plain read (a new "
            f"connection each time) **{fmt_seconds(http['plain'])}**; the same GET "
            f"through aiohttp's client {fmt_seconds(http['aiohttp new'])} on a new connection "
            "(what every read of a real server at 15 s opens: uvicorn and llama.cpp close idle "
            f"connections after 5 s), {fmt_seconds(http['aiohttp kept'])} on a kept-alive one.",
            f"Event loop: `stallwatch exporter` with a healthy target (the real vLLM payload, "
            f"counters moving) polled every {HEALTHY_INTERVAL:g} s beside one serving "
            f"{HEAVY_SERIES:,} vLLM engine series (8 MiB, under the default cap), also read "
            f"every second, for {loop_seconds:g} s; the largest delay of a healthy poll past "
            f"its interval, from the finish times the exporter publishes: {lateness_text}.",
        ],
        figures=figures,
    )


def _texts(names: tuple[str, str]) -> tuple[str, str]:
    first, second = names
    return (
        (REAL_METRICS / first).read_text(encoding="utf-8"),
        (REAL_METRICS / second).read_text(encoding="utf-8"),
    )
