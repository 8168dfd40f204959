"""Expositions Prometheus reads are read alike by stallwatch: blanks between the name and `{`,
tabs between the parts of a sample, Unicode line separators inside a label value; each case is
first checked with `promtool check metrics`."""

from __future__ import annotations

import subprocess

import pytest

from stallwatch.core.reading import parse_reading
from tests.support.tools import promtool

# One sample line each, `NAME` standing for the series name (vLLM's has a colon, which
# promtool's linter flags, so promtool checks the same line under a name without one).
CASES = {
    "space-before-brace": 'NAME {model_name="m",engine="0"} 3',
    "tab-before-brace": 'NAME\t{model_name="m",engine="0"}\t3',
    "tab-before-value": 'NAME{model_name="m",engine="0"}\t3',
    "tab-between-labels": 'NAME{model_name="m",\tengine="0"} 3',
    "blanks-everywhere": 'NAME \t{ model_name="m" ,\tengine="0" }\t 3',
    "line-separator-in-value": 'NAME{model_name="m\u2028x",engine="0"} 3',
    "paragraph-separator-in-value": 'NAME{model_name="m\u2029x",engine="0"} 3',
    "next-line-in-value": 'NAME{model_name="m\u0085x",engine="0"} 3',
}
PROMTOOL_NAME = "vllm_num_requests_running"
VLLM_NAME = "vllm:num_requests_running"


def _exposition(line: str, name: str) -> str:
    return (
        f"# HELP {name} Number of requests in model execution batches.\n"
        f"# TYPE {name} gauge\n{line.replace('NAME', name)}\n"
    )


@pytest.mark.parametrize("line", CASES.values(), ids=CASES.keys())
def test_promtool_reads_the_case(line: str) -> None:
    """promtool check metrics accepts the exposition: it is one Prometheus reads."""
    result = subprocess.run(
        [promtool(), "check", "metrics"],
        input=_exposition(line, PROMTOOL_NAME).encode(),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("line_by_line", [False, True], ids=["searched", "line-by-line"])
@pytest.mark.parametrize("line", CASES.values(), ids=CASES.keys())
def test_stallwatch_reads_it_as_prometheus_does(line: str, line_by_line: bool) -> None:
    """stallwatch reads the sample (it left out the first two and the separators' lines): one
    engine of the model as the label says it, 3 requests running, nothing malformed."""
    reading = parse_reading(
        _exposition(line, VLLM_NAME), taken_at=0.0, kind="vllm", line_by_line=line_by_line
    )
    model = line.split('model_name="', 1)[1].split('"', 1)[0]
    assert reading.model_names == (model,)
    assert reading.running == 3.0
    assert reading.malformed_lines == 0
