"""Every alert decision is the core's: the restarter and the replays only drive its plans."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "stallwatch"
# The core's deciding functions: called only by the alert plan (and the core's own modules).
DECIDING = frozenset(
    {
        "decide",
        "decide_confirmed",
        "with_window",
        "judge_window",
        "with_confirmation",
        "look",
        "after_test_request",
        "quarantine_refusal",
        "settle_window",
        "waiting_after",
    }
)
DRIVERS = sorted([*(ROOT / "restarter").rglob("*.py"), *(ROOT / "replay").rglob("*.py")])


def called_names(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Name):
                names.add(func.id)
            elif isinstance(func, ast.Attribute):
                names.add(func.attr)
    return names


@pytest.mark.parametrize("path", DRIVERS, ids=[str(p.relative_to(ROOT)) for p in DRIVERS])
def test_no_driver_decides_an_alert_itself(path: Path) -> None:
    """No module of the restarter or the replays calls a deciding function of the core."""
    assert called_names(path) & DECIDING == set()


def test_the_check_finds_a_decision_outside_the_core(tmp_path: Path) -> None:
    """The check itself fails on a module that calls `decide` (it can fail)."""
    module = tmp_path / "driver.py"
    module.write_text("def judge(a, c, h, n):\n    return policy.decide(a, c, h, n)\n")
    assert called_names(module) & DECIDING == {"decide"}


def test_every_skip_reason_is_documented() -> None:
    """Each label value of stallwatch_restarter_skips_total is named in docs/restarter.md."""
    from stallwatch.core.policy import SKIP_REASONS

    text = (ROOT.parent / "docs" / "restarter.md").read_text(encoding="utf-8")
    assert [reason for reason in SKIP_REASONS if f"`{reason}`" not in text] == []
