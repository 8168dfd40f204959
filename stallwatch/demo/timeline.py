"""The demo's timeline: one line per event, with the time since the demo started."""

from __future__ import annotations

import time
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, TextIO


class Timeline:
    """One line per event, with the time since the demo started."""

    COLORS: Mapping[str, str] = MappingProxyType(
        {"story": "1", "problem": "1;31", "good": "32", "alert": "33", "restarter": "36"}
    )

    def __init__(self, out: TextIO, started: float, color: bool) -> None:
        self.out = out
        self.started = started
        self.color = color
        self.events: list[dict[str, Any]] = []

    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def emit(self, source: str, message: str, tone: str = "") -> None:
        elapsed = self.elapsed()
        self.events.append({"t": round(elapsed, 2), "source": source, "message": message})
        line = f"{elapsed:7.1f}s  {source:<12} {message}"
        code = self.COLORS.get(tone)
        if self.color and code:
            line = f"\033[{code}m{line}\033[0m"
        print(line, file=self.out, flush=True)

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)
