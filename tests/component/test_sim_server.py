"""The simulator answers HTTP like a vLLM 0.32 OpenAI-compatible server."""

from __future__ import annotations

import asyncio
import json

import aiohttp

from stallwatch.simulator.config import SimConfig
from stallwatch.simulator.metrics import CONTENT_TYPE
from stallwatch.simulator.testing import (
    engine_sample,
    parse_samples,
    read_metrics,
    running_simulator,
)

TIMEOUT = aiohttp.ClientTimeout(total=10)

STEP_COUNT = engine_sample("vllm:iteration_tokens_total_count")
RUNNING = engine_sample("vllm:num_requests_running")
KV = engine_sample("vllm:kv_cache_usage_perc")


async def test_basic_endpoints_answer_like_vllm() -> None:
    """/health is 200 and empty, /v1/models lists the model, /version, /metrics content type."""
    async with running_simulator(model="tiny") as sim, aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.get(sim.url + "/health") as response:
            assert response.status == 200
            assert await response.read() == b""
        async with s.get(sim.url + "/v1/models") as response:
            models = await response.json()
            assert [m["id"] for m in models["data"]] == ["tiny"]
            assert models["data"][0]["owned_by"] == "vllm"
        async with s.get(sim.url + "/version") as response:
            assert (await response.json())["version"] == "0.32.0"
        async with s.get(sim.url + "/metrics") as response:
            assert response.headers["Content-Type"] == CONTENT_TYPE
            body = parse_samples(await response.text())
            assert body["process_start_time_seconds{}"] == sim.server.start_time


