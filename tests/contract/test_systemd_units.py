"""The shipped systemd units: non-root, hardened, reloadable, a bounded stop that ends in
SIGKILL, and accepted by systemd-analyze."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
UNITS = sorted((ROOT / "deploy" / "systemd").glob("*.service"))
# Units for the model servers themselves (what a `kind: systemd` action restarts).
EXAMPLE_UNITS = sorted((ROOT / "examples" / "systemd").glob("*.service"))
INSTALLED_PATH = "/opt/stallwatch/bin/stallwatch"
VLLM_PATH = "/opt/vllm/bin/vllm"


def service_section(unit: Path) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(unit.read_text())
    return parser["Service"]


def test_both_components_have_a_unit() -> None:
    """An exporter unit and a restarter unit are shipped."""
    assert [unit.name for unit in UNITS] == [
        "stallwatch-exporter.service",
        "stallwatch-restarter.service",
    ]


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_unit_runs_unprivileged_and_reloads_with_sighup(unit: Path) -> None:
    """Never root, `systemctl reload` sends SIGHUP, the config is checked before each start."""
    service = service_section(unit)
    assert service.get("DynamicUser") == "yes" or service.get("User") not in (None, "root")
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    assert service["ExecStartPre"].endswith("--config.check")
    for option in ("ProtectSystem", "ProtectHome", "PrivateTmp", "RestrictAddressFamilies"):
        assert option in service, option


@pytest.mark.parametrize("unit", UNITS, ids=lambda unit: unit.name)
def test_systemd_analyze_verify_accepts_the_unit(unit: Path, tmp_path: Path) -> None:
    """systemd-analyze verify finds no error (with the program path pointed at this install)."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (a system without systemd)")
    program = Path(sys.executable).with_name("stallwatch")
    assert program.exists(), "the stallwatch command of this environment"
    copy = tmp_path / unit.name
    copy.write_text(unit.read_text().replace(INSTALLED_PATH, str(program)))
    result = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )
    problems = [line for line in result.stderr.splitlines() if unit.name in line]
    assert result.returncode == 0, result.stderr
    assert problems == [], result.stderr


def seconds(value: str) -> float:
    """A systemd time span as these units write it (30s, 2min, 90)."""
    units = {"ms": 0.001, "s": 1.0, "min": 60.0, "m": 60.0, "h": 3600.0}
    for suffix in sorted(units, key=len, reverse=True):
        if value.endswith(suffix):
            return float(value.removesuffix(suffix)) * units[suffix]
    return float(value)


@pytest.mark.parametrize("unit", UNITS + EXAMPLE_UNITS, ids=lambda unit: unit.name)
def test_unit_stop_ends_in_sigkill_within_a_stated_bound(unit: Path) -> None:
    """Every process of the unit gets SIGTERM, and SIGKILL after TimeoutStopSec (finite, at
    most 2 minutes): a process that ignores SIGTERM cannot hold a stop or a restart for ever."""
    service = service_section(unit)
    assert service.get("KillMode") in ("control-group", "mixed"), service.get("KillMode")
    assert service.get("SendSIGKILL", "yes") == "yes"
    timeout = service.get("TimeoutStopSec")
    assert timeout is not None
    assert 0 < seconds(timeout) <= 120, timeout
    header = unit.read_text().split("[Unit]")[0]
    if "TimeoutStopSec=" in header:  # a comment that states the bound states this one
        assert f"TimeoutStopSec={timeout}" in header


def test_a_model_server_unit_is_shipped() -> None:
    """examples/systemd holds the model server's unit the docs point to for `kind: systemd`."""
    assert [unit.name for unit in EXAMPLE_UNITS] == ["vllm@.service"]


@pytest.mark.parametrize("unit", EXAMPLE_UNITS, ids=lambda unit: unit.name)
def test_systemd_analyze_verify_accepts_the_model_server_unit(unit: Path, tmp_path: Path) -> None:
    """systemd-analyze verify finds no error in an instance of the model server's unit."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (a system without systemd)")
    program = shutil.which("true")
    assert program is not None
    copy = tmp_path / unit.name.replace("@.", "@gpu1.")
    copy.write_text(unit.read_text().replace(VLLM_PATH, program))
    result = subprocess.run(
        [analyze, "verify", str(copy)], capture_output=True, text=True, timeout=60, check=False
    )
    problems = [line for line in result.stderr.splitlines() if copy.name in line]
    assert result.returncode == 0, result.stderr
    assert problems == [], result.stderr


@pytest.mark.parametrize("unit", UNITS + EXAMPLE_UNITS, ids=lambda unit: unit.name)
def test_unit_raises_the_open_files_limit(unit: Path) -> None:
    """LimitNOFILE is set well above systemd's default of 1 024: connections piling up on a
    port cannot take every file descriptor the process needs for its own."""
    limit = service_section(unit).get("LimitNOFILE")
    assert limit is not None, "LimitNOFILE is not set"
    assert int(limit.split(":")[0]) >= 65536, limit
