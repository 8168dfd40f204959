"""`/probe` mode: read a target named in the request, keep its history, answer its series.

One entry per (module, target URL), created on the first allowed `/probe` and forgotten when
no `/probe` asked for it in the module's `forget_after`. A `/probe` in the same read slot as
the last read answers from memory (`core.probe_schedule`); concurrent `/probe`s of one target
await one shared read, which a scrape that gives up does not cancel. With Prometheus' scrape
timeout (`X-Prometheus-Scrape-Timeout-Seconds`) a read never outlives the scrape: its requests
time out within it, and a read still going at its end is cut, with no verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stallwatch.common.allowlist import (
    AllowRule,
    ProbeTarget,
    TargetError,
    allowed,
    parse_allow_rule,
    parse_target,
)
from stallwatch.common.exporter_config import (
    MAX_PROBE_TARGETS,
    ExporterConfig,
    ModuleConfig,
    TargetConfig,
    module_max_targets,
)
from stallwatch.common.text import printable
from stallwatch.core.history import TargetHistory
from stallwatch.core.probe_schedule import (
    DEBUG_MAX_AT_ONCE,
    DEBUG_MIN_GAP_SECONDS,
    SCRAPE_TIMEOUT_OFFSET_SECONDS,
    ReadBudget,
    ReadClock,
    after_cut,
    after_read,
    asked_too_long_ago,
    debug_forgettable,
    debug_refusal,
    forgotten,
    no_room,
    read_due,
    sweep_due,
)
from stallwatch.exporter.answer import AnswerWriter
from stallwatch.exporter.poll import poll_once
from stallwatch.exporter.probe_debug import DebugPoll, debug_poll, debug_text
from stallwatch.exporter.workers import probe_key, share

log = logging.getLogger("stallwatch.exporter")

# A new target beyond MAX_PROBE_TARGETS, or beyond its module's `max_targets`, is refused
# (503) rather than evicting one being watched.
# Refusal reasons of `stallwatch_probe_refused_total`.
REFUSAL_REASONS = (
    "unknown_module",
    "bad_target",
    "not_allowed",
    "module_full",
    "too_many_targets",
    "debug_busy",
    "debug_too_soon",
)
# Targets nobody asked for are looked for at most this often: a sweep walks every target, and
# doing it at every `/probe` would make each scrape cost grow with the number of targets.
FORGET_SWEEP_SECONDS = 1.0
# At most this many spellings of one target keep their rendered answer until the next read
# (Prometheus asks with one); another spelling is rendered for its `/probe` and dropped first.
MAX_SPELLINGS_RENDERED = 4


@dataclass
class _Entry:
    """What the exporter keeps about one probed target."""

    target: TargetConfig
    module: ModuleConfig
    history: TargetHistory = field(default_factory=TargetHistory)
    clock: ReadClock | None = None
    last_asked_at: float = 0.0
    reading: asyncio.Task[None] | None = None
    # The answer rendered since the last read, by the spelling of the target asked for (at
    # most MAX_SPELLINGS_RENDERED of them): an answer from memory costs no rendering.
    rendered: dict[str, bytes] = field(default_factory=dict)
    # Each spelling's writer keeps its sample names written, from one read to the next.
    writers: dict[str, AnswerWriter] = field(default_factory=dict)

    def body(self, label: str) -> bytes:
        body = self.rendered.get(label)
        if body is None:
            writer = self.writers.get(label)
            if writer is None:
                writer = AnswerWriter(replace(self.target, name=label))
                _keep_at_most(self.writers, MAX_SPELLINGS_RENDERED - 1)
                self.writers[label] = writer
            body = writer.write(self.history)
            _keep_at_most(self.rendered, MAX_SPELLINGS_RENDERED - 1)
            self.rendered[label] = body
        return body


def _keep_at_most(by_spelling: dict[str, Any], count: int) -> None:
    """Drop the oldest spellings until `count` are left."""
    while len(by_spelling) > count:
        del by_spelling[next(iter(by_spelling))]


@dataclass(frozen=True)
class ProbeAnswer:
    """The target's config and history to render, or why the `/probe` was refused."""

    target: TargetConfig | None = None
    history: TargetHistory | None = None
    body: bytes = b""  # the series, in the text exposition format
    read: bool = False  # this `/probe` read the server (False: answered from memory)
    refused: str = ""  # a REFUSAL_REASONS entry
    detail: str = ""
    status: int = 200


