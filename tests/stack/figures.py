"""The figures the stack tier measures (build times, sizes, time to healthy, hang to restart),
printed at the end of the run by its conftest."""

from __future__ import annotations

FIGURES: list[str] = []
