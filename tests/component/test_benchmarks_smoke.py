"""The benchmarks run end to end in quick mode and produce sane figures (no timing thresholds)."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from tests.support.bounded import run_bounded

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(900)
def test_quick_benchmarks_run_and_produce_sane_figures(tmp_path: Path) -> None:
    """`python -m benchmarks --quick` runs every benchmark: ratios > 0, one restart in the storm,
    both /probe costs are reported, the heavy payload is read, every exporter beside
    blackbox_exporter read the servers (or the section says why it was skipped)."""
    figures_file = tmp_path / "figures.json"
    completed = run_bounded(
        [sys.executable, "-m", "benchmarks", "--quick", "--json", str(figures_file)],
        cwd=REPO,
        timeout=600,
    )
    assert not completed.timed_out, (
        "the quick benchmarks ran past 600 s: " + completed.stdout[-3000:]
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "## Reading a real vLLM /metrics payload" in completed.stdout
    figures = json.loads(figures_file.read_text())

    parsing = figures["parsing"]
    assert parsing["small_ratio"] > 0
    assert parsing["large_ratio"] > 0
    assert parsing["small_engines"] == 1
    assert parsing["large_engines"] == 48

    scale = figures["scale"]
    assert scale["cpu_per_poll_seconds"] > 0
    assert all(run["polls"] > 0 and run["errors"] == 0 for run in scale["runs"])

    e2e = figures["e2e"]
    assert len(e2e["measured_seconds"]) == 1
    assert e2e["measured_seconds"][0] > 0
    assert e2e["health_total"] > 0
    assert e2e["health_ok"] == e2e["health_total"]  # /health stays 200 on a hung engine

    window = figures["window"]
    # The quick run's window is 5 s: the restart comes at least that long after it opened.
    assert window["hang_to_window"] < window["hang_to_restart"]
    assert window["hang_to_restart"] - window["hang_to_window"] >= 5.0

    restarter = figures["restarter"]
    assert restarter["storm_restarts"] == 1
    assert restarter["storm_statuses"] == {"200": restarter["storm_count"]}
    assert restarter["latency_p50_seconds"] > 0

    probe = figures["probe"]["this tree"]
    assert probe["runs"][0]["reads"] > 0
    # CPU seconds only exist: a quick run is too short to compare them (clock ticks are coarse),
    # and the comparison is the benchmark's own figure, not a test's.
    assert probe["read_cpu_seconds"] >= 0
    assert probe["cached_cpu_seconds"] >= 0

    readpath = figures["readpath"]
    for engine in ("vLLM 0.32", "llama.cpp", "SGLang 0.5.23"):
        stages = readpath[engine]
        assert all(seconds > 0 for seconds in stages.values()), stages
    assert readpath["http_plain_seconds"] > 0
    assert readpath["http_aiohttp_new_connection_seconds"] > 0
    assert readpath["http_aiohttp_kept_alive_seconds"] > 0
    loop = readpath["event_loop"]["this tree"]
    assert loop["healthy_polls"] >= 2
    assert loop["heavy_reads"] >= 1

    quarantine = figures["quarantine"]
    # The frozen server left rotation and came back; no user reached it while it was out.
    assert quarantine["freeze_to_out"] > 0
    assert quarantine["end_to_back"] > 0
    assert quarantine["to_frozen_while_out"] == 0
    assert quarantine["restarted"] is False

    peer = figures["peer"]
    if shutil.which("prometheus-blackbox-exporter") is None:
        assert "prometheus-blackbox-exporter not found" in peer["skipped"]
    else:
        assert "skipped" not in peer, peer
        for size in peer["sizes"]:
            for run in size["runs"]:
                assert run["reads"] > 0, run
                assert run["scrapes"] > 0, run
            for name, ratios in size["ratios"].items():
                assert ratios["cpu_per_read"] > 0, (name, ratios)
