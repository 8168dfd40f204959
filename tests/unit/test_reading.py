"""The reading parser against real vLLM payloads and hostile input."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stallwatch.core.reading import parse_reading
from tests.support.real_payloads import real_payload


def test_busy_payload_yields_the_engine_figures() -> None:
    """A real busy payload gives running, steps, tokens, completions and the start time."""
    reading = parse_reading(real_payload("vllm-0.32.0-cpu-busy-1.txt"), taken_at=10.0)
    assert reading.process_start_time == pytest.approx(1796017176.46)
    [engine] = reading.engines
    assert (engine.model_name, engine.engine) == ("tiny", "0")
    assert engine.running == 4.0
    assert engine.waiting == 0.0
    assert engine.steps == 690.0
    assert engine.generation_tokens == 2730.0
    assert engine.prompt_tokens == 6086.0
    assert engine.requests_completed == 4.0  # summed over finished_reason
    assert engine.awake == 1.0
    assert engine.kv_cache_usage == pytest.approx(0.003296300817970943)
    assert reading.malformed_lines == 0
    assert reading.taken_at == 10.0


def test_idle_payload_has_no_work() -> None:
    """A fresh idle server reads zero running and waiting."""
    reading = parse_reading(real_payload("vllm-0.32.0-cpu-idle-1.txt"), taken_at=0.0)
    assert reading.running == 0.0
    assert reading.waiting == 0.0
    assert reading.has_engines


def test_llamacpp_payload_is_read_by_its_own_profile_not_as_vllm() -> None:
    """`auto` recognises llama.cpp's families; forced to vLLM they are no engine series."""
    payload = real_payload("llamacpp-0c1e57098-cpu-busy-1.txt")
    reading = parse_reading(payload, taken_at=0.0)
    assert reading.engine_kind == "llamacpp"
    assert [(e.running, e.steps) for e in reading.engines] == [(2.0, 1206.0)]
    assert not parse_reading(payload, taken_at=0.0, kind="vllm").has_engines


def test_data_parallel_engines_are_read_separately() -> None:
    """Each `engine` label value becomes its own sample."""
    payload = "\n".join(
        [
            'vllm:num_requests_running{engine="0",model_name="m"} 2',
            'vllm:num_requests_running{engine="1",model_name="m"} 0',
            'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 10',
            'vllm:iteration_tokens_total_count{engine="1",model_name="m"} 7',
        ]
    )
    reading = parse_reading(payload, taken_at=0.0)
    assert [(e.engine, e.running, e.steps) for e in reading.engines] == [
        ("0", 2.0, 10.0),
        ("1", 0.0, 7.0),
    ]
    assert reading.running == 2.0


def test_multiprocess_payload_without_gauge_samples_reads_unknown() -> None:
    """Gauges without a sample are None (unknown), not zero and not an error."""
    payload = (
        "# HELP vllm:num_requests_running Number of requests in model execution batches.\n"
        "# TYPE vllm:num_requests_running gauge\n"
        'vllm:generation_tokens_total{engine="0",model_name="m"} 0.0\n'
    )
    reading = parse_reading(payload, taken_at=0.0)
    [engine] = reading.engines
    assert engine.running is None
    assert reading.running is None
    assert reading.process_start_time is None


def test_garbled_lines_are_counted_and_skipped() -> None:
    """Broken wanted lines are counted; the good ones are still read."""
    payload = "\n".join(
        [
            'vllm:num_requests_running{engine="0",model_name="m" 3',
            'vllm:num_requests_waiting{engine="0",model_name="m"} banana',
            'vllm:iteration_tokens_total_count{engine="0",model_name="m"} 5',
            "process_start_time_seconds",
            "\x00\x01\x02 garbage",
        ]
    )
    reading = parse_reading(payload, taken_at=0.0)
    assert reading.malformed_lines == 3
    [engine] = reading.engines
    assert engine.steps == 5.0
    assert engine.running is None


def test_escaped_label_values_and_timestamps() -> None:
    """Escaped quotes in label values and trailing timestamps are handled."""
    payload = 'vllm:num_requests_running{model_name="a\\"b",engine="0"} 1 1700000000000\n'
    [engine] = parse_reading(payload, taken_at=0.0).engines
    assert engine.model_name == 'a"b'
    assert engine.running == 1.0


def test_non_finite_values_are_treated_as_missing() -> None:
    """NaN and Inf samples do not become figures."""
    payload = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} NaN\n'
        'vllm:num_requests_running{engine="0",model_name="m"} +Inf\n'
        'vllm:num_requests_waiting{engine="0",model_name="m"} 0\n'
    )
    [engine] = parse_reading(payload, taken_at=0.0).engines
    assert engine.kv_cache_usage is None
    assert engine.running is None


def test_unknown_families_are_ignored() -> None:
    """Families the decision does not need change nothing."""
    base = real_payload("vllm-0.32.0-cpu-busy-1.txt")
    extra = "".join(
        f'# TYPE vllm:future_metric_{i} gauge\nvllm:future_metric_{i}{{engine="0"}} {i}\n'
        for i in range(500)
    )
    assert parse_reading(base + extra, taken_at=0.0) == parse_reading(base, taken_at=0.0)


def test_huge_payload_is_read() -> None:
    """A payload of many models and engines (megabytes) is read completely."""
    lines = []
    for model in range(50):
        for engine in range(8):
            labels = f'engine="{engine}",model_name="model-{model}"'
            lines.append(f"vllm:num_requests_running{{{labels}}} {engine}")
            lines.append(f"vllm:iteration_tokens_total_count{{{labels}}} {model * 100 + engine}")
            lines.extend(f"vllm:other_{i}{{{labels}}} 1" for i in range(200))
    reading = parse_reading("\n".join(lines), taken_at=0.0)
    assert len(reading.engines) == 400
    assert reading.running == 50 * sum(range(8))


@settings(max_examples=300, deadline=None)
@given(st.text())
def test_any_text_parses_without_raising(payload: str) -> None:
    """Arbitrary text never raises: a garbled payload is a state, not a crash."""
    reading = parse_reading(payload, taken_at=0.0)
    assert reading.malformed_lines >= 0


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.sampled_from(
            [
                "vllm:num_requests_running",
                "{",
                "}",
                '"',
                "=",
                " ",
                "1",
                "\\",
                'engine="0"',
                ",",
                "\n",
                "process_start_time_seconds",
            ]
        )
    )
)
def test_near_miss_lines_parse_without_raising(parts: list[str]) -> None:
    """Fragments of real lines glued at random never raise."""
    parse_reading("".join(parts), taken_at=0.0)
