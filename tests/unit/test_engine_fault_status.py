"""An engine's own fault tolerance (vLLM `--enable-fault-tolerance`) read where it costs no slot:
a faulted engine held for its orchestrator is neither tested nor called stalled."""

from __future__ import annotations

from dataclasses import replace

import pytest

from stallwatch.core.classify import State, Verdict, held_by_engine_fault_tolerance
from stallwatch.engines import profile_for
from stallwatch.engines.profile import FaultStatus, faulted_engines

CHECK = FaultStatus("/fault_tolerance/status")
# vllm 0.33 v1/engine/core_client.py `get_status` and engine_core_sentinel.py `_push_status`.
HEALTHY = {"schema_version": 1, "total_engines": 2, "engines": [
    {"id": 0, "status": "healthy"},
    {"id": 1, "status": "healthy"},
]}  # fmt: skip
FAULTED = {"schema_version": 1, "total_engines": 2, "engines": [
    {"id": 0, "status": "healthy"},
    {"id": 1, "status": "unhealthy", "fault_info": "RuntimeError"},
]}  # fmt: skip


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        (HEALTHY, ()),
        (FAULTED, ("engine 1 unhealthy (RuntimeError)",)),
        ({"engines": [{"id": 3, "status": "dead"}]}, ("engine 3 dead",)),
        ({"detail": "Not Found"}, ()),
        ({"engines": ["x", {"status": 5}]}, ()),
        ([], ()),
    ],
)
def test_faulted_engines_reads_vllms_status_document(
    document: object, expected: tuple[str, ...]
) -> None:
    """Only engines reported other than healthy count; anything else says nothing."""
    assert faulted_engines(CHECK, document) == expected


def test_a_stall_the_engine_holds_for_recovery_is_unknown() -> None:
    """Stalled, but the engine says it faulted and waits for recovery: unknown, no restart."""
    stalled = Verdict(State.STALLED, "work present and no progress signal moved", running=2)
    held = held_by_engine_fault_tolerance(stalled, ("engine 0 unhealthy (RuntimeError)",))
    assert held.state == State.UNKNOWN
    assert "fault tolerance holds engine 0 unhealthy" in held.reason


def test_an_idle_test_request_to_a_held_engine_is_not_sent() -> None:
    """Gauges at 0 (its requests aborted) and a faulted engine: no test request."""
    idle = Verdict(State.IDLE, "no work and nothing completed", test_request_needed=True)
    held = held_by_engine_fault_tolerance(idle, ("engine 0 unhealthy",))
    assert held.state == State.UNKNOWN
    assert not held.test_request_needed


@pytest.mark.parametrize("state", [State.BUSY, State.IDLE, State.UNKNOWN])
def test_other_verdicts_and_healthy_engines_are_left_alone(state: State) -> None:
    """Nothing changes when no engine is faulted, or the verdict is neither a stall nor a test."""
    verdict = Verdict(state, "as read")
    assert held_by_engine_fault_tolerance(verdict, ("engine 0 dead",)) == verdict
    stalled = replace(verdict, state=State.STALLED)
    assert held_by_engine_fault_tolerance(stalled, ()) == stalled


def test_vllm_reads_its_fault_status_on_a_safe_path_and_never_applies_a_recovery() -> None:
    """The status path is safe (a cache in the API server); `/fault_tolerance/apply` is not."""
    profile = profile_for("vllm")
    assert profile.fault_status is not None
    assert profile.fault_status.path in profile.safe_paths
    assert "/fault_tolerance/apply" in profile.unsafe_paths
