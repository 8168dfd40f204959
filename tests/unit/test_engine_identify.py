"""`kind: auto` identifies the engine from `/v1/models` before it reads any metrics path."""

from __future__ import annotations

import json
from typing import Any

import pytest

from stallwatch.core.reading import Reading, known_engine, parse_reading
from stallwatch.engines import (
    DEFAULT_METRICS_PATH,
    PROFILES,
    auto_metrics_path,
    identify,
    model_owners,
    profile_for,
)
from tests.unit.engine_support import ENGINES, payload

ANSWERS: dict[str, Any] = json.loads((ENGINES / "v1-models.json").read_text(encoding="utf-8"))
CASES = sorted(name for name in ANSWERS if not name.startswith("_"))


@pytest.mark.parametrize("name", CASES)
def test_each_engine_answer_identifies_its_engine_or_none(name: str) -> None:
    """Each engine's `/v1/models` answer (from its source) names its profile, or none."""
    answer = ANSWERS[name]
    owners = model_owners(answer["body"]) or ()
    assert identify(answer["status"], owners) == answer["expect"], answer["source"]


def test_every_engine_whose_default_metrics_path_is_unsafe_names_itself() -> None:
    """An engine that never names itself must keep `/metrics` safe, or auto would read it."""
    for kind, profile in PROFILES.items():
        if DEFAULT_METRICS_PATH in profile.unsafe_paths:
            assert profile.owned_by, f"{kind}: /metrics is unsafe, yet /v1/models names nothing"
            assert profile.metrics_path not in profile.unsafe_paths


def test_no_two_profiles_claim_the_same_owner() -> None:
    """An `owned_by` value names one engine only."""
    claimed = [owner for profile in PROFILES.values() for owner in profile.owned_by]
    assert len(claimed) == len(set(claimed))


@pytest.mark.parametrize("kind", sorted(PROFILES))
def test_auto_never_reads_a_path_the_identified_engine_marks_unsafe(kind: str) -> None:
    """Whatever path is configured, auto reads none the identified engine marks unsafe."""
    profile = profile_for(kind)
    for configured in (DEFAULT_METRICS_PATH, profile.metrics_path, *profile.unsafe_paths):
        assert auto_metrics_path(kind, configured) not in profile.unsafe_paths


def test_trtllm_identified_reads_the_prometheus_path() -> None:
    """trtllm-serve identified: `/prometheus/metrics`, never its JSON `/metrics`."""
    assert auto_metrics_path("trtllm", "/metrics") == "/prometheus/metrics"
    assert auto_metrics_path(None, "/metrics") == "/metrics"
    assert auto_metrics_path("vllm", "/custom/metrics") == "/custom/metrics"


def test_model_owners_refuses_what_is_no_model_list() -> None:
    """Only an object with a `data` list is a model list; cards without `owned_by` name none."""
    assert model_owners({"data": [{"id": "m"}, {"owned_by": 3}, "x"]}) == ()
    assert model_owners({"error": "Unauthorized"}) is None
    assert model_owners(["data"]) is None
    assert identify(200, ()) is None
    assert identify(500, ("tensorrt_llm",)) is None


def _reading(at: float, kind: str = "trtllm") -> Reading:
    return parse_reading(payload("trtllm-idle.txt"), taken_at=at, kind=kind)


def test_the_previous_poll_reading_spares_the_next_identification() -> None:
    """A reading from the previous poll names the engine: no `/v1/models` again."""
    assert known_engine(_reading(100.0), 115.0, 15.0) == "trtllm"


@pytest.mark.parametrize(
    ("baseline", "now", "why"),
    [
        (None, 115.0, "no reading yet"),
        (Reading(taken_at=100.0), 115.0, "no engine in the reading"),
        (_reading(100.0), 130.5, "a poll since gave no reading: the process may have changed"),
        (_reading(100.0), 99.0, "the clock went back"),
    ],
)
def test_auto_identifies_again_without_a_fresh_reading(
    baseline: Reading | None, now: float, why: str
) -> None:
    """Without the previous poll's reading of an engine, auto asks `/v1/models` again."""
    assert known_engine(baseline, now, 15.0) is None, why