class ProbeService:
    """The targets `/probe` has been asked about, their histories, and the refusals."""

    def __init__(
        self,
        config: ExporterConfig,
        session: aiohttp.ClientSession,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_targets: int = MAX_PROBE_TARGETS,
        workers: int = 1,
    ) -> None:
        self.session = session
        self.clock = clock
        # With several workers, each remembers its share of the targets (`exporter.workers`).
        self.workers = workers
        self.max_targets = share(max_targets, workers)
        self.entries: dict[tuple[str, str], _Entry] = {}
        self.per_module: Counter[str] = Counter()  # entries, by module
        self.refused: Counter[tuple[str, str]] = Counter()
        self.reads = 0
        self.reads_cut = 0
        self.answers_from_memory = 0
        self.forgotten = 0
        self._config = config
        self._rules: dict[str, tuple[AllowRule, ...]] = {}
        # (module, target as asked) -> what check() found for an allowed target: Prometheus
        # asks for each target in the same words every time. Cleared with each new config.
        self._allowed: dict[tuple[str, str], tuple[ModuleConfig, ProbeTarget]] = {}
        self._owner_keys: dict[tuple[str, str], str] = {}  # see owner_key()
        self._next_sweep_at: float | None = None
        self.debug_running = 0
        self._last_debug: dict[str, float] = {}  # by server URL: when its last debug poll began
        self.apply(config)

    @property
    def modules(self) -> dict[str, ModuleConfig]:
        return dict(self._config.modules)

    def apply(self, config: ExporterConfig) -> None:
        """Take a new config: entries of a removed or changed module are forgotten."""
        self._config = config
        self._shortest_forget_after = min(
            (module.forget_after_seconds for module in config.modules.values()), default=0.0
        )
        self._allowed.clear()
        self._owner_keys.clear()
        self._rules = {
            name: tuple(parse_allow_rule(entry) for entry in module.allow)
            for name, module in config.modules.items()
        }
        for key, entry in list(self.entries.items()):
            if config.modules.get(key[0]) != entry.module:
                self._forget(key)

    def refuse(self, module: str, reason: str, detail: str, status: int = 400) -> ProbeAnswer:
        self.refused[(module, reason)] += 1
        return ProbeAnswer(refused=reason, detail=detail, status=status)

    async def probe(
        self, module_name: str, target_text: str, budget: ReadBudget | None = None
    ) -> ProbeAnswer:
        """Answer one `/probe`: refuse it, read the target, or answer from memory.

        With a `budget` (the scrape's timeout), the answer comes within it: from the read, or
        from memory when the read was cut or another `/probe`'s read is still going.
        """
        checked = self.check(module_name, target_text)
        if isinstance(checked, ProbeAnswer):
            return checked
        module, target = checked
        now = self.clock()
        self._forget_idle(now)
        key = (module_name, target.url)
        entry = self.entries.get(key)
        if (
            entry is not None
            and entry.reading is None
            and asked_too_long_ago(entry.last_asked_at, entry.module.forget_after_seconds, now)
        ):
            # The sweep runs at most once a second: a target asked for past its forget_after
            # starts anew all the same.
            self._forget(key)
            entry = None
        if entry is None:
            module_max = self.module_max_targets(module_name)
            reason = no_room(
                len(self.entries),
                self.per_module[module_name],
                max_targets=self.max_targets,
                module_max=module_max,
            )
            if reason == "module_full":
                detail = f"module {module_name} watches its {module_max} targets already"
                return self.refuse(module_name, reason, detail, status=503)
            if reason:
                detail = f"{self.max_targets} targets are watched already"
                return self.refuse(module_name, reason, detail, status=503)
            entry = self._remember(key, module, target, target_text)
        entry.last_asked_at = now
        # The table is kept in the order of the last ask: the sweep stops at the first entry
        # asked for recently (`_forget_idle`).
        self.entries[key] = self.entries.pop(key)
        wait = budget.read if budget is not None else None
        if entry.reading is not None:
            # Another `/probe` is reading it: share that read, for as long as this scrape waits.
            # asyncio.wait never cancels it, nor does this handler's own cancellation.
            await asyncio.wait({entry.reading}, timeout=wait)
            self.answers_from_memory += 1
            return ProbeAnswer(entry.target, entry.history, entry.body(target_text))
        if not read_due(entry.clock, now, module.interval_seconds):
            self.answers_from_memory += 1
            return ProbeAnswer(entry.target, entry.history, entry.body(target_text))
        before = entry.clock
        entry.clock = after_read(entry.clock, now, module.interval_seconds)
        entry.reading = asyncio.create_task(self._read(entry, budget, before))
        await asyncio.wait({entry.reading}, timeout=wait)
        return ProbeAnswer(entry.target, entry.history, entry.body(target_text), read=True)

    async def debug(
        self, module_name: str, target_text: str, budget: ReadBudget | None = None
    ) -> str | ProbeAnswer:
        """`/probe?debug=true`: one read now, step by step (or the refusal).

        It polls from the target's last reading, keeps nothing (no entry, no history), never
        sends the idle test request, and ends within the scrape's budget like any read.
        """
        checked = self.check(module_name, target_text)
        if isinstance(checked, ProbeAnswer):
            return checked
        module, target = checked
        now = self.clock()
        refusal = debug_refusal(self._last_debug.get(target.url), now, self.debug_running)
        if refusal == "debug_busy":
            detail = f"{DEBUG_MAX_AT_ONCE} debug polls are under way already; try again shortly"
            return self.refuse(module_name, refusal, detail, status=503)
        if refusal:
            detail = (
                f"{target.host}:{target.port} was polled for debug less than "
                f"{DEBUG_MIN_GAP_SECONDS:g} s ago"
            )
            return self.refuse(module_name, refusal, detail, status=429)
        for key in debug_forgettable(self._last_debug, now):
            del self._last_debug[key]
        self._last_debug[target.url] = now
        entry = self.entries.get((module_name, target.url))
        history = entry.history if entry is not None else TargetHistory()
        config = module.target(target_text, target.url)
        poll = DebugPoll()
        self.debug_running += 1
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(budget.read if budget is not None else None):
                    await debug_poll(
                        self.session,
                        within(config, budget),
                        history,
                        max_payload_bytes=self._config.max_payload_bytes,
                        into=poll,
                    )
        finally:
            self.debug_running -= 1
        after = (
            history.advance(poll.outcome, config.degraded) if poll.outcome is not None else history
        )
        body = render_answer(config, after)
        return debug_text(
            module_name, within(config, budget), history, budget, poll, body, time.time()
        )

    def check(
        self, module_name: str, target_text: str
    ) -> tuple[ModuleConfig, ProbeTarget] | ProbeAnswer:
        """The module and the target a `/probe` names, or its refusal (counted)."""
        checked = self._allowed.get((module_name, target_text))
        if checked is not None:
            return checked
        module = self._config.modules.get(module_name)
        if module is None:
            known = ", ".join(sorted(self._config.modules)) or "none configured"
            return self.refuse("", "unknown_module", f"unknown module {module_name!r} ({known})")
        try:
            target = parse_target(target_text)
        except TargetError as error:
            return self.refuse(module_name, "bad_target", str(error))
        if not allowed(target, self._rules[module_name]):
            return self.refuse(
                module_name,
                "not_allowed",
                f"{target.host}:{target.port} is not in module {module_name}'s allow list",
            )
        if len(self._allowed) >= 2 * self.max_targets:
            self._allowed.clear()
        self._allowed[(module_name, target_text)] = (module, target)
        return module, target

    def _remember(
        self, key: tuple[str, str], module: ModuleConfig, target: ProbeTarget, label: str
    ) -> _Entry:
        entry = _Entry(target=module.target(label, target.url), module=module)
        self.entries[key] = entry
        self.per_module[key[0]] += 1
        return entry

    def module_max_targets(self, name: str) -> int:
        """The most targets module `name` remembers at once (its share of `max_targets`)."""
        in_all = module_max_targets(self._config.modules, name, self.max_targets * self.workers)
        return share(in_all, self.workers)

    def owner_key(self, module_name: str, target_text: str) -> str | None:
        """What the worker owning this `/probe`'s target is chosen by (`workers.probe_key`);
        None when the module is unknown or the target unreadable (any worker refuses it)."""
        asked = (module_name, target_text)
        key = self._owner_keys.get(asked)
        if key is not None or module_name not in self._config.modules:
            return key
        try:
            key = probe_key(module_name, parse_target(target_text).url)
        except TargetError:
            return None
        if len(self._owner_keys) >= 2 * self.max_targets:
            self._owner_keys.clear()
        self._owner_keys[asked] = key
        return key

    async def _read(
        self, entry: _Entry, budget: ReadBudget | None, before: ReadClock | None
    ) -> None:
        try:
            async with asyncio.timeout(budget.read if budget is not None else None):
                outcome = await poll_once(
                    self.session,
                    within(entry.target, budget),
                    entry.history.baseline,
                    max_payload_bytes=self._config.max_payload_bytes,
                    last_proven_alive_at=entry.history.last_proven_alive_at,
                )
        except TimeoutError:
            if budget is None:  # not the scrape's deadline: a bug in the read
                log.exception("probe of %s failed", printable(entry.target.url))
                return
            self.reads_cut += 1
            entry.clock = after_cut(before)
            log.warning(
                "probe of %s cut at the scrape's deadline (%.3g s of a %.3g s scrape timeout)"
                " with no verdict: the scrape timeout must exceed the module's timeout plus"
                " its test request's timeout plus %.3g s",
                printable(entry.target.url),
                budget.read,
                budget.scrape_timeout,
                SCRAPE_TIMEOUT_OFFSET_SECONDS,
            )
        except Exception:  # a bug in one read must not fail every later `/probe`
            log.exception("probe of %s failed", printable(entry.target.url))
        else:
            previous = entry.history.state
            entry.history = entry.history.advance(outcome, entry.target.degraded)
            entry.rendered.clear()
            self.reads += 1
            if previous != entry.history.state:
                log.info(
                    "probe target=%s state=%s reason=%s",
                    printable(entry.target.name),
                    entry.history.state,
                    outcome.verdict.reason,
                )
        finally:
            entry.reading = None

    def _forget_idle(self, now: float) -> None:
        if not sweep_due(self._next_sweep_at, now, FORGET_SWEEP_SECONDS):
            return
        self._next_sweep_at = now + FORGET_SWEEP_SECONDS
        # The entries are in the order of their last ask: past the first one asked for within
        # the shortest forget_after, none is to be forgotten.
        asked: dict[tuple[str, str], tuple[float, float]] = {}
        for key, entry in self.entries.items():
            if not asked_too_long_ago(entry.last_asked_at, self._shortest_forget_after, now):
                break
            if entry.reading is None:
                asked[key] = (entry.last_asked_at, entry.module.forget_after_seconds)
        for key in forgotten(asked, now):
            self._forget(key)

    def _forget(self, key: tuple[str, str]) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self.per_module[key[0]] -= 1
            self.forgotten += 1
            if entry.reading is not None:
                entry.reading.cancel()

    async def stop(self) -> None:
        tasks = [e.reading for e in self.entries.values() if e.reading is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def within(target: TargetConfig, budget: ReadBudget | None) -> TargetConfig:
    """The target with each read's timeout cut to the scrape's budget.

    The idle test request keeps its own timeout: a healthy server given less time could fail it
    and read unresponsive. A read still waiting for it at the scrape's deadline is cut instead.
    """
    if budget is None or target.timeout_seconds <= budget.requests:
        return target
    return replace(target, timeout_seconds=budget.requests)


def render_answer(target: TargetConfig, history: TargetHistory) -> bytes:
    """The `/probe` body: the target's series, with the names and labels of `/metrics`."""
    return AnswerWriter(target).write(history)


class ProbeCollector(Collector):
    """The `/probe` side's own series on `/metrics`: targets remembered, reads, refusals."""

    def __init__(self, probes: Callable[[], ProbeService]) -> None:
        self._probes = probes

    def collect(self) -> Iterator[Metric]:
        probes = self._probes()
        refused = CounterMetricFamily(
            "stallwatch_probe_refused",
            "/probe requests refused, by module and reason; nothing was sent to their target.",
            labels=["module", "reason"],
        )
        for module in sorted(probes.modules):
            for reason in REFUSAL_REASONS:
                if reason != "unknown_module":
                    refused.add_metric([module, reason], probes.refused[(module, reason)])
        refused.add_metric(["", "unknown_module"], probes.refused[("", "unknown_module")])
        yield refused
        targets = GaugeMetricFamily(
            "stallwatch_probe_targets",
            f"Targets /probe remembers, by module (at most {probes.max_targets} in all).",
            labels=["module"],
        )
        most = GaugeMetricFamily(
            "stallwatch_probe_targets_max",
            "The most targets /probe remembers at once for the module (its max_targets).",
            labels=["module"],
        )
        for module in sorted(probes.modules):
            targets.add_metric([module], probes.per_module[module])
            most.add_metric([module], probes.module_max_targets(module))
        yield targets
        yield most
        yield CounterMetricFamily(
            "stallwatch_probe_reads",
            "/probe requests that read their target.",
            value=probes.reads,
        )
        yield CounterMetricFamily(
            "stallwatch_probe_reads_cut",
            "/probe reads cut at the scrape's deadline (X-Prometheus-Scrape-Timeout-Seconds) "
            "before their verdict; the scrape was answered with the last one.",
            value=probes.reads_cut,
        )
        yield CounterMetricFamily(
            "stallwatch_probe_answers_from_memory",
            "/probe requests answered with the last verdict, within the module's interval.",
            value=probes.answers_from_memory,
        )
        yield CounterMetricFamily(
            "stallwatch_probe_targets_forgotten",
            "Targets forgotten because no /probe asked for them in the module's forget_after.",
            value=probes.forgotten,
        )
