"""What the restarter's HTTP endpoints share: the app's keys, the bearer token check, the 401
answer (logged, throttled per client address) and the error answer."""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable

from aiohttp import web

from stallwatch.common.restarter_config import RestarterConfig
from stallwatch.common.text import printable
from stallwatch.restarter.auth_failures import AuthFailureLog
from stallwatch.restarter.service import Restarter

log = logging.getLogger("stallwatch.restarter")

RESTARTER_KEY = web.AppKey("restarter", Restarter)
AUTH_FAILURES_KEY = web.AppKey("auth_failures", AuthFailureLog)
CLOCK_KEY: web.AppKey[Callable[[], float]] = web.AppKey("clock")


def authorized(config: RestarterConfig, request: web.Request) -> bool:
    """Whether the request carries the configured bearer token (always, with no token set)."""
    if config.token is None:
        return True
    expected = f"Bearer {config.token}".encode()
    try:
        given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return False
    return hmac.compare_digest(given, expected)


def unauthorized(request: web.Request) -> web.Response:
    """The 401 answer, and a log line for it (at most one per client address per interval)."""
    client = request.remote or "unknown"
    suppressed = request.app[AUTH_FAILURES_KEY].failure(client, request.app[CLOCK_KEY]())
    if suppressed is not None:
        log.warning(
            "authentication failed: %s %s from %s (missing or wrong bearer token)%s",
            request.method,
            printable(request.path),
            client,
            f"; {suppressed} more failures from it not logged" if suppressed else "",
            extra={"client": client, "path": request.path, "suppressed": suppressed},
        )
    return error_response(401, "missing or wrong bearer token")


def error_response(status: int, message: str) -> web.Response:
    return web.json_response({"status": "error", "error": message}, status=status)
