"""`stallwatch check` and the command line: a target to check, and the CLI run as a process."""

from __future__ import annotations

import subprocess
import sys

from stallwatch.common.exporter_config import IdleTestRequestConfig, TargetConfig


def check_target(url: str, interval: float = 0.3) -> TargetConfig:
    return TargetConfig(
        name="check",
        url=url,
        interval_seconds=interval,
        timeout_seconds=interval,
        test_request=IdleTestRequestConfig(timeout_seconds=0.5),
    )


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stallwatch", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
