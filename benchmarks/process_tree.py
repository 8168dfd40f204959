"""CPU and memory of a process and its live descendants, from /proc (Linux): an exporter may
do its work in children (blackbox_exporter does not; a Python exporter with workers would)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

from benchmarks.probe_mode import rss_bytes
from benchmarks.scale import process_cpu_seconds


def descendants(pid: int) -> list[int]:
    """`pid` and its live children, grandchildren and so on (from /proc)."""
    found = [pid]
    for parent in found:
        with contextlib.suppress(FileNotFoundError):
            for task in os.listdir(f"/proc/{parent}/task"):
                path = f"/proc/{parent}/task/{task}/children"
                with contextlib.suppress(FileNotFoundError), open(path, encoding="ascii") as ids:
                    found += [int(child) for child in ids.read().split()]
    return found


def tree_cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its live descendants."""
    return _tree_sum(pid, process_cpu_seconds)


def tree_rss_bytes(pid: int) -> int:
    """Resident memory of a process and its live descendants."""
    return int(_tree_sum(pid, rss_bytes))


def _tree_sum(pid: int, measure: Callable[[int], float]) -> float:
    """`measure` summed over `pid` and its live descendants (one gone meanwhile counts 0)."""
    total = 0.0
    for member in descendants(pid):
        with contextlib.suppress(FileNotFoundError):
            total += measure(member)
    return total
