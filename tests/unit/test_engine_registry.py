"""The engine registry: one shape for every profile, and `kind: auto` recognising each engine."""

from __future__ import annotations

import pytest

from stallwatch.core.reading import parse_reading
from stallwatch.engines import ENGINE_KINDS, OLLAMA, PROFILES, TARGET_KINDS
from tests.support.real_payloads import real_payload
from tests.unit.engine_support import payload

SAMPLES = [
    ("vllm", real_payload("vllm-0.32.0-cpu-busy-1.txt")),
    ("sglang", payload("sglang-0.5.23-busy-1.txt")),
    ("tgi", payload("tgi-3.3.7-busy-1.txt")),
    ("llamacpp", payload("llamacpp-b10434-busy-1.txt")),
    ("lmdeploy", payload("lmdeploy-0.18.0-busy-1.txt")),
    ("trtllm", payload("trtllm-busy-1.txt")),
    ("triton", payload("triton-trtllm-busy-1.txt")),
]


@pytest.mark.parametrize(("kind", "text"), SAMPLES, ids=[kind for kind, _ in SAMPLES])
def test_auto_recognises_the_engine(kind: str, text: str) -> None:
    """`auto` reads each engine's payload with that engine's profile and finds work."""
    reading = parse_reading(text, taken_at=0.0)
    assert reading.engine_kind == kind
    assert reading.running
    assert reading.running > 0


@pytest.mark.parametrize(("kind", "text"), SAMPLES, ids=[kind for kind, _ in SAMPLES])
def test_forced_kind_reads_only_its_engine(kind: str, text: str) -> None:
    """A forced kind reads its own engine and nothing of another engine's payload."""
    assert parse_reading(text, taken_at=0.0, kind=kind).engine_kind == kind
    other = next(k for k in ENGINE_KINDS if k != kind)
    assert not parse_reading(text, taken_at=0.0, kind=other).has_engines


def test_every_engine_kind_has_a_profile_and_auto_is_the_first_kind() -> None:
    """The config's kinds are auto, every profile, and proxy."""
    assert ("auto", *PROFILES, "proxy") == TARGET_KINDS
    assert set(ENGINE_KINDS) == {
        "vllm",
        "sglang",
        "tgi",
        "llamacpp",
        "lmdeploy",
        "trtllm",
        "triton",
    }


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_profiles_are_consistent(kind: str) -> None:
    """No endpoint is both safe and unsafe, metrics are read from a safe path, and each
    profile can say what stays flat while legitimate and how a restart shows."""
    profile = PROFILES[kind]
    unsafe = {endpoint.path for endpoint in profile.unsafe_endpoints}
    assert not unsafe & profile.safe_paths
    assert profile.metrics_path in profile.safe_paths
    assert profile.flat_while_legit
    assert profile.restart_signal
    for path in profile.test_paths & {"/v1/completions"}:
        assert path in profile.safe_paths
    for role in profile.stall_evidence:
        assert role in profile.role_names


def test_ollama_has_no_metrics_and_is_never_an_engine_kind() -> None:
    """Ollama is documented (safe endpoints) but no payload is read as it."""
    assert "ollama" not in PROFILES
    assert not OLLAMA.series
    assert OLLAMA.stall_unprovable


def test_every_profile_has_a_simulator_flavour_or_says_why_not() -> None:
    """Each engine profile is played by the simulator, or listed with why it is not."""
    from stallwatch.simulator.engines import ENGINES, WITHOUT_A_FLAVOUR

    assert set(ENGINES) <= set(PROFILES), sorted(set(ENGINES) - set(PROFILES))
    assert set(PROFILES) - set(ENGINES) == set(WITHOUT_A_FLAVOUR)
    assert all(WITHOUT_A_FLAVOUR.values())
