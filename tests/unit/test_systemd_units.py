"""The shipped systemd units: non-root, hardened, reloadable, and accepted by systemd-analyze."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS = sorted((Path(__file__).resolve().parents[2] / "deploy" / "systemd").glob("*.service"))
INSTALLED_PATH = "/opt/stallwatch/bin/stallwatch"


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
