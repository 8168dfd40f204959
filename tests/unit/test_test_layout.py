"""The test tree keeps its layout: every test file is in a tier, and no test module imports
another (what tests share lives in tests/support/ or in a tier's helper modules)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import TIER_OF_DIRECTORY, long_waits_first, tier_of

TESTS = Path(__file__).resolve().parents[1]


def files_of_tests() -> list[Path]:
    return sorted(TESTS.rglob("test_*.py"))


def imported_test_modules(path: Path) -> list[str]:
    """The test modules (`test_*`) a file imports, absolutely or relatively."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if not node.level and not (node.module or "").startswith("tests."):
                continue  # another package's modules (aiohttp.test_utils is not ours)
            names = [node.module or ""] + [f"{node.module or ''}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.startswith("tests.")]
        else:
            continue
        found += [n for n in names if any(p.startswith("test_") for p in n.split(".") if p)]
    return sorted(set(found))


def test_no_test_module_imports_another() -> None:
    """No file under tests/ imports a test module: shared helpers live in helper modules."""
    offenders = {
        str(path.relative_to(TESTS)): imported
        for path in sorted(TESTS.rglob("*.py"))
        if (imported := imported_test_modules(path))
    }
    assert offenders == {}


def test_every_test_file_is_in_a_tier() -> None:
    """Every test file sits in a tier directory, so the root conftest marks it."""
    assert files_of_tests(), "no test files found"
    assert [str(p.relative_to(TESTS)) for p in files_of_tests() if tier_of(p) is None] == []
    assert set(TIER_OF_DIRECTORY.values()) == {
        "unit", "contract", "component", "e2e", "real", "stack"
    }  # fmt: skip


def test_the_import_scan_sees_a_test_module_import(tmp_path: Path) -> None:
    """The scan is not blind: absolute and relative imports of a test module are both found."""
    source = tmp_path / "test_x.py"
    source.write_text(
        "from .test_a import x\nfrom tests.e2e.test_b import y\nimport tests.support\n"
    )
    found = imported_test_modules(source)
    assert found == ["test_a", "test_a.x", "tests.e2e.test_b", "tests.e2e.test_b.y"]


class _Item:
    def __init__(self, name: str, long_wait: bool) -> None:
        self.name = name
        self.long_wait = long_wait

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "long_wait" and self.long_wait else None


def test_tests_that_wait_for_minutes_are_started_first() -> None:
    """The `long_wait` tests move to the front of the run, the others keep their order."""
    items = [_Item("a", False), _Item("b", True), _Item("c", False), _Item("d", True)]
    long_waits_first(items)
    assert [item.name for item in items] == ["b", "d", "a", "c"]
