"""scripts/test_tiers.py loaded as a module, for the tests of the tier runner."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def tier_runner() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "test_tiers_script", REPO / "scripts" / "test_tiers.py"
    )
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module
