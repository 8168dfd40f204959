"""The engine model reproduces vLLM V1's scheduling and metric semantics under a fake clock."""

from __future__ import annotations

from stallwatch.simulator.engine import Engine, EngineConfig, SimRequest
from stallwatch.simulator.engine_stats import build_1_2_5_buckets
from stallwatch.simulator.metrics import load_families

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV = "vllm:kv_cache_usage_perc"
STEPS = "vllm:iteration_tokens_total"


def make_engine(**overrides: object) -> Engine:
    config = EngineConfig(**overrides)  # type: ignore[arg-type]
    return Engine(config, load_families(), now=0.0)


def test_long_prefill_keeps_step_count_flat_while_kv_usage_rises() -> None:
    """A 30 000-token prompt in 16-token chunks: count and totals flat, running 1, KV rising."""
    engine = make_engine(
        max_num_batched_tokens=16, prefill_tokens_per_second=2000.0, max_model_len=32768
    )
    engine.submit(SimRequest("long", 30_000, 4, True, 0.0), 0.0)
    engine.advance_to(1.0)
    histogram = engine.stats.histograms[STEPS]
    first_kv = engine.stats.gauges[KV]
    assert engine.steps > 100
    assert histogram.count == 0
    assert engine.stats.gauges[RUNNING] == 1.0
    engine.advance_to(3.0)
    assert histogram.count == 0
    assert engine.stats.counters["vllm:prompt_tokens"] == 0
    assert engine.stats.counters["vllm:generation_tokens"] == 0
    second_kv = engine.stats.gauges[KV]
    assert first_kv is not None
    assert second_kv is not None
    assert 0 < first_kv < second_kv


def test_prefill_completion_lands_in_one_observation() -> None:
    """When the prefill finishes, the prompt is counted once and the step count moves by one."""
    engine = make_engine(max_num_batched_tokens=64, tokens_per_second=1000.0)
    engine.submit(SimRequest("r", 1000, 1, True, 0.0), 0.0)
    events = engine.advance_to(10.0)
    histogram = engine.stats.histograms[STEPS]
    assert engine.steps == 16
    assert histogram.count == 1
    assert histogram.total == 1001
    assert engine.stats.counters["vllm:prompt_tokens"] == 1000
    assert [e.finish_reason for e in events] == ["length"]
    assert engine.stats.labelled_counters["vllm:request_success"]["length"] == 1


def test_busy_decode_moves_step_count_and_generated_tokens() -> None:
    """Decoding requests move the step count and generation_tokens_total every step."""
    engine = make_engine(tokens_per_second=100.0)
    for index in range(4):
        engine.submit(SimRequest(f"r{index}", 10, 1000, True, 0.0), 0.0)
    engine.advance_to(1.0)
    count_1 = engine.stats.histograms[STEPS].count
    tokens_1 = engine.stats.counters["vllm:generation_tokens"]
    engine.advance_to(2.0)
    assert engine.stats.histograms[STEPS].count > count_1 > 0
    # Aggregate speed: about 100 tokens per simulated second shared by 4 requests.
    assert 90 <= engine.stats.counters["vllm:generation_tokens"] - tokens_1 <= 110
    assert engine.stats.gauges[RUNNING] == 4.0


def test_slot_limit_queues_requests_and_gauges_freeze_when_idle() -> None:
    """Beyond max_num_seqs requests wait; when work ends the gauges keep their last values."""
    engine = make_engine(max_num_seqs=2, tokens_per_second=100.0)
    for index in range(3):
        engine.submit(SimRequest(f"r{index}", 5, 5, True, 0.0), 0.0)
    engine.advance_to(0.001)
    assert engine.stats.gauges[RUNNING] == 2.0
    assert engine.stats.gauges[WAITING] == 1.0
    engine.advance_to(10.0)
    assert not engine.has_work()
    steps = engine.steps
    last = dict(engine.stats.gauges)
    engine.advance_to(20.0)
    assert engine.steps == steps
    assert engine.stats.gauges == last
    assert engine.stats.labelled_counters["vllm:request_success"]["length"] == 3
    assert engine.stats.histograms["vllm:e2e_request_latency_seconds"].count == 3


def test_full_kv_cache_preempts_a_request() -> None:
    """When the KV cache cannot hold every running request, one is preempted and counted."""
    engine = make_engine(kv_cache_tokens=512, max_num_batched_tokens=4096, tokens_per_second=1e4)
    engine.submit(SimRequest("a", 300, 50, True, 0.0), 0.0)
    engine.submit(SimRequest("b", 300, 50, True, 0.0), 0.0)
    engine.advance_to(0.001)
    assert engine.stats.counters["vllm:num_preemptions"] >= 1


def test_requests_without_ignore_eos_can_stop() -> None:
    """Without ignore_eos a request may finish with reason stop (EOS sampled)."""
    engine = make_engine(eos_probability=1.0, tokens_per_second=1000.0)
    engine.submit(SimRequest("r", 5, 100, False, 0.0), 0.0)
    events = engine.advance_to(1.0)
    assert [e.finish_reason for e in events] == ["stop"]
    assert engine.stats.labelled_counters["vllm:request_success"]["stop"] == 1


def test_bucket_rule_matches_vllm() -> None:
    """build_1_2_5_buckets(2048) ends at 2000, like the captured payload."""
    assert build_1_2_5_buckets(2048)[-3:] == (500.0, 1000.0, 2000.0)
    assert build_1_2_5_buckets(32768)[-1] == 20000.0


def test_context_overflow_messages_follow_vllm() -> None:
    """Too-long requests are refused like vLLM: by characters first, else with a token bound."""
    from stallwatch.simulator.api import context_overflow

    assert context_overflow(32, 8, 24, prompt_chars=100) is None
    by_chars = context_overflow(32768, 100, 40_000, prompt_chars=196_775)
    assert by_chars is not None
    message, param = by_chars
    assert param == "input_text"
    assert "your prompt contains 196775 characters (more than 163340 characters" in message
    assert message.endswith("(parameter=input_text, value=196775)")
    by_tokens = context_overflow(2048, 100, 3000, prompt_chars=3000)
    assert by_tokens is not None
    message, param = by_tokens
    assert param == "input_tokens"
    assert "at least 1949 input tokens, for a total of at least 2049 tokens" in message
