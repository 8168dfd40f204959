"""docker-compose.yml run for real on podman: healthy, busy under load, a hang restarted once.

The tests run in file order on one stack (module scope); the last one takes it down and checks
that nothing is left behind. Ports are the ones docker-compose.yml publishes on 127.0.0.1.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import aiohttp

from stallwatch import USER_AGENT
from stallwatch.simulator.load import LoadSummary, run_load

from .compose import SERVICES, ComposeProject
from .figures import FIGURES

SIMULATOR = "http://127.0.0.1:8100"
EXPORTER = "http://127.0.0.1:9732"
RESTARTER = "http://127.0.0.1:9733"
PROMETHEUS = "http://127.0.0.1:9090"
SIMULATOR_CONTAINER = "stallwatch-simulator"  # container_name in docker-compose.yml
POLL_INTERVAL = 15.0  # deploy/exporter-sim.yml
LOAD_OFFSET = 5.0  # a request of 1,900 tokens takes about 19 s on the default simulator
HTTP = aiohttp.ClientTimeout(total=10)
T = TypeVar("T")


async def poll(check: Callable[[], Awaitable[T | None]], timeout: float, what: str) -> T:
    """Call `check` every half second until it returns something other than None."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            result = await check()
            if result is not None:
                return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.5)


def sample(metrics: str, name: str, **labels: str) -> float | None:
    """The value of the first sample of `name` carrying all of `labels`."""
    for line in metrics.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{key}="{value}"' in line for key, value in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


async def text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(url) as response:
        response.raise_for_status()
        return await response.text()


async def json_of(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str] | None = None,
    params: dict[str, str] | None = None,
) -> Any:
    async with session.get(url, headers=headers, params=params) as response:
        response.raise_for_status()
        return await response.json()


async def exporter_state(session: aiohttp.ClientSession) -> tuple[str, float, float, float]:
    """The sim target's (state, polls in that state, polls, test requests) from the exporter."""
    metrics = await text(session, EXPORTER + "/metrics")
    states = [
        line.split('state="', 1)[1].split('"', 1)[0]
        for line in metrics.splitlines()
        if line.startswith("stallwatch_target_state{") and line.endswith(" 1.0")
    ]
    return (
        states[0] if states else "none",
        sample(metrics, "stallwatch_target_state_polls", target="sim") or 0.0,
        sample(metrics, "stallwatch_polls_total", target="sim") or 0.0,
        sample(metrics, "stallwatch_test_requests_total", target="sim") or 0.0,
    )


async def journal(session: aiohttp.ClientSession, token: str) -> list[dict[str, Any]]:
    answer = await json_of(
        session, RESTARTER + "/journal?limit=1000", headers={"Authorization": f"Bearer {token}"}
    )
    entries: list[dict[str, Any]] = answer["entries"]
    return entries[::-1]  # oldest first


@contextlib.asynccontextmanager
async def loaded(session: aiohttp.ClientSession) -> AsyncIterator[list[asyncio.Task[LoadSummary]]]:
    """Two long completions kept in flight (again after a restart), cancelled at the end.

    Two loads of one request each, started apart, so their requests never end together:
    a hang that lands between two requests would leave no work and read `unresponsive`.
    """
    loads: list[asyncio.Task[LoadSummary]] = []
    try:
        for _ in range(2):
            loads.append(
                asyncio.create_task(
                    run_load(
                        SIMULATOR, concurrency=1, prompt_tokens=10, max_tokens=1_900, duration=900
                    )
                )
            )
            await asyncio.sleep(LOAD_OFFSET)
        yield loads
    finally:
        for load in loads:
            load.cancel()
        await asyncio.gather(*loads, return_exceptions=True)


async def busy_for_two_polls(session: aiohttp.ClientSession) -> tuple[str, float, float, float]:
    async def busy() -> tuple[str, float, float, float] | None:
        state = await exporter_state(session)
        return state if state[0] == "busy" and state[1] >= 2 else None

    return await poll(busy, 6 * POLL_INTERVAL, "the exporter to read the simulator busy twice")


def test_every_service_turns_healthy(stack: ComposeProject) -> None:
    """Each started service's own healthcheck from docker-compose.yml passes (Grafana left out)."""
    names = stack.container_names()
    assert sorted(names) == sorted(SERVICES)
    assert {service: stack.health(name) for service, name in names.items()} == dict.fromkeys(
        SERVICES, "healthy"
    )


