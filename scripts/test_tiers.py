"""Run test tiers one after another and say where the time went.

    python scripts/test_tiers.py unit contract component e2e real stack

Each tier is `pytest -m TIER` over its directories: unit, contract and component on every core
(pytest-xdist, `-n auto`), the others one test at a time (they start real servers and stacks
and are timed against them). Every tier runs even when an earlier one failed; each writes a
junit report to build/test-reports/TIER.xml. At the end: each tier's wall time, its counts and
result, and the slowest tests of the whole run. The exit status is 1 when any tier failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
REPORTS = REPO / "build" / "test-reports"
TIERS = ("unit", "contract", "component", "e2e", "real", "stack")
PARALLEL = {"unit", "contract", "component"}
# Where each tier lives: pytest collects only there (the marker then selects the same tests).
PATHS = {
    "unit": ["tests/unit"],
    "contract": ["tests/contract"],
    "component": ["tests/component"],
    "e2e": ["tests/e2e"],
    "real": ["tests/real", "tests/real_llamacpp", "tests/real_sglang"],
    "stack": ["tests/stack"],
}
# pytest's exit status when it selected no test: a tier with none is not a failure.
NO_TESTS = 5
SLOWEST = 20


@dataclass
class TierRun:
    tier: str
    seconds: float
    status: int
    counts: dict[str, int]


def pytest_argv(tier: str, report: Path, extra: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", tier]
    argv += ["-rs", "--durations=15", f"--junitxml={report}", *extra]
    if tier in PARALLEL:
        workers = os.environ.get("STALLWATCH_TEST_WORKERS", "auto")
        argv += ["-n", workers, "--dist", "worksteal"]  # uneven test lengths: idle workers steal
    return [*argv, *PATHS[tier]]


def counts(report: Path) -> dict[str, int]:
    """tests, failures, errors and skipped from a junit report (zeros if there is none)."""
    totals = dict.fromkeys(("tests", "failures", "errors", "skipped"), 0)
    if not report.exists():
        return totals
    for suite in ET.parse(report).getroot().iter("testsuite"):
        for key in totals:
            totals[key] += int(suite.get(key, "0"))
    return totals


def slowest(reports: list[Path], limit: int) -> list[tuple[float, str]]:
    """The slowest test cases over all reports: (seconds, tier and node id)."""
    cases = []
    for report in reports:
        if report.exists():
            for case in ET.parse(report).getroot().iter("testcase"):
                name = f"{case.get('classname', '')}::{case.get('name', '')}"
                cases.append((float(case.get("time", "0")), f"{report.stem:9} {name}"))
    return sorted(cases, reverse=True)[:limit]


def run_tier(tier: str, extra: list[str]) -> TierRun:
    report = REPORTS / f"{tier}.xml"
    report.unlink(missing_ok=True)
    print(f"\n===== tier {tier} =====", flush=True)
    started = time.monotonic()
    # pytest caches the test modules it rewrites (assertions) as bytecode beside them: without
    # that cache each worker rewrites all of them again, seconds per tier and worker.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    argv = pytest_argv(tier, report, extra)
    status = subprocess.run(argv, cwd=REPO, env=env, check=False).returncode
    return TierRun(tier, time.monotonic() - started, status, counts(report))


def summary(runs: list[TierRun]) -> str:
    lines = ["", "===== where the time went ====="]
    lines.append(f"{'tier':10} {'wall':>8} {'tests':>6} {'failed':>6} {'skipped':>7}  result")
    for run in runs:
        c = run.counts
        result = "ok" if run.status in (0, NO_TESTS) else f"FAILED (exit {run.status})"
        lines.append(
            f"{run.tier:10} {run.seconds:7.1f}s {c['tests']:6} "
            f"{c['failures'] + c['errors']:6} {c['skipped']:7}  {result}"
        )
    lines.append(f"{'total':10} {sum(r.seconds for r in runs):7.1f}s")
    lines.append("")
    lines.append(f"slowest {SLOWEST} tests (setup, call and teardown):")
    for seconds, name in slowest([REPORTS / f"{r.tier}.xml" for r in runs], SLOWEST):
        lines.append(f"{seconds:8.2f}s  {name}")
    lines.append(f"junit reports: {REPORTS.relative_to(REPO)}/")
    failed = sum(r.counts["failures"] + r.counts["errors"] for r in runs)
    skipped = sum(r.counts["skipped"] for r in runs)
    passed = sum(r.counts["tests"] for r in runs) - failed - skipped
    # The whole run in one closing line, whatever the last tier printed.
    lines.append(f"total: {passed} passed, {failed} failed, {skipped} skipped")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tiers", nargs="+", choices=TIERS, metavar="TIER")
    parser.add_argument("--pytest", action="append", default=[], help="one more pytest argument")
    args = parser.parse_args(argv)
    REPORTS.mkdir(parents=True, exist_ok=True)
    runs = [run_tier(tier, args.pytest) for tier in args.tiers]
    print(summary(runs), flush=True)
    return 0 if all(run.status in (0, NO_TESTS) for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
