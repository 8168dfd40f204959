"""The operator's controls over HTTP: pause and resume restarts, hold a target (bearer token)."""

from __future__ import annotations

from aiohttp import web

from stallwatch.common.config import parse_duration
from stallwatch.restarter.web import RESTARTER_KEY, authorized, error_response, unauthorized


async def handle_pause(request: web.Request) -> web.StreamResponse:
    """`POST /-/pause?for=2h&reason=...`: no restarts until resumed or until the time is up."""
    restarter = request.app[RESTARTER_KEY]
    if not authorized(restarter.config, request):
        return unauthorized(request)
    duration: float | None = None
    if "for" in request.query:
        try:
            duration = parse_duration(request.query["for"])
        except ValueError as error:
            return error_response(400, f"for: {error}")
        if duration <= 0:
            return error_response(400, "for: must be longer than zero")
    reason = request.query.get("reason", "paused over HTTP")[:500]
    restarter.fleet.pause(duration, reason)
    return web.json_response({"status": "ok", "paused": True, "for_seconds": duration})


async def handle_resume(request: web.Request) -> web.StreamResponse:
    """`POST /-/resume`: close the breaker, end any pause, judge the held alerts again."""
    restarter = request.app[RESTARTER_KEY]
    if not authorized(restarter.config, request):
        return unauthorized(request)
    restarter.fleet.resume(request.query.get("reason", "resumed over HTTP")[:500])
    held = await restarter.release_held()
    return web.json_response(
        {"status": "ok", "paused": False, "breaker_open": False, "judged_again": held}
    )


_TARGET_NAME_CHARS = 253


async def handle_hold(request: web.Request) -> web.StreamResponse:
    """`POST /-/hold?target=X&for=5m&reason=...`: X will be silent for up to that long (a
    weight sync, maintenance): its restart alerts are not acted on until the hold ends or is
    released. `DELETE /-/hold?target=X`: end it now (its held alerts are judged again)."""
    restarter = request.app[RESTARTER_KEY]
    if not authorized(restarter.config, request):
        return unauthorized(request)
    target = request.query.get("target", "")
    if not target or len(target) > _TARGET_NAME_CHARS or not target.isprintable():
        return error_response(400, "target: give the name of a target of the restarter's config")
    known = restarter.config.target(target) is not None
    if request.method == "DELETE":
        released = restarter.holds.release(
            target, request.query.get("reason", "released over HTTP")[:500]
        )
        judged = 0
        if released:
            judged = await restarter.release_held()
        return web.json_response(
            {"status": "ok", "target": target, "released": released, "judged_again": judged}
        )
    if not known:
        return error_response(404, f"target: {target!r} is not a target of the restarter's config")
    if "for" not in request.query:
        return error_response(400, "for: give the hold's length, e.g. for=5m")
    try:
        duration = parse_duration(request.query["for"])
    except ValueError as error:
        return error_response(400, f"for: {error}")
    reason = request.query.get("reason", "held over HTTP")[:500]
    refusal = restarter.holds.hold(target, duration, reason)
    if refusal is not None:
        return error_response(400, f"for: {refusal}")
    until = restarter.clock() + duration
    return web.json_response(
        {"status": "ok", "target": target, "for_seconds": duration, "until": until}
    )
