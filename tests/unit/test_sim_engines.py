"""The non-vLLM engine models of the simulator, driven by a fake clock (no sockets)."""

from __future__ import annotations

import re

import pytest

from stallwatch.simulator.config import SimConfig
from stallwatch.simulator.engine import SimRequest
from stallwatch.simulator.engines.llamacpp import LlamaCppFlavour, cpp_stream_number
from stallwatch.simulator.engines.sglang import DECODE_LOG_INTERVAL, SglangFlavour
from stallwatch.simulator.server import SimServer


class FakeClock:
    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _server(engine: str, **overrides: object) -> tuple[SimServer, FakeClock]:
    clock = FakeClock()
    config = SimConfig(engine=engine, max_num_seqs=4, tokens_per_second=100.0, **overrides)  # type: ignore[arg-type]
    return SimServer(config, clock=clock), clock


def _submit(
    server: SimServer, clock: FakeClock, count: int, prompt: int = 8, tokens: int = 500
) -> None:
    for index in range(count):
        request = SimRequest(f"r{index}", prompt, tokens, True, clock.now)
        server.engines[0].submit(request, clock.now)


def _advance(server: SimServer, clock: FakeClock, seconds: float, step: float = 0.01) -> None:
    end = clock.now + seconds
    while clock.now < end:
        clock.now += step
        server.tick(clock.now)


def _value(body: str, name: str, labels: str = "") -> str:
    match = re.search(rf"^{re.escape(name + labels)}(?:{{[^}}]*}})? (\S+)$", body, re.MULTILINE)
    assert match is not None, f"{name} not in payload"
    return match.group(1)


def test_cpp_stream_number_prints_six_significant_digits() -> None:
    """Values print as `std::stringstream` does: 6 significant digits, exponent past a million."""
    assert cpp_stream_number(0.0) == "0"
    assert cpp_stream_number(2.0) == "2"
    assert cpp_stream_number(140.3594) == "140.359"
    assert cpp_stream_number(12_000_000.0) == "1.2e+07"
    assert cpp_stream_number(12_000_049.0) == "1.2e+07"
    assert cpp_stream_number(1_234_567.0) == "1.23457e+06"


def test_llamacpp_counters_above_ten_million_hide_small_progress_that_slots_show() -> None:
    """At n_decode 1.2e7 a second of decoding leaves /metrics identical; /slots still moves."""
    server, clock = _server("llamacpp", initial_decodes=12_000_000)
    flavour = server.flavour
    assert isinstance(flavour, LlamaCppFlavour)
    _submit(server, clock, 4)
    _advance(server, clock, 0.2)
    before = _value(flavour.render().body, "llamacpp:n_decode_total")
    decoded_before = sum(r.generated for r in server.engines[0].running)
    _advance(server, clock, 0.3)
    after = _value(flavour.render().body, "llamacpp:n_decode_total")
    decoded_after = sum(r.generated for r in server.engines[0].running)

    assert before == after == "1.2e+07"
    assert decoded_after > decoded_before
    assert flavour.n_decode > 12_000_000


def test_llamacpp_prompt_tokens_wait_for_output_and_predictions_for_the_end() -> None:
    """A long prefill moves n_decode only; tokens_predicted_total moves when requests end."""
    server, clock = _server("llamacpp", max_num_batched_tokens=64, prefill_tokens_per_second=640.0)
    flavour = server.flavour
    assert isinstance(flavour, LlamaCppFlavour)
    server.engines[0].submit(SimRequest("long", 2_000, 4, True, clock.now), clock.now)
    _advance(server, clock, 0.5)
    prefilling = flavour.render().body
    _advance(server, clock, 5.0)
    done = flavour.render().body

    assert float(_value(prefilling, "llamacpp:n_decode_total")) > 1
    assert _value(prefilling, "llamacpp:prompt_tokens_total") == "0"
    assert _value(prefilling, "llamacpp:requests_processing") == "1"
    assert _value(done, "llamacpp:prompt_tokens_total") == "2000"
    assert _value(done, "llamacpp:tokens_predicted_total") == "4"


def test_llamacpp_start_header_changes_on_restart_and_is_not_unix_time() -> None:
    """Process-Start-Time-Unix is monotonic microseconds: far from Unix time, new per boot."""
    server, _ = _server("llamacpp")
    assert isinstance(server.flavour, LlamaCppFlavour)
    first = dict(server.flavour.render().headers)["Process-Start-Time-Unix"]
    server.apply_fault("restart", {})
    second = dict(server.flavour.render().headers)["Process-Start-Time-Unix"]

    assert first != second
    assert int(first) > 0


