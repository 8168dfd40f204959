"""A real llama-server keeps generating while its `/metrics` is scraped every second, or faster.

An open report (ggml-org/llama.cpp#29104, CUDA graphs, unconfirmed) says `llama-server` silently
stops processing when `/metrics` is scraped every second. Here four slots generate without
pause while the phases alternate: no scraping, a scrape every 1 s, a scrape every 0.25 s, no
scraping again. Each phase's tokens/s is measured from the completions that finished in it, side
by side in one run, so the bounds are ratios to the unscraped phases of the same run (generous:
the machine is shared), never absolute speeds.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from itertools import pairwise

import aiohttp

from tests.real_llamacpp.llamacpp_server import RealLlamaServer, complete, metric_value

SLOTS = 4
PROMPT_CHARS = 64
TOKENS_PER_COMPLETION = 48
PHASE_S = 15.0
# (name, scrape interval in seconds or None): the unscraped phases bracket the scraped ones.
PHASES: tuple[tuple[str, float | None], ...] = (
    ("unscraped", None),
    ("scraped every 1 s", 1.0),
    ("scraped every 0.25 s", 0.25),
    ("unscraped again", None),
)
# A scraped phase must keep at least this share of the unscraped tokens/s: a server that stops
# processing makes almost none, a loaded shared machine still makes far more than this.
MIN_RATIO = 0.3
# No completion of 48 tokens may take this long, and no stretch of a phase may pass without one
# finishing: a request that stalls shows here.
REQUEST_TIMEOUT_S = 60.0
LONGEST_GAP_S = 20.0


@dataclass
class Phase:
    name: str
    interval: float | None
    start: float = 0.0
    end: float = 0.0
    finished: list[tuple[float, int]] = field(default_factory=list)
    scrapes: list[tuple[float, float | None]] = field(default_factory=list)

    @property
    def tokens_per_second(self) -> float:
        return sum(tokens for _, tokens in self.finished) / (self.end - self.start)

    @property
    def longest_gap(self) -> float:
        """The longest stretch of the phase in which no completion finished."""
        times = [self.start, *sorted(at for at, _ in self.finished), self.end]
        return max(later - earlier for earlier, later in pairwise(times))


async def _generate(
    session: aiohttp.ClientSession,
    url: str,
    done: list[tuple[float, int, float]],
    stop: asyncio.Event,
) -> None:
    """Complete one request after another until `stop`; each as (end, tokens, seconds)."""
    while not stop.is_set():
        began = time.monotonic()
        answer = await complete(session, url, PROMPT_CHARS, TOKENS_PER_COMPLETION)
        ended = time.monotonic()
        done.append((ended, int(answer["tokens_predicted"]), ended - began))


async def _scrape(session: aiohttp.ClientSession, url: str, phase: Phase) -> None:
    """GET /metrics every `phase.interval` until the phase ends; each as (time, n_decode_total)."""
    assert phase.interval is not None
    next_at = time.monotonic()
    while next_at < phase.end:
        async with session.get(url + "/metrics") as response:
            assert response.status == 200, f"/metrics answered {response.status}"
            text = await response.text()
        phase.scrapes.append((time.monotonic(), metric_value(text, "llamacpp:n_decode_total")))
        next_at += phase.interval
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))


async def test_real_llamacpp_keeps_generating_while_metrics_is_scraped_every_second(
    real_llamacpp: RealLlamaServer,
) -> None:
    """Scraped every 1 s and every 0.25 s, four slots keep finishing completions at a rate
    comparable to the unscraped phases around them, with no request stalled."""
    url = real_llamacpp.base_url
    phases = [Phase(name, interval) for name, interval in PHASES]
    done: list[tuple[float, int, float]] = []
    stop = asyncio.Event()
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        load = [asyncio.create_task(_generate(session, url, done, stop)) for _ in range(SLOTS)]
        try:
            await asyncio.sleep(2.0)  # every slot decoding before the first phase
            for phase in phases:
                phase.start = time.monotonic()
                phase.end = phase.start + PHASE_S
                if phase.interval is None:
                    await asyncio.sleep(PHASE_S)
                else:
                    await _scrape(session, url, phase)
                phase.end = max(phase.end, time.monotonic())
            stop.set()
            await asyncio.wait_for(asyncio.gather(*load), REQUEST_TIMEOUT_S)
        finally:
            stop.set()
            for task in load:
                task.cancel()
            await asyncio.gather(*load, return_exceptions=True)
    for phase in phases:
        phase.finished = [(at, tokens) for at, tokens, _ in done if phase.start <= at < phase.end]

    unscraped = [p.tokens_per_second for p in phases if p.interval is None]
    baseline = sum(unscraped) / len(unscraped)
    figures = {
        p.name: (
            f"{p.tokens_per_second:.1f} tokens/s, {len(p.finished)} completions, "
            f"longest gap {p.longest_gap:.1f} s, {len(p.scrapes)} scrapes"
        )
        for p in phases
    }
    slowest = max(seconds for _, _, seconds in done)
    print(f"real llama.cpp under scraping: {figures}; slowest completion {slowest:.1f} s")

    assert baseline > 0, figures
    assert all(tokens == TOKENS_PER_COMPLETION for _, tokens, _ in done), done
    for phase in phases:
        assert phase.finished, f"{phase.name}: no completion finished ({figures})"
        assert phase.longest_gap < LONGEST_GAP_S, figures
        if phase.interval is None:
            continue
        assert phase.tokens_per_second >= MIN_RATIO * baseline, figures
        decodes = [value for _, value in phase.scrapes if value is not None]
        assert len(decodes) == len(phase.scrapes) >= PHASE_S / phase.interval / 2, phase.scrapes
        assert decodes[-1] > decodes[0], f"{phase.name}: n_decode_total flat: {decodes}"
