"""The example restart scripts shipped in examples/actions."""

from __future__ import annotations

from pathlib import Path

ACTIONS = Path(__file__).resolve().parents[2] / "examples" / "actions"
