"""Out of rotation before a restart, measured through the whole chain to a real HAProxy: a server
frozen for 70 s with work in flight leaves users' rotation, and returns once it moves, unrestarted.

Two simulators behind Debian's HAProxy (agent-check on the restarter), four closed-loop users
through it, the real exporter at the shipped 15 s, real Prometheus and Alertmanager (the e2e
harness: 1 s scrape and evaluation, group_wait 0 s), the restarter process at its shipped
confirmation gap (5 s) and look (5 s), HAProxy's agent-inter 2 s. `--quick` scales the poll down.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path

from benchmarks.common import REPO, Section, fmt_seconds
from benchmarks.end_to_end import SHIPPED as SHIPPED_PIPELINE
from tests.support.alerting_stack import running_stack
from tests.support.quarantine_chain import SHIPPED, FreezeRun, Timings, freeze_through_haproxy
from tests.support.restarter_pipeline import RestarterStack

QUICK = Timings(interval=1.0, gap="1s", check_interval="1s", agent_inter="1s")
FREEZE_SECONDS, QUICK_FREEZE_SECONDS = 70.0, 10.0


async def _measure(quick: bool) -> FreezeRun:
    timings, freeze = (QUICK, QUICK_FREEZE_SECONDS) if quick else (SHIPPED, FREEZE_SECONDS)
    with tempfile.TemporaryDirectory(prefix="stallwatch-bench-") as tmp:
        workdir = Path(tmp)
        with running_stack(RestarterStack(workdir, REPO)) as stack:
            return await freeze_through_haproxy(stack, workdir, timings, freeze)


def run(quick: bool) -> Section:
    result = asyncio.run(_measure(quick))
    timings = QUICK if quick else SHIPPED
    settings = (
        f"exporter {timings.interval:g} s, confirm gap {timings.gap}, look "
        f"{timings.check_interval}, agent-inter {timings.agent_inter}, Prometheus/Alertmanager 1 s"
    )
    shipped_add = SHIPPED_PIPELINE["scrape"] + SHIPPED_PIPELINE["evaluation"]
    rows = [
        ["freeze → out of HAProxy's rotation", settings, fmt_seconds(result.freeze_to_out)],
        ["moving again → back in rotation", settings, fmt_seconds(result.end_to_back)],
        [
            "users' requests the frozen server got before it left / while out",
            "4 closed-loop users through HAProxy",
            f"{result.to_frozen_before_out} / {result.to_frozen_while_out}",
        ],
        ["restarted", "restart_after 5m (shipped)", "yes" if result.restarted else "no"],
    ]
    return Section(
        title="Out of rotation: a 70 s freeze through a real HAProxy at the shipped defaults",
        command="python -m benchmarks --only quarantine",
        headers=["step", "settings", "measured (one run)"],
        rows=rows,
        method=[
            "A real simulator with two long requests in flight is frozen (`hang` fault) for "
            f"{FREEZE_SECONDS:g} s and then recovers (`recover`); a second one serves beside it; "
            "four closed-loop users send small completions through Debian's HAProxy 2.6, whose "
            "agent-check asks the restarter's agent port. Times are taken from the fault to "
            "HAProxy's stats showing `DOWN (agent)`, and from `recover` to `UP`.",
            f"With Prometheus at its shipped 15 s scrape and evaluation, add up to {shipped_add:g}"
            " s to the first row (one scrape and one evaluation interval), and the restarter "
            "route's group_wait (5 s).",
            f"Routing rows of the frozen server: {result.routing}.",
        ],
        figures={
            "freeze_to_out": result.freeze_to_out,
            "end_to_back": result.end_to_back,
            "to_frozen_before_out": result.to_frozen_before_out,
            "to_frozen_while_out": result.to_frozen_while_out,
            "users_completed": result.users_completed,
            "restarted": result.restarted,
        },
    )
