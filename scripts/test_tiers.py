"""Run test tiers one after another and say where the time went.

    python scripts/test_tiers.py unit contract component e2e real stack

Each tier is `pytest -m TIER` over its directories: unit, contract, component and e2e on every
core (pytest-xdist: a worker per core, two for component and e2e, which mostly wait), the real
servers and the compose stack one test at a time (each real server takes a core or more, and
they are timed against it). Every tier runs even when an earlier one failed; each writes a
junit report to build/test-reports/TIER.xml. At the end: each tier's wall time, its counts and
result, and the slowest tests of the whole run. The exit status is 1 when any tier failed.

When the real tier is asked for and one of its environments (.venv-vllm, .venv-sglang,
.venv-llamacpp where the CPU can run it) is missing, it is built while the earlier tiers run
(`scripts/real_*.py setup`, one at a time, at the lowest CPU priority, logged to
build/test-reports/setup-*.log): the minutes of installs overlap tiers that mostly wait. The real
tier starts when the builds are done; a build that failed is run again there by the tier's own
fixture, which fails with its log. STALLWATCH_TEST_BUILD_AHEAD=0 leaves the builds to the tier.

The stack tier, which mostly waits on the shipped timings, runs beside the component and e2e
tiers at a lower CPU priority (its podman service and containers inherit it), its output in
build/test-reports/stack.log, shown when it ends; it ends before the real tier starts.
STALLWATCH_TEST_BESIDE=0 runs every tier in turn.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]
REPORTS = REPO / "build" / "test-reports"
TIERS = ("unit", "contract", "component", "e2e", "real", "stack")
# The tiers run on every core, and how their tests are shared out: idle workers steal single
# tests (uneven lengths), or whole files go to one worker (e2e: one Prometheus and Alertmanager
# stack per module, started once).
PARALLEL = {
    "unit": "worksteal",
    "contract": "worksteal",
    "component": "worksteal",
    "e2e": "loadfile",
}
# Workers per core: the e2e tier mostly waits on the shipped timings of Prometheus, Alertmanager
# and the exporter (its processes use a fraction of a core: 98 CPU seconds in 217 s on two
# cores, four workers; 203 s of wall time against 326 s with one worker per core), so it runs
# two files per core. The component tier too waits more than it computes (its benchmarks' smoke
# test, 137 s, spends 37 s on a CPU): 149 s of wall time with four workers on two cores against
# 262 s with two, measured one after the other on a quiet machine.
WORKERS_PER_CORE = {"unit": 1, "contract": 1, "component": 2, "e2e": 2}
# Where each tier lives: pytest collects only there (the marker then selects the same tests).
PATHS = {
    "unit": ["tests/unit"],
    "contract": ["tests/contract"],
    "component": ["tests/component"],
    "e2e": ["tests/e2e"],
    "real": ["tests/real", "tests/real_llamacpp", "tests/real_sglang"],
    "stack": ["tests/stack"],
}
# The bound of one test in each tier (set-up and tear-down included): a test that hangs fails
# with its stack instead of holding the run. The real tier's first test may build SGLang (up to
# ten minutes on a slow machine); the stack's first builds its images.
TEST_TIMEOUT_SECONDS = {
    "unit": 120,
    "contract": 300,
    "component": 240,
    "e2e": 600,
    "real": 1800,
    "stack": 1200,
}
# The bound of a whole tier, a backstop for a hang the per-test bound cannot break (a worker
# stuck outside Python): the tier is stopped, counted as failed, and the next tier runs.
TIER_TIMEOUT_SECONDS = {
    "unit": 900,
    "contract": 900,
    "component": 1800,
    "e2e": 2400,
    "real": 3600,
    "stack": 2400,
}
# Tiers that run beside others: the stack waits out the shipped timings of its compose stack (15 s
# polls, alerts after two of them: its hang test, 181 of the tier's 288 s, is mostly that wait)
# and its containers use little CPU, so it runs beside the tiers named here and must end before
# any other tier starts (the real servers are timed against the CPU). Its processes run at
# BESIDE_NICENESS so that the tiers in front keep the CPU. The component tier's tests read
# with generous bounds where they judge no timeout (tests/support/exporter.py), so that the
# load beside them does not turn a slow loopback read into a verdict.
BESIDE = {"stack": ("component", "e2e")}
BESIDE_NICENESS = 10
# pytest's exit status when it selected no test: a tier with none is not a failure.
NO_TESTS = 5
# The status of a tier stopped at its bound.
TIER_STOPPED = 124
SLOWEST = 20
# The real tier's environments: the setup script and the check, in that script, of whether it
# can run on this machine at all (the tier skips it otherwise, so it is not built).
ENVIRONMENTS = (
    ("real_vllm.py", None),
    ("real_sglang.py", "platform_supported"),
    ("real_llamacpp.py", "cpu_supported"),
)
BUILD_TIMEOUT_SECONDS = 3600


@dataclass
class TierRun:
    tier: str
    seconds: float
    status: int
    counts: dict[str, int]
    beside: tuple[str, ...] = ()


@dataclass(frozen=True)
class Step:
    """One step of a run: `run` a tier in front, `start` one beside, or `join` one started."""

    action: str
    tier: str


def plan(tiers: Sequence[str], beside: Mapping[str, tuple[str, ...]]) -> list[Step]:
    """The steps of a run: each tier in turn, but for those that can run beside others.

    A tier of `beside` starts with the first of its hosts asked for and is joined before the
    first tier after that which is not a host (or at the end); with no host asked for it runs
    in its turn.
    """
    steps: list[Step] = []
    pending = [t for t in tiers if any(host in tiers for host in beside.get(t, ()))]
    moved = set(pending)
    running: list[str] = []
    for tier in tiers:
        if tier in moved:
            continue
        for other in list(running):
            if tier not in beside[other]:
                steps.append(Step("join", other))
                running.remove(other)
        for other in list(pending):
            if tier in beside[other]:
                steps.append(Step("start", other))
                running.append(other)
                pending.remove(other)
        steps.append(Step("run", tier))
    steps += [Step("join", other) for other in running]
    return steps


def pytest_argv(tier: str, report: Path, extra: list[str]) -> list[str]:
    argv = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", tier]
    argv += ["-rs", "--durations=15", f"--junitxml={report}"]
    argv += [f"--timeout={TEST_TIMEOUT_SECONDS[tier]}", *extra]
    if tier in PARALLEL:
        workers = os.environ.get("STALLWATCH_TEST_WORKERS") or str(
            WORKERS_PER_CORE[tier] * len(os.sched_getaffinity(0))
        )
        argv += ["-n", workers, "--dist", PARALLEL[tier]]
        if PARALLEL[tier] == "loadfile":
            # Files in the order of their names, not those with the most tests first (xdist's
            # default, which left the two-minute files of one test each to the end).
            argv.append("--no-loadscope-reorder")
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


@dataclass
class BuildsAhead:
    """The missing real-server environments, built one after another in a background thread."""

    scripts: list[Path]
    log_dir: Path = REPORTS
    done: list[str] = field(default_factory=list)
    _thread: threading.Thread | None = None
    _process: subprocess.Popen[bytes] | None = None
    _stopped: bool = False

    def start(self) -> None:
        if self.scripts:
            names = ", ".join(script.name for script in self.scripts)
            print(f"building in the background for the real tier: {names}", flush=True)
            self._thread = threading.Thread(target=self._build_all, daemon=True)
            self._thread.start()

    def _build_all(self) -> None:
        for script in self.scripts:
            if self._stopped:
                return
            log = self.log_dir / f"setup-{script.stem}.log"
            started = time.monotonic()
            with log.open("wb") as out:
                self._process = subprocess.Popen(
                    ["nice", "-n", "19", sys.executable, str(script), "setup"],
                    cwd=REPO,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                try:
                    status: int | str = self._process.wait(timeout=BUILD_TIMEOUT_SECONDS)
                except subprocess.TimeoutExpired:
                    os.killpg(self._process.pid, signal.SIGKILL)
                    self._process.wait()
                    status = f"stopped after {BUILD_TIMEOUT_SECONDS} s"
            took = time.monotonic() - started
            self.done.append(f"{script.name} setup: exit {status} in {took:.0f} s ({log.name})")

    def wait(self) -> None:
        """Until every build has ended (the real tier needs them)."""
        if self._thread is not None:
            started = time.monotonic()
            self._thread.join()
            waited = time.monotonic() - started
            print(f"\nbuilds done ({waited:.0f} s waited for them):", flush=True)
            for line in self.done:
                print(f"  {line}", flush=True)

    def stop(self) -> None:
        """Stop a build still running (the run was interrupted)."""
        self._stopped = True
        process = self._process
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait()


def missing_environments(scripts_dir: Path = REPO / "scripts") -> list[Path]:
    """The real tier's setup scripts whose environment is missing and can be built here."""
    missing = []
    for name, supported_check in ENVIRONMENTS:
        script = scripts_dir / name
        if supported_check is not None:
            spec = importlib.util.spec_from_file_location(script.stem, script)
            assert spec is not None
            assert spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            supported, _ = getattr(module, supported_check)()
            if not supported:
                continue
        status = subprocess.run(
            [sys.executable, str(script), "status"], cwd=REPO, capture_output=True, check=False
        )
        if status.returncode != 0:
            missing.append(script)
    return missing


