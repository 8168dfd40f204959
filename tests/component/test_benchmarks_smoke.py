"""The benchmarks run end to end in quick mode and produce sane figures (no timing thresholds).

One test per section, each running `python -m benchmarks --quick --only SECTION`, so the
sections run side by side on the tier's workers instead of one after another in one test.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.__main__ import BENCHMARKS
from tests.support.bounded import run_bounded

REPO = Path(__file__).resolve().parents[2]


def quick(section: str, tmp_path: Path) -> tuple[dict[str, Any], str]:
    """The figures of one section run in quick mode, and what it printed."""
    figures_file = tmp_path / "figures.json"
    completed = run_bounded(
        [
            sys.executable,
            "-m",
            "benchmarks",
            "--quick",
            "--only",
            section,
            "--json",
            str(figures_file),
        ],
        cwd=REPO,
        timeout=600,
    )
    assert not completed.timed_out, (
        f"the quick {section} benchmark ran past 600 s: " + completed.stdout[-3000:]
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    figures: dict[str, Any] = json.loads(figures_file.read_text())[section]
    return figures, completed.stdout


def test_every_benchmark_section_has_its_smoke_test() -> None:
    """Every section of `python -m benchmarks`, and only those, is run by a test below."""
    source = Path(__file__).read_text(encoding="utf-8")
    assert set(re.findall(r'quick\("(\w+)", tmp_path\)', source)) == set(BENCHMARKS)


@pytest.mark.timeout(900)
def test_the_parsing_benchmark_compares_the_parsers(tmp_path: Path) -> None:
    """The parsing section reads the real and the large payload: ratios > 0, their engines."""
    parsing, printed = quick("parsing", tmp_path)
    assert "## Reading a real vLLM /metrics payload" in printed
    assert parsing["small_ratio"] > 0
    assert parsing["large_ratio"] > 0
    assert parsing["small_engines"] == 1
    assert parsing["large_engines"] == 48


@pytest.mark.timeout(900)
def test_the_scale_benchmark_polls_without_errors(tmp_path: Path) -> None:
    """The scale section polls every target, with no poll error, at a CPU cost > 0."""
    scale, _ = quick("scale", tmp_path)
    assert scale["cpu_per_poll_seconds"] > 0
    assert all(run["polls"] > 0 and run["errors"] == 0 for run in scale["runs"])


@pytest.mark.timeout(900)
def test_the_end_to_end_benchmark_measures_a_restart(tmp_path: Path) -> None:
    """The end-to-end section measures one stall to restart, /health staying 200 throughout."""
    e2e, _ = quick("e2e", tmp_path)
    assert len(e2e["measured_seconds"]) == 1
    assert e2e["measured_seconds"][0] > 0
    assert e2e["health_total"] > 0
    assert e2e["health_ok"] == e2e["health_total"]  # /health stays 200 on a hung engine


@pytest.mark.timeout(900)
def test_the_window_benchmark_restarts_after_the_window(tmp_path: Path) -> None:
    """The restart-window section restarts a hung server no sooner than its 5 s window."""
    window, _ = quick("window", tmp_path)
    assert window["hang_to_window"] < window["hang_to_restart"]
    assert window["hang_to_restart"] - window["hang_to_window"] >= 5.0


@pytest.mark.timeout(900)
def test_the_restarter_benchmark_restarts_once_in_a_storm(tmp_path: Path) -> None:
    """The restarter section answers every duplicate of a storm 200 and restarts once."""
    restarter, _ = quick("restarter", tmp_path)
    assert restarter["storm_restarts"] == 1
    assert restarter["storm_statuses"] == {"200": restarter["storm_count"]}
    assert restarter["latency_p50_seconds"] > 0


@pytest.mark.timeout(900)
def test_the_probe_benchmark_reads_and_reports_both_costs(tmp_path: Path) -> None:
    """The /probe section reads the servers and reports a real read's and a cached answer's
    CPU."""
    probe, _ = quick("probe", tmp_path)
    this_tree = probe["this tree"]
    assert this_tree["runs"][0]["reads"] > 0
    # CPU seconds only exist: a quick run is too short to compare them (clock ticks are coarse),
    # and the comparison is the benchmark's own figure, not a test's.
    assert this_tree["read_cpu_seconds"] >= 0
    assert this_tree["cached_cpu_seconds"] >= 0


@pytest.mark.timeout(900)
def test_the_readpath_benchmark_times_every_stage(tmp_path: Path) -> None:
    """The read-path section times every stage of every engine's payload, the three ways of
    HTTP, and reads the heavy payload beside a healthy target."""
    readpath, _ = quick("readpath", tmp_path)
    for engine in ("vLLM 0.32", "llama.cpp", "SGLang 0.5.23"):
        stages = readpath[engine]
        assert all(seconds > 0 for seconds in stages.values()), stages
    assert readpath["http_plain_seconds"] > 0
    assert readpath["http_aiohttp_new_connection_seconds"] > 0
    assert readpath["http_aiohttp_kept_alive_seconds"] > 0
    loop = readpath["event_loop"]["this tree"]
    assert loop["healthy_polls"] >= 2
    assert loop["heavy_reads"] >= 1


@pytest.mark.timeout(900)
def test_the_quarantine_benchmark_takes_a_frozen_server_out_and_back(tmp_path: Path) -> None:
    """The quarantine section: the frozen server left rotation and came back, unrestarted, and
    no user reached it while it was out."""
    quarantine, _ = quick("quarantine", tmp_path)
    assert quarantine["freeze_to_out"] > 0
    assert quarantine["end_to_back"] > 0
    assert quarantine["to_frozen_while_out"] == 0
    assert quarantine["restarted"] is False


@pytest.mark.timeout(900)
def test_the_peer_benchmark_reads_with_every_exporter(tmp_path: Path) -> None:
    """Every exporter beside blackbox_exporter read the servers, or the section says why it
    was skipped."""
    peer, _ = quick("peer", tmp_path)
    if shutil.which("prometheus-blackbox-exporter") is None:
        assert "prometheus-blackbox-exporter not found" in peer["skipped"]
        return
    assert "skipped" not in peer, peer
    for size in peer["sizes"]:
        for run in size["runs"]:
            assert run["reads"] > 0, run
            assert run["scrapes"] > 0, run
        for name, ratios in size["ratios"].items():
            assert ratios["cpu_per_read"] > 0, (name, ratios)
