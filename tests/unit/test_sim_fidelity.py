"""The simulator's /metrics payload has the same shape as real vLLM 0.32 payloads."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.simulator.engine import Engine, EngineConfig, SimRequest
from stallwatch.simulator.metrics import (
    CONTENT_TYPE,
    EngineView,
    RenderOptions,
    load_families,
    render_payload,
)
from tests.support.real_payloads import REAL_METRICS

FIXTURES = REAL_METRICS
PREFIXES = ("vllm:", "process_", "python_")
Shape = dict[str, tuple[str, frozenset[str], tuple[float, ...]]]


def shape(text: str) -> Shape:
    """Family name -> (type, label names, histogram bounds) for the compared families."""
    result: Shape = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(PREFIXES):
            continue
        labels: set[str] = set()
        bounds: set[float] = set()
        for sample in family.samples:
            labels.update(sample.labels)
            if sample.name.endswith("_bucket"):
                bounds.add(float(sample.labels["le"]))
        result[family.name] = (family.type, frozenset(labels), tuple(sorted(bounds)))
    return result


def simulated_payload(busy: bool, max_model_len: int = 2048) -> str:
    engine = Engine(EngineConfig(max_model_len=max_model_len), load_families(), now=1000.0)
    if busy:
        engine.submit(SimRequest("r1", 40, 8, True, 1000.0), 1000.0)
        engine.advance_to(1010.0)
    view = EngineView("0", engine.stats, engine.sleep_level, 1_048_576)
    return render_payload([view], RenderOptions("tiny", False, True, 999.0))


def fixture_files() -> list[Path]:
    files = sorted(FIXTURES.glob("vllm-0.32.0-*.txt"))
    assert files, f"no vLLM fixtures found in {FIXTURES}"
    return files


@pytest.mark.parametrize("busy", [False, True])
def test_payload_matches_every_vllm_fixture(busy: bool) -> None:
    """Family names, types, label names and bucket bounds equal those of each real payload."""
    for path in fixture_files():
        # The captured servers ran with the tiny model's 2048 context, or --max-model-len 32768.
        max_model_len = 32768 if "chunked-prefill" in path.name else 2048
        simulated = shape(simulated_payload(busy, max_model_len))
        real = shape(path.read_text(encoding="utf-8"))
        missing = sorted(set(real) - set(simulated))
        extra = sorted(set(simulated) - set(real))
        assert not missing, f"{path.name}: families missing from the simulator: {missing}"
        assert not extra, f"{path.name}: families the real server lacks: {extra}"
        for name, real_shape in real.items():
            assert simulated[name] == real_shape, f"{path.name}: {name} differs"


def test_help_texts_match_the_fixture() -> None:
    """Every vllm: family has the same HELP text as the real payload."""
    real = {
        f.name: f.documentation
        for f in text_string_to_metric_families(fixture_files()[0].read_text(encoding="utf-8"))
        if f.name.startswith("vllm:")
    }
    simulated = {
        f.name: f.documentation
        for f in text_string_to_metric_families(simulated_payload(busy=True))
        if f.name.startswith("vllm:")
    }
    assert simulated == real


def test_content_type_is_the_one_vllm_sends() -> None:
    """The exposition content type is vLLM 0.32's (prometheus_client 0.26)."""
    readme = (FIXTURES / "README.md").read_text(encoding="utf-8")
    assert f"content-type: {CONTENT_TYPE}" in readme


def test_multiprocess_payload_has_no_process_series_and_no_created() -> None:
    """api-server-count > 1: no process_/python_ families, no _created, unset gauges unsampled."""
    engine = Engine(EngineConfig(), load_families(), now=1000.0)
    engine.stats.gauges["vllm:num_requests_running"] = None
    view = EngineView("0", engine.stats, 0, 1_048_576)
    text = render_payload([view], RenderOptions("tiny", True, True, 999.0))
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert not [n for n in families if n.startswith(("process_", "python_"))]
    assert not [n for n in families if n.endswith("_created")]
    assert families["vllm:num_requests_running"].samples == []
    assert families["vllm:prompt_tokens"].samples[0].name == "vllm:prompt_tokens_total"
