"""The restart window, measured through the whole chain: a hang is restarted once it outlasts the
window, a freeze that ends inside it never is.

Real simulator (a process) → real exporter → real Prometheus and Alertmanager (the end-to-end
harness: 1 s scrape and evaluation, group_wait 0 s) → the real `stallwatch restarter` process,
whose command action restarts the simulator. The exporter and the restarter run at their
shipped defaults (15 s polls, 5 s confirmation gap, 5 m window); `--quick` scales the poll and
the window down by 15 and 60.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from benchmarks.common import REPO, Section, fmt_seconds
from tests.support.alerting_stack import poll, running_stack
from tests.support.pipeline import exporter_on_stack, target, unique
from tests.support.restarter_pipeline import (
    RestarterStack,
    loaded,
    restarter_for,
    rows,
    simulator,
    wait_until_busy,
)

SHIPPED_INTERVAL, SHIPPED_WINDOW = 15.0, "5m"
QUICK_INTERVAL, QUICK_WINDOW = 1.0, "5s"
FREEZE_SECONDS = 70.0


async def _hang(
    stack: RestarterStack, workdir: Path, interval: float, window: str | None, gap: str
) -> dict[str, float]:
    """Seconds from a hang to the people alert, the window's opening and the restart decision."""
    name = unique("bench-window")
    with simulator(workdir) as sim:
        async with (
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session,
            restarter_for(stack, workdir, name, sim, restart_after=window, gap=gap) as restarter,
            loaded(sim, session, concurrency=2),
            exporter_on_stack(stack, target(name, sim.url, interval=interval)) as service,
        ):
            await wait_until_busy(stack, service, name, interval)
            hung_at = time.time()
            await sim.fault(session, "hang")
            query = f'ALERTS{{alertname="LLMServerStuck",alertstate="firing",target="{name}"}}'
            await stack.wait_for_query(query, 4 * interval + 30)
            told = time.time() - hung_at

            async def restarted() -> list[dict[str, Any]] | None:
                entries = await restarter.journal(session)
                return entries if rows(entries, name, "restart") else None

            entries = await poll(restarted, 600 + 4 * interval, "the restart")
    (restart,) = rows(entries, name, "restart")
    opened = min(e["time"] for e in entries if e["reason"] == "restart_window")
    return {
        "hang_to_alert": told,
        "hang_to_window": opened - hung_at,
        "hang_to_restart": restart["time"] - hung_at,
    }


async def _measure(quick: bool) -> dict[str, float]:
    interval, window = (QUICK_INTERVAL, QUICK_WINDOW) if quick else (SHIPPED_INTERVAL, None)
    with tempfile.TemporaryDirectory(prefix="stallwatch-bench-") as tmp:
        workdir = Path(tmp)
        with running_stack(RestarterStack(workdir, REPO)) as stack:
            return await _hang(stack, workdir, interval, window, gap="1s" if quick else "5s")


def run(quick: bool) -> Section:
    figures = asyncio.run(_measure(quick))
    interval = QUICK_INTERVAL if quick else SHIPPED_INTERVAL
    window = QUICK_WINDOW if quick else SHIPPED_WINDOW
    settings = f"exporter {interval:g} s, restart_after {window}, Prometheus/Alertmanager 1 s"
    rows = [
        [
            "hang → LLMServerStuck fires (people told)",
            settings,
            fmt_seconds(figures["hang_to_alert"]),
        ],
        ["hang → restart window opens", settings, fmt_seconds(figures["hang_to_window"])],
        ["hang → restart decision", settings, fmt_seconds(figures["hang_to_restart"])],
    ]
    return Section(
        title="The restart window: a hang at the shipped defaults",
        command="python -m benchmarks --only window",
        headers=["step", "settings", "measured (one run)"],
        rows=rows,
        method=[
            "A real simulator with two long requests in flight is hung (`hang` fault); the real "
            "exporter polls it at the shipped 15 s, Prometheus and Alertmanager (the e2e "
            "harness, 1 s scrape, evaluation and group_wait 0 s) run stallwatch's rules and "
            "routing, and the real restarter runs with its shipped confirmation gap (5 s) and "
            "window (5 m); times are taken from the fault to Prometheus showing the alert and "
            "to the restarter's journal rows.",
            "With Prometheus and Alertmanager at their shipped 15 s and 5 s, add up to 30 s "
            "(one scrape and one evaluation interval) and 5 s of group_wait to every row.",
        ],
        figures=figures,
    )
