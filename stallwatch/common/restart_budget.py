"""The restart budget a fixed target and a pod rule both carry: so many restarts in a window."""

from __future__ import annotations

from dataclasses import dataclass

from stallwatch.common.config import Section

BUDGET_KEYS = ("max_restarts", "window")


@dataclass(frozen=True)
class Budget:
    max_restarts: int = 3
    window: float = 3600.0


def budget_from(section: Section) -> Budget:
    """The figures of a `budget` section (taken, and its keys checked, by the caller)."""
    return Budget(
        max_restarts=section.integer("max_restarts", 3, minimum=1),
        window=section.duration("window", 3600.0),
    )
