"""Which event loop a service runs on: uvloop where it is installed, asyncio's own otherwise.

The exporter's work per read is mostly event-loop work (a connection, a write, the bytes read,
a `/probe` served): on uvloop, whose loop and transports are compiled, the same reads cost less
CPU (BENCHMARKS.md, the peer section). Nothing else changes: both loops run the same code, and
`--event-loop=asyncio` keeps asyncio's own.
"""

from __future__ import annotations

import asyncio
import importlib
import platform
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from types import ModuleType
from typing import Any, TypeVar

EVENT_LOOPS = ("auto", "uvloop", "asyncio")

T = TypeVar("T")


class EventLoopUnavailable(Exception):
    """The event loop asked for cannot be used here."""


@dataclass(frozen=True)
class EventLoop:
    """The loop chosen: its name and version, and how to make one."""

    name: str
    version: str
    new_loop: Callable[[], asyncio.AbstractEventLoop]

    def describe(self) -> str:
        return f"{self.name} {self.version}"


def _installed(module_name: str) -> ModuleType | None:
    try:
        return importlib.import_module(module_name)
    except ImportError:
        return None


def choose_event_loop(
    wanted: str, find: Callable[[str], ModuleType | None] = _installed
) -> EventLoop:
    """The loop for `wanted` (one of EVENT_LOOPS): `auto` is uvloop when `find` finds it."""
    if wanted not in EVENT_LOOPS:
        raise EventLoopUnavailable(f"unknown event loop {wanted!r}: one of {EVENT_LOOPS}")
    asyncio_loop = EventLoop("asyncio", platform.python_version(), asyncio.new_event_loop)
    if wanted == "asyncio":
        return asyncio_loop
    uvloop = find("uvloop")
    if uvloop is None:
        if wanted == "uvloop":
            raise EventLoopUnavailable(
                "--event-loop=uvloop: uvloop is not installed (pip install uvloop)"
            )
        return asyncio_loop
    return EventLoop("uvloop", str(getattr(uvloop, "__version__", "?")), uvloop.new_event_loop)


def run_on(loop: EventLoop, main: Coroutine[Any, Any, T]) -> T:
    """`asyncio.run(main)` on a loop of `loop`'s kind."""
    with asyncio.Runner(loop_factory=loop.new_loop) as runner:
        return runner.run(main)