def run_tier(tier: str, extra: list[str]) -> TierRun:
    report = REPORTS / f"{tier}.xml"
    report.unlink(missing_ok=True)
    print(f"\n===== tier {tier} =====", flush=True)
    started = time.monotonic()
    status = run_bounded(pytest_argv(tier, report, extra), tier_env(), TIER_TIMEOUT_SECONDS[tier])
    return TierRun(tier, time.monotonic() - started, status, counts(report))


def tier_env() -> dict[str, str]:
    # pytest caches the test modules it rewrites (assertions) as bytecode beside them: without
    # that cache each worker rewrites all of them again, seconds per tier and worker.
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


@dataclass
class TierBeside:
    """A tier running in a thread beside the others, its output in a log shown when it ends."""

    tier: str
    hosts: tuple[str, ...]
    extra: list[str]
    log: Path
    run: TierRun | None = None
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        hosts = ", ".join(self.hosts)
        print(
            f"\n===== tier {self.tier}: started beside {hosts} (output: {self.log}) =====",
            flush=True,
        )
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        report = REPORTS / f"{self.tier}.xml"
        report.unlink(missing_ok=True)
        argv = ["nice", "-n", str(BESIDE_NICENESS), *pytest_argv(self.tier, report, self.extra)]
        started = time.monotonic()
        with self.log.open("wb") as out:
            status = run_bounded(
                argv, tier_env(), TIER_TIMEOUT_SECONDS[self.tier], out=out, stop=self._stop
            )
        took = time.monotonic() - started
        self.run = TierRun(self.tier, took, status, counts(report), self.hosts)

    def join(self) -> TierRun:
        """Wait for the tier to end, then print its output."""
        assert self._thread is not None
        started = time.monotonic()
        self._thread.join()
        waited = time.monotonic() - started
        print(
            f"\n===== tier {self.tier} (ran beside {', '.join(self.hosts)}; "
            f"{waited:.0f} s waited for its end) =====",
            flush=True,
        )
        sys.stdout.buffer.write(self.log.read_bytes())
        sys.stdout.flush()
        assert self.run is not None
        return self.run

    def stop(self) -> None:
        """Stop the tier (the run was interrupted)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


def run_bounded(
    argv: list[str],
    env: dict[str, str],
    limit_seconds: float,
    out: IO[bytes] | None = None,
    stop: threading.Event | None = None,
) -> int:
    """Run pytest in a session of its own; past the limit stop the whole session and fail.

    With `stop` (a tier in a thread, where no KeyboardInterrupt arrives) the session is also
    stopped when that event is set.
    """
    process = subprocess.Popen(
        argv, cwd=REPO, env=env, start_new_session=True, stdout=out, stderr=out
    )
    try:
        if ended_within(process, limit_seconds, stop):
            return process.returncode
        if stop is not None and stop.is_set():
            print("\n!!! tier stopped: the run was interrupted", flush=True)
        else:
            print(f"\n!!! tier stopped: still running after {limit_seconds:.0f} s", flush=True)
        for sig, grace in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 15.0)):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                break
            try:
                process.wait(timeout=grace)
                break
            except subprocess.TimeoutExpired:
                continue
        return TIER_STOPPED
    except KeyboardInterrupt:
        os.killpg(process.pid, signal.SIGINT)
        process.wait()
        raise


def ended_within(
    process: subprocess.Popen[bytes], seconds: float, stop: threading.Event | None
) -> bool:
    """Whether the process ended within `seconds` (and before `stop` was set)."""
    if stop is None:
        try:
            process.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True
    deadline = time.monotonic() + seconds
    while process.poll() is None:
        if stop.is_set() or time.monotonic() >= deadline:
            return False
        stop.wait(0.5)
    return True


def summary(runs: list[TierRun], wall_seconds: float) -> str:
    lines = ["", "===== where the time went ====="]
    lines.append(f"{'tier':10} {'wall':>8} {'tests':>6} {'failed':>6} {'skipped':>7}  result")
    for run in runs:
        c = run.counts
        if run.status in (0, NO_TESTS):
            result = "ok"
        elif run.status == TIER_STOPPED:
            result = f"STOPPED after {TIER_TIMEOUT_SECONDS[run.tier]} s"
        else:
            result = f"FAILED (exit {run.status})"
        if run.beside:
            result += f" (beside {', '.join(run.beside)})"
        lines.append(
            f"{run.tier:10} {run.seconds:7.1f}s {c['tests']:6} "
            f"{c['failures'] + c['errors']:6} {c['skipped']:7}  {result}"
        )
    lines.append(
        f"{'total':10} {wall_seconds:7.1f}s  wall ({sum(r.seconds for r in runs):.1f} s of tiers)"
    )
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
    ahead = os.environ.get("STALLWATCH_TEST_BUILD_AHEAD", "1") != "0"
    builds = BuildsAhead(missing_environments() if ahead and "real" in args.tiers else [])
    started = time.monotonic()
    builds.start()
    beside = BESIDE if os.environ.get("STALLWATCH_TEST_BESIDE", "1") != "0" else {}
    runs = []
    besides: dict[str, TierBeside] = {}
    try:
        for step in plan(args.tiers, beside):
            if step.action == "start":
                log = REPORTS / f"{step.tier}.log"
                hosts = tuple(host for host in beside[step.tier] if host in args.tiers)
                besides[step.tier] = TierBeside(step.tier, hosts, args.pytest, log)
                besides[step.tier].start()
            elif step.action == "join":
                runs.append(besides.pop(step.tier).join())
            else:
                if step.tier == "real":
                    builds.wait()
                runs.append(run_tier(step.tier, args.pytest))
    finally:
        for tier in besides.values():
            tier.stop()
        builds.stop()
    print(summary(runs, time.monotonic() - started), flush=True)
    return 0 if all(run.status in (0, NO_TESTS) for run in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
