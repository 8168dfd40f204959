"""The exporter's side of the engine profiles: the engine label, the test request, `--kind`."""

from __future__ import annotations

import argparse

from stallwatch.common.exporter_config import TargetConfig, exporter_config_from_mapping
from stallwatch.core.classify import State, Verdict
from stallwatch.core.history import PollOutcome, TargetHistory
from stallwatch.core.reading import parse_reading
from stallwatch.exporter import check_cli
from stallwatch.exporter.collector import engine_label
from stallwatch.net.fetch import idle_request_body
from tests.unit.engine_support import payload


def history_with(text: str | None, state: State) -> TargetHistory:
    reading = parse_reading(text, taken_at=0.0) if text is not None else None
    outcome = PollOutcome(Verdict(state, "test"), reading, finished_at=0.0, duration_seconds=0.0)
    return TargetHistory().advance(outcome)


def test_engine_label_says_what_auto_chose() -> None:
    """Under `auto` the label is the recognised engine, `none` without metrics, empty before."""
    target = TargetConfig(name="t", url="http://127.0.0.1:1")
    assert target.kind == "auto"
    busy = history_with(payload("sglang-0.5.23-busy-1.txt"), State.BUSY)
    assert engine_label(target, busy) == "sglang"
    assert engine_label(target, history_with(None, State.NO_METRICS)) == "none"
    assert engine_label(target, TargetHistory()) == ""


def test_engine_label_of_a_forced_kind_and_a_proxy() -> None:
    """A forced kind is its own label before any read; a proxy is `proxy`."""
    forced = TargetConfig(name="t", url="http://127.0.0.1:1", kind="tgi")
    assert engine_label(forced, TargetHistory()) == "tgi"
    proxy = TargetConfig(name="p", url="http://127.0.0.1:1", kind="proxy")
    assert engine_label(proxy, TargetHistory()) == "proxy"


def test_test_request_without_a_model_name_leaves_the_field_out() -> None:
    """llama.cpp and TGI publish no model name: the request names none, max_tokens stays 1."""
    path, body = idle_request_body("", "completions")
    assert path == "/v1/completions"
    assert "model" not in body
    assert body["max_tokens"] == 1
    assert idle_request_body("tiny", "chat")[1]["model"] == "tiny"


def test_config_kind_defaults_to_auto_and_sets_the_metrics_path() -> None:
    """`kind` defaults to auto; trtllm reads /prometheus/metrics unless told otherwise."""
    config = exporter_config_from_mapping(
        {
            "targets": [
                {"name": "a", "url": "http://127.0.0.1:1"},
                {"name": "b", "url": "http://127.0.0.1:2", "kind": "trtllm"},
                {"name": "c", "url": "http://127.0.0.1:3", "kind": "trtllm", "metrics_path": "/m"},
            ]
        },
        "test.yml",
    )
    a, b, c = config.targets
    assert (a.kind, a.metrics_path) == ("auto", "/metrics")
    assert b.metrics_url == "http://127.0.0.1:2/prometheus/metrics"
    assert c.metrics_path == "/m"


def test_check_accepts_every_kind() -> None:
    """`stallwatch check --kind` takes auto (the default) and every engine."""
    parser = argparse.ArgumentParser()
    check_cli.register(parser.add_subparsers())
    assert parser.parse_args(["check", "http://x"]).kind == "auto"
    for kind in ("vllm", "sglang", "tgi", "llamacpp", "lmdeploy", "trtllm", "triton", "proxy"):
        assert parser.parse_args(["check", "http://x", "--kind", kind]).kind == kind
