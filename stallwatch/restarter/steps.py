"""The alert plans' steps that read or ask a model server: one fresh read of its metrics, and
one test request to a target out of rotation (no user shares its queue there)."""

from __future__ import annotations

from urllib.parse import urlsplit

import aiohttp

from stallwatch.common.quarantine_config import QuarantineSettings
from stallwatch.common.restarter_config import Target
from stallwatch.core.confirmation import ReadAttempt
from stallwatch.net.fetch import read_metrics, send_test_request
from stallwatch.restarter.confirm import attempt


def base_url(target: Target) -> str:
    """The server's base URL: its metrics URL without the path."""
    parts = urlsplit(target.metrics_url)
    return f"{parts.scheme}://{parts.netloc}"


async def fresh_read(
    session: aiohttp.ClientSession | None, target: Target, timeout: float
) -> ReadAttempt | None:
    """One read of the target's metrics (None: not started, nothing to read with)."""
    if session is None:
        return None
    return attempt(await read_metrics(session, target.metrics_url, timeout=timeout))


async def one_test_request(
    session: aiohttp.ClientSession, target: Target, model: str, settings: QuarantineSettings
) -> tuple[bool, str]:
    """One `max_tokens: 1` completion for `model` to a quarantined target; whether it
    answered, and how."""
    result = await send_test_request(
        session,
        base_url(target),
        model=model,
        endpoint="completions",
        timeout=settings.test_request_timeout,
    )
    return result.succeeded, result.detail
