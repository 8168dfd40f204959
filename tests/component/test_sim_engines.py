"""The simulator speaking each engine over HTTP: families as in the engines' source, endpoints."""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from stallwatch.simulator.engines import FLAVOURS
from stallwatch.simulator.testing import running_simulator, simulator_process

TABLE = Path(__file__).resolve().parents[1] / "testdata" / "engine-families.json"
HISTOGRAM_SUFFIXES = ("_bucket", "_count", "_sum")


def _families(text: str) -> dict[str, dict[str, Any]]:
    """name -> {type, help, labels} of every family in a payload (process_/python_ left out)."""
    found: dict[str, dict[str, Any]] = {}
    for line in text.splitlines():
        if line.startswith(("# HELP ", "# TYPE ")):
            name, _, rest = line[7:].partition(" ")
            entry = found.setdefault(name, {"type": None, "help": None, "labels": set()})
            entry["help" if line.startswith("# HELP") else "type"] = rest
        elif line and not line.startswith("#"):
            name, _, labels = line.rsplit(" ", 1)[0].partition("{")
            if name not in found:
                name = next(name[: -len(s)] for s in HISTOGRAM_SUFFIXES if name.endswith(s))
            keys = {pair.split("=")[0] for pair in labels.rstrip("}").split(",") if pair}
            found[name]["labels"] |= keys - {"le"}
    return {
        name: {**entry, "labels": sorted(entry["labels"])}
        for name, entry in found.items()
        if not name.startswith(("process_", "python_"))
    }


@pytest.mark.parametrize("engine", sorted(FLAVOURS))
async def test_each_engine_publishes_the_families_of_its_source(engine: str) -> None:
    """Names, types, label keys and HELP match the table built from the engine's source."""
    expected = {
        family["name"]: {k: family[k] for k in ("type", "help", "labels")}
        for family in json.loads(TABLE.read_text(encoding="utf-8"))["engines"][engine]["families"]
    }
    async with (
        running_simulator(engine=engine, max_num_seqs=4) as sim,
        aiohttp.ClientSession() as session,
    ):
        body = {"prompt": "a b c", "max_tokens": 4}
        answers = await asyncio.gather(
            *(session.post(f"{sim.url}/v1/completions", json=body) for _ in range(2))
        )
        assert [answer.status for answer in answers] == [200, 200]
        path = FLAVOURS[engine].metrics_path
        text = await (await session.get(sim.url + path)).text()

    assert _families(text) == expected


async def test_sglang_health_runs_a_generation_that_sim_stats_counts() -> None:
    """SGLang's /health generates (and moves the pass counter); /ping and /ready do not."""
    async with running_simulator(engine="sglang") as sim, aiohttp.ClientSession() as session:
        for path in ("/ping", "/ready"):
            assert (await session.get(sim.url + path)).status == 200
        steps_before = sim.stats()["engines"][0]["steps"]
        assert sim.stats()["health_generations"] == 0
        assert (await session.get(sim.url + "/health")).status == 200
        stats = sim.stats()

    assert stats["health_generations"] == 1
    assert stats["engines"][0]["steps"] > steps_before
    assert stats["requests_total"] == 0  # not a client request


async def test_tgi_health_answers_idle_and_never_while_the_shard_is_hung() -> None:
    """TGI's /health answers an idle server; with a hung forward in flight it never answers."""
    async with (
        running_simulator(engine="tgi", tokens_per_second=20) as sim,
        aiohttp.ClientSession() as session,
    ):
        assert (await session.get(sim.url + "/health")).status == 200
        load = asyncio.create_task(
            session.post(f"{sim.url}/v1/completions", json={"prompt": "a", "max_tokens": 500})
        )
        await asyncio.sleep(0.3)
        assert sim.stats()["running"] == 1
        sim.apply_fault("hang")
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(1.0):
                await session.get(sim.url + "/health")
        metrics = await session.get(sim.url + "/metrics")
        sim.apply_fault("recover")
        load.cancel()

    assert metrics.status == 200  # the router's own /metrics still answers
    assert sim.stats()["health_calls"] == 2


async def test_llamacpp_slots_wake_a_sleeping_server_and_props_does_not() -> None:
    """/props reports sleep without waking; /slots wakes the server; /health says ok."""
    async with (
        running_simulator(engine="llamacpp", sleep_idle_seconds=0.1) as sim,
        aiohttp.ClientSession() as session,
    ):
        await asyncio.sleep(0.3)
        props = await (await session.get(sim.url + "/props")).json()
        still = await (await session.get(sim.url + "/props")).json()
        slots = await (await session.get(sim.url + "/slots")).json()
        awake = await (await session.get(sim.url + "/props")).json()
        health = await session.get(sim.url + "/health")

        assert (props["is_sleeping"], still["is_sleeping"]) == (True, True)
        assert awake["is_sleeping"] is False
        assert [slot["id"] for slot in slots] == list(range(props["total_slots"]))
        assert (health.status, await health.json()) == (200, {"status": "ok"})


async def test_llamacpp_native_completion_and_slots_count_exactly() -> None:
    """/completion answers llama.cpp's body; /slots shows each slot's decoded tokens."""
    async with (
        running_simulator(engine="llamacpp", tokens_per_second=200) as sim,
        aiohttp.ClientSession() as session,
    ):
        body = {"prompt": "the of and", "n_predict": 400, "ignore_eos": True}
        load = asyncio.create_task(session.post(f"{sim.url}/completion", json=body))
        await asyncio.sleep(0.3)
        slots = await (await session.get(sim.url + "/slots")).json()
        short = await session.post(f"{sim.url}/completion", json={**body, "n_predict": 3})
        answer = await short.json()
        load.cancel()

    busy = [slot for slot in slots if slot["is_processing"]]
    assert len(busy) == 1
    assert busy[0]["next_token"][0]["n_decoded"] > 0
    assert answer["tokens_predicted"] == 3
    assert answer["tokens_evaluated"] == 3


async def test_freeze_fault_leaves_every_endpoint_unanswered_until_recover() -> None:
    """`freeze` (SIGSTOP): /metrics and /health accept and never answer; /sim/* still does."""
    async with running_simulator(engine="llamacpp") as sim, aiohttp.ClientSession() as session:
        sim.apply_fault("freeze")
        for path in ("/metrics", "/health", "/slots"):
            with pytest.raises(TimeoutError):
                async with asyncio.timeout(0.5):
                    await session.get(sim.url + path)
        stats = await (await session.get(sim.url + "/sim/stats")).json()
        await session.post(sim.url + "/sim/fault", json={"fault": "recover"})
        after = await session.get(sim.url + "/metrics")

    assert stats["fault"] == "freeze"
    assert after.status == 200


def test_stallwatch_sim_engine_flag_serves_that_engine() -> None:
    """`stallwatch sim --engine llamacpp --initial-decodes 12000000` prints n_decode as 1.2e+07."""
    args = ["--engine", "llamacpp", "--initial-decodes", "12000000"]
    with (
        simulator_process(args) as proc,
        urllib.request.urlopen(proc.url + "/metrics", timeout=10) as response,
    ):
        text = response.read().decode("utf-8")
        header = response.headers["Process-Start-Time-Unix"]

    assert "llamacpp:n_decode_total 1.2e+07\n" in text
    assert header.isdigit()