async def test_a_loaded_simulator_reads_busy_and_gets_no_test_request(
    stack: ComposeProject,
) -> None:
    """Under load the exporter reads `busy` and sends no test request, poll after poll."""
    async with aiohttp.ClientSession(timeout=HTTP) as session, loaded(session):
        state, _, polls, probes = await busy_for_two_polls(session)
        stats = await json_of(session, SIMULATOR + "/sim/stats")

        async def two_more_polls() -> tuple[str, float, float, float] | None:
            later = await exporter_state(session)
            return later if later[2] >= polls + 2 else None

        later = await poll(two_more_polls, 4 * POLL_INTERVAL, "two more exporter polls")
        stats_after = await json_of(session, SIMULATOR + "/sim/stats")
    assert later[0] == "busy", later
    assert later[3] == probes, "the exporter sent a test request to a busy server"
    # The simulator's own count of completions sent with the exporter's User-Agent agrees.
    probes_before = stats["completions_by_user_agent"].get(USER_AGENT, 0)
    assert stats_after["completions_by_user_agent"].get(USER_AGENT, 0) == probes_before
    assert state == "busy"


async def test_a_hang_is_restarted_once_through_the_docker_api(stack: ComposeProject) -> None:
    """Hung engine: LLMServerStuck fires, the restarter restarts the container once, it is back."""
    podman = stack.podman
    before = podman.inspect(SIMULATOR_CONTAINER)
    assert before is not None
    since = time.time()
    async with aiohttp.ClientSession(timeout=HTTP) as session, loaded(session):
        await busy_for_two_polls(session)
        first_start = (await json_of(session, SIMULATOR + "/sim/stats"))["start_time"]
        hung_at = time.monotonic()
        async with session.post(SIMULATOR + "/sim/fault", json={"fault": "hang"}) as response:
            assert response.status == 200, await response.text()

        async def action_result() -> list[dict[str, Any]] | None:
            entries = await journal(session, stack.token)
            return entries if any(e["decision"] == "action_result" for e in entries) else None

        entries = await poll(action_result, 300, "the restarter's action result")
        restarted_at = time.monotonic()
        FIGURES.append(f"hang -> container restarted: {restarted_at - hung_at:.1f} s")

        async def back() -> dict[str, Any] | None:
            stats = await json_of(session, SIMULATOR + "/sim/stats")
            return stats if stats["start_time"] != first_start and stats["running"] else None

        stats = await poll(back, 120, "the restarted simulator serving the load again")
        await busy_for_two_polls(session)
        alerts = await json_of(
            session,
            PROMETHEUS + "/api/v1/query",
            params={"query": 'ALERTS{alertname="LLMServerStuck",alertstate="firing"}[30m]'},
        )
        entries = await journal(session, stack.token)
        metrics = await text(session, RESTARTER + "/metrics")
    stack.wait_healthy([SIMULATOR_CONTAINER], 60)

    acted = [e for e in entries if e["decision"] in ("restart", "action_result")]
    assert [(e["decision"], e["alertname"], e["target"]) for e in acted] == [
        ("restart", "LLMServerStuck", "sim"),
        ("action_result", "LLMServerStuck", "sim"),
    ], entries
    result = acted[1]
    assert result["result"] == "success", result
    assert result["detail"] == f"docker restarted {SIMULATOR_CONTAINER} (t=10)"
    assert (
        sample(metrics, "stallwatch_restarter_restarts_total", result="success", target="sim") == 1
    )
    assert [s["metric"]["target"] for s in alerts["data"]["result"]] == ["sim"], alerts
    events = podman.container_events(SIMULATOR_CONTAINER, since)
    assert events.count("restart") == 1, events
    after = podman.inspect(SIMULATOR_CONTAINER)
    assert after is not None
    assert after["Id"] == before["Id"]  # the same container, restarted, not recreated
    assert after["State"]["StartedAt"] != before["State"]["StartedAt"]
    assert stats["fault"] in (None, "none"), stats


def test_down_leaves_no_container_network_or_volume(stack: ComposeProject) -> None:
    """`docker-compose down -v` removes every container, network and volume of the project."""
    result = stack.compose("down", "-v", "--remove-orphans", "--timeout", "5")
    assert result.returncode == 0
    assert stack.leftovers() == {"containers": [], "networks": [], "volumes": []}
