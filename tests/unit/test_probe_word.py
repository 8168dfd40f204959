""" "probe" names the `/probe` endpoint only: the idle test request has its own words."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "stallwatch"
# The modules of the /probe endpoint (its config, its allow-list, its service, its debug view
# and its hand-over between workers),
# and the fleet replay's Kubernetes liveness probe, which is a probe.
PROBE_MODULES = frozenset(
    {
        "common/allowlist.py",
        "common/exporter_config.py",
        "core/probe_schedule.py",
        "exporter/app.py",
        "exporter/multitarget.py",
        "exporter/probe_debug.py",
        "exporter/service.py",
        "exporter/worker_links.py",
        "exporter/workers.py",
        "replay/fleet.py",
        "replay/fleet_plan.py",
        "replay/fleet_probes.py",
        "replay/fleet_report.py",
    }
)


def names_with_probe(source: str) -> set[str]:
    """Every identifier defined or used in `source` that contains "probe"."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names = [node.name]
        elif isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.arg) or (isinstance(node, ast.keyword) and node.arg):
            names = [node.arg]
        found |= {name for name in names if "probe" in name.lower()}
    return found


def test_no_identifier_says_probe_outside_the_probe_modules() -> None:
    """Outside the /probe modules no name says "probe" (the test request is a test request)."""
    offenders = {
        f"{path.relative_to(ROOT)}: {', '.join(sorted(found))}"
        for path in ROOT.rglob("*.py")
        if str(path.relative_to(ROOT)) not in PROBE_MODULES
        and (found := names_with_probe(path.read_text(encoding="utf-8")))
    }
    assert offenders == set()


def test_the_check_finds_an_old_name() -> None:
    """The check itself finds a name that says probe (it can fail)."""
    assert names_with_probe("def send_probe(session): return session.probes_sent\n") == {
        "send_probe",
        "probes_sent",
    }


def test_a_probe_targets_spelling_is_logged_escaped() -> None:
    """The /probe module logs a target as asked through printable (no forged log lines)."""
    source = (ROOT / "exporter" / "multitarget.py").read_text(encoding="utf-8")
    assert "printable(entry.target.name)" in source
    assert "entry.target.name,\n" not in source