async def test_completion_and_chat_return_usage() -> None:
    """Non-streaming completions count prompt words as tokens and report usage."""
    async with (
        running_simulator(tokens_per_second=2000) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        payload = {"model": "tiny", "prompt": "one two three", "max_tokens": 5, "ignore_eos": True}
        async with s.post(sim.url + "/v1/completions", json=payload) as response:
            body = await response.json()
        assert body["object"] == "text_completion"
        assert body["usage"] == {
            "prompt_tokens": 3,
            "total_tokens": 8,
            "completion_tokens": 5,
            "prompt_tokens_details": None,
        }
        assert body["choices"][0]["finish_reason"] == "length"
        chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        async with s.post(sim.url + "/v1/chat/completions", json=chat) as response:
            body = await response.json()
        assert body["object"] == "chat.completion"
        assert body["choices"][0]["message"]["role"] == "assistant"
        assert body["usage"]["completion_tokens"] == 2


async def test_streaming_ends_with_done() -> None:
    """stream=true sends SSE chunks, one per token, a usage chunk on request, then [DONE]."""
    async with (
        running_simulator(tokens_per_second=2000) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        payload = {
            "model": "tiny",
            "prompt": "a b",
            "max_tokens": 4,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        async with s.post(sim.url + "/v1/completions", json=payload) as response:
            assert response.headers["Content-Type"].startswith("text/event-stream")
            text = await response.text()
        lines = [line for line in text.split("\n\n") if line]
        assert lines[-1] == "data: [DONE]"
        chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
        assert len([c for c in chunks if c["choices"]]) == 4
        assert chunks[-1]["usage"]["completion_tokens"] == 4


async def test_error_bodies_match_vllm() -> None:
    """Unknown model is a 404 NotFoundError; bad JSON and bad max_tokens are 400s."""
    async with running_simulator() as sim, aiohttp.ClientSession(timeout=TIMEOUT) as s:
        async with s.post(
            sim.url + "/v1/completions", json={"model": "x", "prompt": "hi"}
        ) as response:
            assert response.status == 404
            assert await response.json() == {
                "error": {
                    "message": "The model `x` does not exist.",
                    "type": "NotFoundError",
                    "param": "model",
                    "code": 404,
                }
            }
        async with s.post(sim.url + "/v1/completions", data=b"{not json") as response:
            assert response.status == 400
            assert (await response.json())["error"]["type"] == "BadRequestError"
        bad = {"model": "tiny", "prompt": "hi", "max_tokens": 0}
        async with s.post(sim.url + "/v1/completions", json=bad) as response:
            assert response.status == 400
            assert (await response.json())["error"]["param"] == "max_tokens"
        async with s.post(sim.url + "/sim/fault", json={"fault": "meteor"}) as response:
            assert response.status == 400
            assert "unknown fault 'meteor'" in (await response.json())["error"]["message"]


async def test_long_prefill_over_http_keeps_step_count_flat() -> None:
    """Through HTTP: during a long chunked prefill the step count is flat, KV usage rises."""
    config = SimConfig(
        max_num_batched_tokens=16, prefill_tokens_per_second=8000, max_model_len=32768
    )
    async with running_simulator(config) as sim, aiohttp.ClientSession(timeout=TIMEOUT) as s:
        payload = {"prompt": " ".join(["w"] * 30_000), "max_tokens": 2}
        request = asyncio.create_task(s.post(sim.url + "/v1/completions", json=payload))
        await asyncio.sleep(0.4)
        first = await read_metrics(s, sim.url)
        await asyncio.sleep(0.4)
        second = await read_metrics(s, sim.url)
        request.cancel()
        assert first[RUNNING] == second[RUNNING] == 1.0
        assert first[STEP_COUNT] == second[STEP_COUNT] == 0.0
        assert 0 < first[KV] < second[KV]
        assert sim.engine.steps > 50


async def test_busy_load_moves_step_count_and_tokens() -> None:
    """Concurrent decodes move iteration_tokens_total_count and generation_tokens_total."""
    async with (
        running_simulator(tokens_per_second=400) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        payload = {"prompt": "hello", "max_tokens": 1000, "ignore_eos": True}
        tasks = [
            asyncio.create_task(s.post(sim.url + "/v1/completions", json=payload)) for _ in range(3)
        ]
        await asyncio.sleep(0.3)
        first = await read_metrics(s, sim.url)
        await asyncio.sleep(0.3)
        second = await read_metrics(s, sim.url)
        for task in tasks:
            task.cancel()
        tokens = engine_sample("vllm:generation_tokens_total")
        assert second[STEP_COUNT] > first[STEP_COUNT] > 0
        assert second[tokens] > first[tokens] > 0
        assert second[RUNNING] == 3.0


async def test_api_server_count_two_hides_process_series_until_first_request() -> None:
    """Multiprocess mode: no process_/python_/_created series; gauges unsampled until work."""
    async with (
        running_simulator(api_server_count=2, tokens_per_second=1000) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        before = await read_metrics(s, sim.url)
        assert not [k for k in before if k.startswith(("process_", "python_"))]
        assert not [k for k in before if "_created" in k]
        assert RUNNING not in before
        assert KV not in before
        async with s.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}):
            pass
        after = await read_metrics(s, sim.url)
        assert after[RUNNING] == 0.0
        assert engine_sample("vllm:num_requests_waiting") in after


async def test_data_parallel_two_engines_publish_two_series() -> None:
    """--data-parallel-size 2: engine label values 0 and 1; requests spread round-robin."""
    async with (
        running_simulator(data_parallel_size=2, tokens_per_second=2000) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        for _ in range(2):
            async with s.post(sim.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}):
                pass
        metrics = await read_metrics(s, sim.url)
        for engine in ("0", "1"):
            assert metrics[engine_sample("vllm:prompt_tokens_total", engine)] == 1.0
        assert engine_sample("vllm:prompt_tokens_total", "2") not in metrics


async def test_no_metrics_mode_has_only_process_families() -> None:
    """--no-metrics: /metrics has process_/python_ series and no vllm: family at all."""
    async with (
        running_simulator(metrics_enabled=False) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        async with s.get(sim.url + "/metrics") as response:
            text = await response.text()
        assert "vllm:" not in text
        assert "process_start_time_seconds" in text


async def test_sleep_and_wake_up() -> None:
    """/sleep?level=1 flips engine_sleep_state and refuses completions; /wake_up restores."""
    awake = "vllm:engine_sleep_state{engine=0,model_name=tiny,sleep_state=awake}"
    offloaded = "vllm:engine_sleep_state{engine=0,model_name=tiny,sleep_state=weights_offloaded}"
    async with (
        running_simulator(tokens_per_second=2000) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        assert (await read_metrics(s, sim.url))[awake] == 1.0
        async with s.post(sim.url + "/sleep?level=1") as response:
            assert response.status == 200
        asleep = await read_metrics(s, sim.url)
        assert (asleep[awake], asleep[offloaded]) == (0.0, 1.0)
        async with s.get(sim.url + "/is_sleeping") as response:
            assert (await response.json()) == {"is_sleeping": True}
        async with s.post(sim.url + "/v1/completions", json={"prompt": "x"}) as response:
            assert response.status == 503
        async with s.post(sim.url + "/wake_up") as response:
            assert response.status == 200
        assert (await read_metrics(s, sim.url))[awake] == 1.0
        async with s.post(sim.url + "/v1/completions", json={"prompt": "x"}) as response:
            assert response.status == 200


async def test_stats_count_completions_per_user_agent() -> None:
    """/sim/stats counts completion requests per User-Agent, and nothing for /metrics reads."""
    async with (
        running_simulator(tokens_per_second=2000) as sim,
        aiohttp.ClientSession(timeout=TIMEOUT) as s,
    ):
        for agent in ("stallwatch/0.1.0", "batch-job", "batch-job"):
            async with s.post(
                sim.url + "/v1/completions",
                json={"prompt": "x", "max_tokens": 1},
                headers={"User-Agent": agent},
            ):
                pass
        await read_metrics(s, sim.url)
        async with s.get(sim.url + "/sim/stats") as response:
            stats = await response.json()
        assert stats["completions_by_user_agent"] == {"stallwatch/0.1.0": 1, "batch-job": 2}
        assert stats["requests_total"] == 3
        assert stats["fault"] is None
