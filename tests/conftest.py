"""Every test is marked by the tier it lives in, so a person can pick tiers with `-m`.

The tier is the first directory under `tests/`: unit, contract, component, e2e, stack, and
`real` for the three real-server directories (`real`, `real_llamacpp`, `real_sglang`). The markers
are registered in pyproject.toml; `make test-unit` is `-m unit`, `make test-fast` is
`-m "not real and not stack"`.

Tests marked `long_wait` (minutes of shipped timings, most of it waiting) run first: started
last, one of them would end its tier alone while the other workers sit idle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parent
TIER_OF_DIRECTORY = {
    "unit": "unit",
    "contract": "contract",
    "component": "component",
    "e2e": "e2e",
    "real": "real",
    "real_llamacpp": "real",
    "real_sglang": "real",
    "stack": "stack",
}


def tier_of(path: Path) -> str | None:
    """The tier of a test file: its first directory under tests/, or None outside the tiers."""
    try:
        parts = path.resolve().relative_to(TESTS).parts
    except ValueError:
        return None
    return TIER_OF_DIRECTORY.get(parts[0]) if len(parts) > 1 else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        tier = tier_of(item.path)
        if tier is None:
            tiers = ", ".join(f"tests/{name}" for name in TIER_OF_DIRECTORY)
            raise pytest.UsageError(f"{item.nodeid} is in no tier: move it under one of {tiers}")
        item.add_marker(getattr(pytest.mark, tier))
    long_waits_first(items)


def long_waits_first(items: list[Any]) -> None:
    """Put the tests marked `long_wait` first, each group in its order (a stable sort)."""
    items.sort(key=lambda item: item.get_closest_marker("long_wait") is None)