def test_llamacpp_sleeps_after_idle_seconds() -> None:
    """With --sleep-idle-seconds the server falls asleep when idle and wakes for a request."""
    server, clock = _server("llamacpp", sleep_idle_seconds=2.0)
    flavour = server.flavour
    assert isinstance(flavour, LlamaCppFlavour)
    _advance(server, clock, 3.0, step=0.1)
    assert flavour.sleeping
    flavour.before_generation()
    assert not flavour.sleeping


def test_sglang_running_gauge_reads_zero_while_passes_move_until_the_log_interval() -> None:
    """After a prefill, running stays 0 for up to 40 decode steps while passes move."""
    server, clock = _server("sglang")
    flavour = server.flavour
    assert isinstance(flavour, SglangFlavour)
    _submit(server, clock, 2)
    _advance(server, clock, 0.05)  # the prefill and a few decode steps
    early = flavour.render().body
    assert flavour.decode_steps < DECODE_LOG_INTERVAL
    _advance(server, clock, 2.0)
    late = flavour.render().body

    assert _value(early, "sglang:num_running_reqs") == "0.0"
    assert float(_value(early, "sglang:cuda_graph_passes_total")) >= 1
    assert _value(late, "sglang:num_running_reqs") == "2.0"


def test_sglang_loop_heartbeat_moves_idle_and_freezes_when_hung() -> None:
    """scheduler_process_cpu_seconds_total moves while idle and stops under `hang`."""
    server, clock = _server("sglang")
    flavour = server.flavour
    assert isinstance(flavour, SglangFlavour)
    _advance(server, clock, 2.5, step=0.1)
    idle = flavour.cpu_seconds
    server.apply_fault("hang", {})
    _advance(server, clock, 3.0, step=0.1)

    assert idle > 0
    assert flavour.cpu_seconds == idle


def test_lmdeploy_gauges_refresh_every_ten_seconds() -> None:
    """LMDeploy's running gauge lags up to 10 s behind the engine."""
    server, clock = _server("lmdeploy")
    assert server.flavour is not None
    _submit(server, clock, 2, tokens=5_000)
    _advance(server, clock, 5.0, step=0.05)
    early = server.flavour.render().body
    _advance(server, clock, 6.0, step=0.05)
    late = server.flavour.render().body

    running = "lmdeploy:num_requests_running"
    assert _value(early, running) == "0.0"
    assert _value(late, running) == "2.0"


def test_trtllm_metrics_move_only_when_a_request_completes() -> None:
    """During a long generation every trtllm family is frozen; a completion moves them."""
    server, clock = _server("trtllm")
    assert server.flavour is not None
    server.engines[0].submit(SimRequest("long", 8, 10_000, True, clock.now), clock.now)
    server.engines[0].submit(SimRequest("short", 8, 20, True, clock.now), clock.now)
    _advance(server, clock, 0.1)
    first = server.flavour.render().body
    _advance(server, clock, 0.1)
    second = server.flavour.render().body
    _advance(server, clock, 1.0)
    after_completion = server.flavour.render().body

    assert first == second
    assert _value(second, "trtllm_num_requests_running") == "0.0"
    assert _value(after_completion, "trtllm_num_requests_completed_total") == "1.0"
    assert _value(after_completion, "trtllm_num_requests_running") == "1.0"


def test_triton_iteration_counter_moves_per_step() -> None:
    """Triton's iteration counter moves with every engine step of a long generation."""
    server, clock = _server("triton")
    assert server.flavour is not None
    server.engines[0].submit(SimRequest("long", 8, 10_000, True, clock.now), clock.now)
    _advance(server, clock, 0.1)
    first = server.flavour.render().body
    _advance(server, clock, 0.1)
    second = server.flavour.render().body

    name = "nv_trt_llm_general_metrics"
    label = '{general_type="iteration_counter",model="tensorrt_llm",version="1"}'
    assert float(_value(second, name, label)) > float(_value(first, name, label)) > 0


def test_unknown_engine_is_refused() -> None:
    """A server asked to play an engine the simulator lacks is refused, naming the known ones."""
    with pytest.raises(ValueError, match="unknown engine 'ollama'; known: vllm, sglang"):
        SimServer(SimConfig(engine="ollama"))
