"""One poll of one target: identify it (`kind: auto`), read, classify, and send the idle test
request only when due.

`kind: auto` asks `GET /v1/models` (safe on every engine) before it reads any metrics path,
whenever the previous poll gave no reading of a known engine: its cards' `owned_by` name the
engine, and a path that engine's profile marks unsafe (trtllm-serve's `/metrics`) is never read.
"""

from __future__ import annotations

import time

import aiohttp

from stallwatch.common.exporter_config import TargetConfig
from stallwatch.core.classify import (
    State,
    Verdict,
    classify,
    down,
    held_by_engine_fault_tolerance,
    hung,
    with_probe_result,
)
from stallwatch.core.engines import AUTO, auto_metrics_path, identify
from stallwatch.core.history import PollOutcome
from stallwatch.core.probe import probe_deferred, probe_due, settle_probe
from stallwatch.core.reading import Reading, known_engine
from stallwatch.exporter.fetch import (
    NO_METRICS_STATUSES,
    ModelsAnswer,
    ReadResult,
    allows_test_request,
    ask_models,
    engine_faults,
    engine_sleeps,
    join_url,
    models_answer,
    read_metrics,
    send_probe,
)
from stallwatch.exporter.offload import run_sized


def unread_verdict(read: ReadResult) -> Verdict:
    """The state of a server whose `/metrics` gave no reading: hung when it connected and got
    no answer in time, down otherwise (not connected, or an answer that is no reading)."""
    if read.error_reason == "timeout":
        return hung(f"/metrics: {read.detail}")
    return down(f"/metrics: {read.detail}")


async def _poll_proxy(session: aiohttp.ClientSession, target: TargetConfig) -> Verdict:
    models = await ask_models(session, target.url, timeout=target.timeout_seconds)
    if models.listed:
        return Verdict(State.NO_METRICS, "proxy: /v1/models answered; backends are read directly")
    return down(f"proxy: /v1/models did not answer ({models.detail})")


async def poll_once(
    session: aiohttp.ClientSession,
    target: TargetConfig,
    baseline: Reading | None,
    *,
    max_payload_bytes: int,
    last_proven_alive_at: float | None = None,
) -> PollOutcome:
    """Read the target once and decide its state; never raises for a misbehaving server.

    `last_proven_alive_at` (the target's history) holds back a test request that is not due
    yet; without it, every poll that asks for one sends it.
    """
    started = time.monotonic()
    started_at = time.time()

    def outcome(
        verdict: Verdict,
        reading: Reading | None,
        *,
        probes_sent: int = 0,
        probes_failed: int = 0,
        error_reason: str | None = None,
        held_back: bool = False,
    ) -> PollOutcome:
        return PollOutcome(
            verdict=verdict,
            reading=reading,
            finished_at=time.time(),
            duration_seconds=time.monotonic() - started,
            probes_sent=probes_sent,
            probes_failed=probes_failed,
            error_reason=error_reason,
            probe_deferred=held_back,
        )

    if target.kind == "proxy":
        verdict = await _poll_proxy(session, target)
        return outcome(
            verdict, None, error_reason="connection" if verdict.state == "down" else None
        )

    metrics_url = target.metrics_url
    models: ModelsAnswer | None = None
    if target.kind == AUTO:
        engine = known_engine(baseline, started_at, target.interval_seconds)
        if engine is None:
            models = await ask_models(session, target.url, timeout=target.timeout_seconds)
            if models.error_reason == "timeout":
                return outcome(hung(f"/v1/models: {models.detail}"), None, error_reason="timeout")
            if models.error_reason is not None:
                verdict = down(f"/v1/models: {models.detail}")
                return outcome(verdict, None, error_reason=models.error_reason)
            engine = identify(models.status, models.owners)
        metrics_url = join_url(target.url, auto_metrics_path(engine, target.metrics_path))

    async def models_listed() -> bool:
        if models is not None:
            return models.listed
        return await models_answer(session, target.url, timeout=target.timeout_seconds)

    read = await read_metrics(
        session,
        metrics_url,
        timeout=target.timeout_seconds,
        max_bytes=max_payload_bytes,
        kind=target.kind,
    )
    if read.status in NO_METRICS_STATUSES and await models_listed():
        reason = f"reachable, but no metrics (/metrics: {read.detail}); never restarted"
        return outcome(Verdict(State.NO_METRICS, reason), None)
    if read.reading is None:
        return outcome(unread_verdict(read), None, error_reason=read.error_reason)
    reading = read.reading
    size = read.payload_bytes
    if not reading.has_engines:
        if await models_listed():
            verdict = await run_sized(size, classify, baseline, reading)
        else:
            verdict = down("no engine series in /metrics and /v1/models did not answer")
        parse_error = "parse" if reading.malformed_lines else None
        return outcome(verdict, reading, error_reason=parse_error)

    verdict = await run_sized(size, classify, baseline, reading)
    if verdict.state == State.STALLED or verdict.probe_needed:
        faulted = await engine_faults(
            session, target.url, reading.engine_kind, timeout=target.timeout_seconds
        )
        verdict = held_by_engine_fault_tolerance(verdict, faulted)
    if not verdict.probe_needed:
        return outcome(verdict, reading)
    asleep = await engine_sleeps(
        session, target.url, reading.engine_kind, timeout=target.timeout_seconds
    )
    if asleep:
        return outcome(Verdict(State.SLEEPING, f"{reading.engine_kind} says it sleeps"), reading)
    if not target.probe.enabled:
        return outcome(
            with_probe_result(verdict, True, "test request disabled; idle by its counters"),
            reading,
        )
    if not allows_test_request(reading.engine_kind, target.probe.endpoint):
        detail = f"{reading.engine_kind} has no safe test request; idle by its counters"
        return outcome(with_probe_result(verdict, True, detail), reading)
    due = probe_due(
        verdict,
        last_proven_alive_at,
        started_at,
        min_interval=target.probe.min_interval_seconds,
        poll_interval=target.interval_seconds,
    )
    if not due:
        deferred = probe_deferred(
            verdict,
            last_proven_alive_at,
            started_at,
            min_interval=target.probe.min_interval_seconds,
        )
        return outcome(deferred, reading, held_back=True)
    model = target.probe.model or (reading.model_names[0] if reading.model_names else "")
    probe = await send_probe(
        session,
        target.url,
        model=model,
        endpoint=target.probe.endpoint,
        timeout=target.probe.timeout_seconds,
    )
    reread = None
    if not probe.succeeded:
        again = await read_metrics(
            session,
            metrics_url,
            timeout=target.timeout_seconds,
            max_bytes=max_payload_bytes,
            kind=target.kind,
        )
        reread = again.reading
    settled = await run_sized(
        size,
        settle_probe,
        verdict,
        reading,
        answered=probe.succeeded,
        detail=probe.detail,
        reread=reread,
    )
    return outcome(
        settled.verdict, settled.reading, probes_sent=1, probes_failed=settled.probes_failed
    )
