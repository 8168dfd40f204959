"""What `pip install .` ships: the components a production host runs, not the checkout-only demo."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import pytest

from stallwatch import cli

REPO = Path(__file__).resolve().parents[2]
SHIPPED = {"common", "engines", "core", "net", "exporter", "restarter", "simulator", "replay"}
CHECKOUT_ONLY = {"demo", "localstack"}


def tracked_copy(destination: Path) -> Path:
    """The repository's tracked files only, as a fresh clone has them (no build leftovers)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("needs git and a git checkout: the wheel is built from the tracked files")
    listed = subprocess.run(
        ["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True, check=True
    ).stdout
    for name in listed.decode().split("\0"):
        if name and (REPO / name).is_file():
            target = destination / name
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, target)
    return destination


def test_the_wheel_ships_the_components_and_not_the_checkout_only_parts(tmp_path: Path) -> None:
    """The wheel holds the exporter, restarter, simulator and replay; not demo or localstack."""
    source = tracked_copy(tmp_path / "source")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(tmp_path / "wheels"),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "wheels").glob("stallwatch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    subpackages = {name.split("/")[1] for name in names if name.count("/") >= 2}
    subpackages |= {
        name.split("/")[1].removesuffix(".py") for name in names if name.startswith("stallwatch/")
    }
    assert subpackages >= SHIPPED, sorted(subpackages)
    assert not subpackages & CHECKOUT_ONLY, sorted(subpackages & CHECKOUT_ONLY)
    assert "stallwatch/simulator/vllm_0_32_families.json" in names


class _Hidden(importlib.abc.MetaPathFinder):
    """Makes `stallwatch.demo` and `stallwatch.localstack` absent, as in an installed wheel."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if any(fullname == f"stallwatch.{part}" for part in CHECKOUT_ONLY):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def test_the_command_works_without_the_checkout_only_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """With demo and localstack absent, `stallwatch` offers every other subcommand."""
    for name in list(sys.modules):
        if any(name.startswith(f"stallwatch.{part}") for part in CHECKOUT_ONLY):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Hidden(), *sys.meta_path])
    parser = cli.build_parser()
    commands = set(parser._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    assert "demo" not in commands
    assert {"exporter", "check", "restarter", "sim", "replay"} <= commands


def test_a_missing_dependency_inside_a_component_is_not_hidden(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A component that is present but imports something missing fails loudly, not silently."""

    class MissingDependency(importlib.abc.MetaPathFinder):
        def find_spec(
            self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
        ) -> importlib.machinery.ModuleSpec | None:
            if fullname == "stallwatch.replay.cli":
                raise ModuleNotFoundError("No module named 'not_installed'", name="not_installed")
            return None

    monkeypatch.delitem(sys.modules, "stallwatch.replay.cli", raising=False)
    monkeypatch.setattr(sys, "meta_path", [MissingDependency(), *sys.meta_path])
    with pytest.raises(ModuleNotFoundError, match="not_installed"):
        cli.build_parser()
