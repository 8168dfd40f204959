"""Build a real server's separate environment on first use (`scripts/real_*.py setup`), for the
real-server tiers: a missing environment is built once; a failed build fails, never skips."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

SETUP_LOG_TAIL_LINES = 120


def load_setup_script(setup_script: Path) -> ModuleType:
    """The setup script as a module, for the checks it offers (which CPU, which platform)."""
    spec = importlib.util.spec_from_file_location(f"{setup_script.stem}_setup", setup_script)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def environment_is_complete(setup_script: Path) -> bool:
    status = subprocess.run(
        [sys.executable, str(setup_script), "status"],
        capture_output=True,
        check=False,
        timeout=60,
    )
    return status.returncode == 0


def ensure_environment(setup_script: Path, log_dir: Path, what: str, timeout_s: float) -> None:
    """Runs `setup_script setup` unless `status` says the environment is complete; fails the
    test with the setup log's tail when the build fails or times out."""
    if environment_is_complete(setup_script):
        return
    setup_log = log_dir / "setup.log"
    started = time.monotonic()
    with setup_log.open("wb") as log:
        try:
            result = subprocess.run(
                [sys.executable, str(setup_script), "setup"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                check=False,
                timeout=timeout_s,
            )
            exit_code: int | str = result.returncode
        except subprocess.TimeoutExpired:
            exit_code = f"timeout after {timeout_s:g} s"
    took = time.monotonic() - started
    if exit_code != 0 or not environment_is_complete(setup_script):
        lines = setup_log.read_text(encoding="utf-8", errors="replace").splitlines()
        tail = "\n".join(lines[-SETUP_LOG_TAIL_LINES:])
        pytest.fail(
            f"{what} setup failed ({exit_code}) after {took:.0f} s; log {setup_log}:\n{tail}",
            pytrace=False,
        )
    print(f"\n{what} environment set up in {took:.0f} s (log {setup_log})")
