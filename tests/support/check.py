"""`stallwatch check` and the command line: a target to check, and the CLI run as a process."""

from __future__ import annotations

import subprocess
import sys

from stallwatch.common.exporter_config import TargetConfig
from tests.support.exporter import target


def check_target(url: str, interval: float = 0.3) -> TargetConfig:
    """A target for `run_check`, read `interval` apart, each read and test request with the
    generous bounds of tests/support/exporter.py (these tests judge verdicts, not timeouts)."""
    return target("check", url, interval_seconds=interval)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stallwatch", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
