"""SGLang's decision table on payloads faithful to 0.5.23, its stale work gauges included."""

from __future__ import annotations

import pytest

from stallwatch.core.classify import State
from stallwatch.engines import profile_for
from tests.unit.engine_support import Case, check, drop, payload, read, set_sample

IDLE = payload("sglang-0.5.23-idle.txt")
BUSY_1 = payload("sglang-0.5.23-busy-1.txt")
BUSY_2 = payload("sglang-0.5.23-busy-2.txt")
SCHED = 'engine_type="unified",model_name="qwen",moe_ep_rank="0",pp_rank="0",tp_rank="0"'
PASSES = "sglang:cuda_graph_passes_total{" + SCHED + ',mode="%s"}'
RUNNING = "sglang:num_running_reqs{" + SCHED + "}"
IDLE_SECONDS = "sglang:scheduler_idle_seconds_total{" + SCHED + "}"
GENERATING = (
    'sglang:http_requests_active{endpoint="/v1/chat/completions",method="POST",'
    'engine_type="unified",model_name="qwen"}'
)


def prefill_chunk_only(text: str) -> str:
    """busy-2 where only one prefill chunk ran since busy-1 (a long chunked prefill)."""
    edited = set_sample(text, PASSES % "decode_cuda_graph", "1603.0")
    return set_sample(edited, PASSES % "prefill_none", "66.0")


CASES = [
    Case("busy: decode passes moved", BUSY_1, BUSY_2, State.BUSY, reason="cuda_graph_passes"),
    Case("long chunked prefill: one prefill pass", BUSY_1, prefill_chunk_only(BUSY_1), State.BUSY),
    Case("stalled: work, no pass, idle loop still", BUSY_2, BUSY_2, State.STALLED),
    Case("idle: the test request decides", IDLE, IDLE, State.IDLE, test_request_needed=True),
    Case(
        "restart: passes went down",
        BUSY_2,
        set_sample(BUSY_2, PASSES % "decode_cuda_graph", "40.0"),
        State.RESTARTED,
        restart=True,
        reason="went down",
    ),
    Case(
        "restart: the pass counter vanished (fresh multiprocess directory)",
        BUSY_2,
        drop(BUSY_2, "sglang:cuda_graph_passes_total"),
        State.RESTARTED,
        restart=True,
        reason="vanished",
    ),
    Case(
        "trap: running 0 while passes move is busy, not idle",
        set_sample(BUSY_1, RUNNING, "0.0"),
        set_sample(BUSY_2, RUNNING, "0.0"),
        State.BUSY,
        reason="in flight at the HTTP layer",
    ),
    Case(
        "trap: stale running gauge after the requests ended, idle loop turning",
        BUSY_2,
        set_sample(BUSY_2, IDLE_SECONDS, "4826.0"),
        State.IDLE,
        test_request_needed=True,
        reason="stale",
    ),
    Case(
        "trap: stale running gauge, no generation request in flight",
        BUSY_2,
        set_sample(BUSY_2, GENERATING, "0.0"),
        State.IDLE,
        test_request_needed=True,
        reason="no generation request in flight",
    ),
    Case(
        "trap: without the idle-loop counter, reads 15 s apart prove nothing",
        drop(BUSY_2, "sglang:scheduler_idle_seconds_total"),
        drop(BUSY_2, "sglang:scheduler_idle_seconds_total"),
        State.UNKNOWN,
        reason="30 s",
    ),
    Case(
        "without the idle-loop counter, reads 45 s apart do",
        drop(BUSY_2, "sglang:scheduler_idle_seconds_total"),
        drop(BUSY_2, "sglang:scheduler_idle_seconds_total"),
        State.STALLED,
        gap=45.0,
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_sglang_decision_table(case: Case) -> None:
    """Each SGLang pair lands in its row of the decision table."""
    check(case)


def test_passes_are_summed_over_mode_and_no_start_time_is_read() -> None:
    """The progress counter is the sum of every `mode`; the multiprocess payload has no start."""
    reading = read(BUSY_2, 0.0)
    [engine] = reading.engines
    assert reading.engine_kind == "sglang"
    assert engine.steps == 1643.0 + 65.0
    assert reading.process_start_time is None
    assert reading.inflight_requests == 4.0  # the /metrics scrape itself is not work


def with_priorities(text: str) -> str:
    """`text` as SGLang writes it with priority scheduling: each scheduler series twice more,
    once per priority, beside the total under `priority=""`."""
    lines: list[str] = []
    for line in text.splitlines():
        if line.startswith("sglang:") and SCHED in line:
            name, rest = line.split("{", 1)
            labels, value = rest.rsplit("} ", 1)
            lines.append(f'{name}{{{labels},priority=""}} {value}')
            half = float(value) / 2
            lines += [f'{name}{{{labels},priority="{p}"}} {half}' for p in ("0", "1")]
        else:
            lines.append(line)
    return "\n".join(lines) + "\n"


def test_priority_parts_are_not_counted_beside_their_totals() -> None:
    """With priority scheduling the totals are read, not totals plus every priority."""
    plain = read(BUSY_2, 0.0).engines
    split = read(with_priorities(BUSY_2), 0.0).engines
    assert split == plain
    assert split[0].running == 4.0


def test_priority_parts_are_summed_where_no_total_exists() -> None:
    """A counter written only per priority still counts: its parts are summed."""
    parts_only = "\n".join(
        line for line in with_priorities(BUSY_2).splitlines() if 'priority=""' not in line
    )
    [engine] = read(parts_only, 0.0).engines
    [plain] = read(BUSY_2, 0.0).engines
    assert engine.steps == plain.steps


def test_generation_backed_health_endpoints_are_never_safe() -> None:
    """/health and /health_generate run a generation: unsafe; /ping and /ready are safe."""
    profile = profile_for("sglang")
    unsafe = {endpoint.path for endpoint in profile.unsafe_endpoints}
    assert {"/health", "/health_generate"} <= unsafe
    assert not unsafe & profile.safe_paths
    assert {"/ping", "/ready"} <= profile.safe_paths
