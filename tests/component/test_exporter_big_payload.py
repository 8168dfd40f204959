"""A target serving a huge `/metrics` payload, polled beside a healthy one on loopback: the
healthy target keeps its schedule."""

from __future__ import annotations

import asyncio
import contextlib
import itertools

from stallwatch.common.exporter_config import DEFAULT_MAX_PAYLOAD_BYTES, IdleTestRequestConfig
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.simulator.server import SimConfig
from stallwatch.simulator.testing import running_simulator
from tests.support.exporter import big_metrics_server, exporter_for, target

# 141 644 engine series of vLLM, one per `engine` label: about 8 MiB, under the default cap.
HOSTILE_SERIES = 141_644
HEALTHY_INTERVAL = 1.0
WATCHED_SECONDS = 10.0
# The watch lasts at least WATCHED_SECONDS and until the big payload has been read, parsed and
# judged once (a few seconds on a quiet machine; past WATCHED_SECONDS on a loaded one, where
# the test failed with no poll of it yet), at most this long.
HOSTILE_READ_BOUND = 90.0
# Generous: the machine is shared. Without the fix a gap is the whole parse and judgement of
# the big payload (4 s and more here).
MAX_GAP = 3 * HEALTHY_INTERVAL


def hostile_payload() -> bytes:
    lines = [
        f'vllm:num_requests_running{{model_name="m",engine="{i}"}} 1' for i in range(HOSTILE_SERIES)
    ]
    return ("\n".join(lines) + "\n").encode()


async def test_a_huge_payload_does_not_delay_a_healthy_target() -> None:
    """A healthy target polled every second beside one serving 8 MiB of engine series (read
    every second too) has no gap between its polls longer than three intervals."""
    body = hostile_payload()
    assert len(body) < DEFAULT_MAX_PAYLOAD_BYTES
    async with big_metrics_server(body) as hostile_url, running_simulator(SimConfig()) as sim:
        healthy = target(
            "healthy",
            sim.url,
            kind="vllm",
            interval_seconds=HEALTHY_INTERVAL,
            timeout_seconds=HEALTHY_INTERVAL,
            test_request=IdleTestRequestConfig(enabled=False),
        )
        hostile = target(
            "hostile",
            hostile_url,
            kind="vllm",
            interval_seconds=1.0,
            timeout_seconds=1.0,
            test_request=IdleTestRequestConfig(enabled=False),
        )
        polled: dict[str, list[float]] = {"healthy": [], "hostile": []}
        hostile_judged = asyncio.Event()
        loop = asyncio.get_running_loop()

        def seen(name: str, _history: TargetHistory, outcome: PollOutcome) -> None:
            polled[name].append(loop.time())
            if name == "hostile" and outcome.reading is not None:
                hostile_judged.set()

        async with exporter_for(healthy, hostile) as (service, _url):
            service.subscribe(seen)
            started = loop.time()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(hostile_judged.wait(), HOSTILE_READ_BOUND)
            await asyncio.sleep(started + WATCHED_SECONDS - loop.time())
    times = polled["healthy"]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert hostile_judged.is_set(), f"the big payload was not read within {HOSTILE_READ_BOUND} s"
    assert len(times) >= 3, times
    assert max(gaps) <= MAX_GAP, gaps
