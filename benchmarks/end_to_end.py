"""End to end: from the start of a stall to the restart notification, through the real stack.

Real simulator → real exporter → real Prometheus (stallwatch's rules) → real Alertmanager
(stallwatch's routing) → webhook. The stack is the one the end-to-end tests start
(`tests/support/alerting_stack.py`: 1 s scrape and evaluation, group_wait 0 s); the exporter
polls every 1 s. Each run uses a new target name, so each alert is a new Alertmanager group.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from pathlib import Path

import aiohttp

from benchmarks.common import REPO, Section, fmt_seconds, median
from stallwatch.common.exporter_config import ExporterConfig, IdleTestRequestConfig, TargetConfig
from stallwatch.common.restart_limits import DEFAULT_RESTART_AFTER
from stallwatch.core.classify import State
from stallwatch.exporter.app import running_exporter
from stallwatch.restarter.waiting import RELEASE_CHECK_SECONDS
from stallwatch.simulator.load import run_load
from stallwatch.simulator.testing import running_simulator
from tests.support.alerting_stack import AlertingStack

TEST_INTERVAL = 1.0
# The shipped defaults: exporter interval, Prometheus scrape and evaluation interval,
# the restarter route's group_wait, the restarter's confirmation gap.
SHIPPED = {"exporter": 15.0, "scrape": 15.0, "evaluation": 15.0, "group_wait": 5.0, "confirm": 5.0}
OLD_WAY_CHECKS, OLD_WAY_INTERVAL = 5, 300.0
# The restarter's shipped restart window, and how often it looks at alerts waiting for theirs.
WINDOW_SECONDS = DEFAULT_RESTART_AFTER


def shipped_default_delays(samples: int = 100_000, seed: int = 1) -> tuple[float, float, float]:
    """(best, median, worst) seconds from a hang to the restart decision with shipped defaults.

    The first poll after the hang still sees the progress made before it (busy); the next two
    are stalled (state_polls 1 and 2). Then up to one scrape interval, up to one evaluation
    interval, group_wait, and the restarter's two reads `confirm` apart.
    """
    rng = random.Random(seed)
    interval = SHIPPED["exporter"]
    fixed = 2 * interval + SHIPPED["group_wait"] + SHIPPED["confirm"]
    values = sorted(
        fixed
        + rng.uniform(0, interval)
        + rng.uniform(0, SHIPPED["scrape"])
        + rng.uniform(0, SHIPPED["evaluation"])
        for _ in range(samples)
    )
    worst = fixed + interval + SHIPPED["scrape"] + SHIPPED["evaluation"]
    return fixed, statistics.median(values), worst


async def _wait_for_state(service_histories: dict, name: str, state: State, polls: int) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + 30
    while True:
        history = service_histories.get(name)
        if history is not None and history.state == state and history.state_polls >= polls:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{name} never reached {state} for {polls} polls")
        await asyncio.sleep(0.02)


async def one_run(stack: AlertingStack, workdir: Path, name: str) -> tuple[float, int, int]:
    """Seconds from the hang to the webhook, and /health answers (200s, total) during the hang."""
    async with running_simulator(tokens_per_second=50.0, max_num_seqs=4) as sim:
        target = TargetConfig(
            name=name,
            url=sim.url,
            interval_seconds=TEST_INTERVAL,
            timeout_seconds=TEST_INTERVAL,
            test_request=IdleTestRequestConfig(timeout_seconds=0.5),
        )
        config = ExporterConfig(targets=(target,), listen_port=stack.exporter_port)
        async with running_exporter(
            config, workdir / "exporter.yml", host="127.0.0.1", port=stack.exporter_port
        ) as (service, _url):
            load = asyncio.create_task(
                run_load(sim.url, concurrency=2, prompt_tokens=10, max_tokens=2000, duration=120)
            )
            try:
                await _wait_for_state(service.histories, name, State.BUSY, polls=2)
                started = time.monotonic()
                sim.apply_fault("hang")
                health_ok = health_total = 0
                async with aiohttp.ClientSession() as session:
                    waiter = asyncio.create_task(
                        stack.receiver.wait_for("LLMServerStuck", name, timeout=60)
                    )
                    # A liveness probe on /health during the hang, as Kubernetes would send it.
                    while not waiter.done():
                        async with session.get(sim.url + "/health") as response:
                            health_total += 1
                            health_ok += response.status == 200
                        await asyncio.sleep(0.1)
                    notification = await waiter
                return notification.received_monotonic - started, health_ok, health_total
            finally:
                load.cancel()
                await asyncio.gather(load, return_exceptions=True)


async def _runs(count: int) -> tuple[list[float], int, int]:
    with tempfile.TemporaryDirectory(prefix="stallwatch-bench-") as tmp:
        workdir = Path(tmp)
        stack = AlertingStack(workdir, REPO)
        await asyncio.to_thread(stack.start)
        try:
            await asyncio.sleep(2.0)  # Prometheus' first scrape of the exporter job
            delays: list[float] = []
            ok_total = answers_total = 0
            for index in range(count):
                delay, ok, answers = await one_run(
                    stack, workdir, f"bench-{index}-{time.time_ns()}"
                )
                delays.append(delay)
                ok_total += ok
                answers_total += answers
            return delays, ok_total, answers_total
        finally:
            await asyncio.to_thread(stack.stop)


def run(quick: bool) -> Section:
    count = 1 if quick else 7
    delays, health_ok, health_total = asyncio.run(_runs(count))
    best, typical, worst = shipped_default_delays()
    spread = f"{fmt_seconds(min(delays))} to {fmt_seconds(max(delays))}"
    rows = [
        [
            "stallwatch, test intervals (measured)",
            f"exporter {TEST_INTERVAL:g} s, scrape/eval 1 s, group_wait 0 s",
            fmt_seconds(median(delays)),
            spread + f" ({count} runs)",
        ],
        [
            "stallwatch, shipped defaults (calculated)",
            "exporter 15 s, scrape/eval 15 s, group_wait 5 s, confirm 5 s",
            fmt_seconds(typical),
            f"{fmt_seconds(best)} to {fmt_seconds(worst)}",
        ],
        [
            "stallwatch, shipped defaults, to the restart (calculated)",
            "the above, then the 5 m restart window and a second confirmation (5 s)",
            fmt_seconds(typical + WINDOW_SECONDS + SHIPPED["confirm"]),
            f"{fmt_seconds(best + WINDOW_SECONDS + SHIPPED['confirm'])} to "
            f"{fmt_seconds(worst + WINDOW_SECONDS + SHIPPED['confirm'] + RELEASE_CHECK_SECONDS)}",
        ],
        [
            "old way: chat request watchdog",
            "1 check / 5 min, 45 s timeout, 5 failures in a row",
            f"~{OLD_WAY_CHECKS * OLD_WAY_INTERVAL / 60:g} min",
            "20.75 to 25.75 min (5 failed checks; and it restarts healthy busy servers too)",
        ],
        [
            "Kubernetes liveness probe on /health",
            "period 10 s, failureThreshold 3",
            "never",
            f"/health answered 200 to {health_ok} of {health_total} probes during the hang",
        ],
    ]
    return Section(
        title="End to end: from a stall to the restart",
        command="python -m benchmarks --only e2e",
        headers=["who watches", "settings", "stall → restart alert or restart (median)", "spread"],
        rows=rows,
        method=[
            "Measured: a real simulator with two long requests in flight, the real exporter, "
            "real Prometheus 2.42 and Alertmanager 0.25 running stallwatch's rule and routing "
            "files (harness of the end-to-end tests: 1 s scrape and evaluation, group_wait 0 s); "
            "the simulator's `hang` fault freezes the engine; the time is taken from the fault "
            "to the webhook POST arriving at a recording receiver (the restarter's address). "
            "The restarter then confirms with two reads `confirm.gap` apart, waits out its "
            "restart window (`restart_after`, 5 m) and confirms again before it acts "
            "(measured through the whole chain: `--only window`).",
            "Calculated for the shipped defaults: the first poll after the hang still sees "
            "progress, the next two are stalled (the rule needs two), then up to one scrape and "
            "one evaluation interval, group_wait, and the confirmation gap "
            "(median of the uniform phases).",
            "Old way: the first failing check can come right after the hang; five failed checks "
            "5 minutes apart, the last one timing out after 45 s.",
            "Kubernetes: `/health` was requested every 0.1 s on the hung simulator, which "
            "answers like vLLM (its `/health` does not touch the engine core).",
        ],
        figures={
            "measured_seconds": delays,
            "shipped_best_median_worst_seconds": [best, typical, worst],
            "health_ok": health_ok,
            "health_total": health_total,
        },
    )
