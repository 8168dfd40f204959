"""The helm, kubectl, amtool and promtool the tests run: `make tools` puts helm and kubectl in the
virtual environment's bin directory (scripts/install_tools.py), Debian puts amtool on PATH."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
INSTALL_HINT = {
    "helm": "`make tools` installs it into the virtual environment (scripts/install_tools.py)",
    "kubectl": "`make tools` installs it into the virtual environment (scripts/install_tools.py)",
    "amtool": "`make test` installs it as root (Debian package prometheus-alertmanager)",
    "promtool": "`make test` installs it as root (Debian package prometheus)",
}


def find_tool(name: str) -> str | None:
    """The virtual environment's own `name` first (the pinned build), then one on PATH for the
    tools Debian provides; None when there is none."""
    own = VENV_BIN / name
    if own.is_file():
        return str(own)
    if name in ("helm", "kubectl"):
        return None  # only the pinned build: another version renders and warns differently
    return shutil.which(name)


def missing_reason(name: str) -> str:
    return f"{name} is not installed; {INSTALL_HINT.get(name, 'install it')}"


def promtool() -> str:
    """Debian's promtool on PATH; the test fails, saying how to install it, without one."""
    path = shutil.which("promtool")
    if path is None:
        pytest.fail(
            "promtool is not installed; `make test` installs it (Debian package prometheus)"
        )
    return path
