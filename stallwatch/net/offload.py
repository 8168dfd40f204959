"""Run the pure work on a big payload (parsing it, judging it) off the event loop.

A payload of tens of KB is parsed and judged in milliseconds, inline. One of megabytes (a
server with 100 000 engine series) takes seconds of pure Python, during which no other
target would be read and no scrape answered: above `OFF_LOOP_BYTES` that work runs in a
small, shared pool of threads. The pool has `THREADS` threads whatever the number of big
payloads (the others wait their turn), and the event loop still gets the interpreter at
every thread switch (every few milliseconds), so the other targets keep their schedule.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

# Payloads of this size or more are parsed and judged off the event loop (a real vLLM
# payload is about 50 KiB, an SGLang one 70 KiB; a synthesized DP=8 x 6 models one about
# 1.5 MiB). Below it a payload holds the loop at most about 40 ms: 128 KiB of nothing but
# engine series (2,278 of them) parse in 16 ms and are judged in 23 ms; a real one in 0.2 ms.
OFF_LOOP_BYTES = 128 * 1024
# Threads for that work, shared by every target of the process.
THREADS = 2

P = ParamSpec("P")
R = TypeVar("R")

_pool: ThreadPoolExecutor | None = None


def _threads() -> ThreadPoolExecutor:
    global _pool
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="stallwatch-parse")
    return _pool


def is_big(payload_bytes: int) -> bool:
    """Whether work on a payload of this size runs off the event loop."""
    return payload_bytes >= OFF_LOOP_BYTES


async def run_sized(
    payload_bytes: int, work: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs
) -> R:
    """`work(*args, **kwargs)`: inline for a small payload, in the shared pool for a big one."""
    if not is_big(payload_bytes):
        return work(*args, **kwargs)
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(_threads(), functools.partial(work, *args, **kwargs))
