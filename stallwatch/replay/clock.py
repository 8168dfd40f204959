"""The replay's virtual clock: events at virtual times, run in order."""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable
from datetime import UTC, datetime

# Day zero of the replays, only used to write alert startsAt timestamps.
EPOCH = 1_767_225_600.0  # 2026-01-01T00:00:00Z


class Scheduler:
    """Events at virtual times; ties run in the order they were scheduled."""

    def __init__(self) -> None:
        self._queue: list[tuple[float, int, Callable[[float], None]]] = []
        self._order = itertools.count()

    def at(self, when: float, action: Callable[[float], None]) -> None:
        heapq.heappush(self._queue, (when, next(self._order), action))

    def next_time(self) -> float:
        return self._queue[0][0] if self._queue else math.inf

    def pop(self) -> tuple[float, Callable[[float], None]]:
        when, _, action = heapq.heappop(self._queue)
        return when, action


def rfc3339(seconds: float) -> str:
    """Virtual time `seconds` as Alertmanager writes a startsAt."""
    return datetime.fromtimestamp(EPOCH + seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
