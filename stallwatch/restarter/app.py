"""The restarter's HTTP side and process life: Alertmanager webhook, journal and metrics endpoints,
the routing verdict (`GET /routable`, and the HAProxy agent-check port when configured), and
reloading its config (SIGHUP or `POST /-/reload`).

Every well-formed payload gets a 200, whatever was decided, so Alertmanager has no reason
to deliver it again.
"""

from __future__ import annotations

import asyncio
import logging
import re
import signal
import ssl
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import aiohttp
from aiohttp import web
from prometheus_client import Gauge

from stallwatch.common.config import ConfigError
from stallwatch.common.config_files import load_restarter_config
from stallwatch.common.restarter_config import RestarterConfig
from stallwatch.common.text import printable
from stallwatch.core.alerts import PayloadError, parse_notification
from stallwatch.net.gate import (
    IDLE_KEEPALIVE_SECONDS,
    ConnectionGate,
    MalformedRequestLog,
    RequestsSeen,
)
from stallwatch.restarter.agent import AgentResponder
from stallwatch.restarter.auth_failures import AuthFailureLog
from stallwatch.restarter.confirm import Confirmer, confirm_stall
from stallwatch.restarter.controls import handle_hold, handle_pause, handle_resume
from stallwatch.restarter.journal import JournalLock
from stallwatch.restarter.journal_reader import (
    JournalError,
)
from stallwatch.restarter.routing_http import agent_answer, handle_routable
from stallwatch.restarter.service import JOURNAL_UNWRITABLE, Restarter
from stallwatch.restarter.web import (
    AUTH_FAILURES_KEY,
    CLOCK_KEY,
    RESTARTER_KEY,
    authorized,
    error_response,
    unauthorized,
)

log = logging.getLogger("stallwatch.restarter")

DEFAULT_JOURNAL_LIMIT = 50
MAX_JOURNAL_LIMIT = 1000
_JOURNAL_LIMIT = re.compile(r"[0-9]{1,4}")
PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# A webhook body must arrive within this long once its headers have (a slow or stalled
# sender would otherwise hold a connection and its memory as long as it likes).
BODY_READ_TIMEOUT_SECONDS = 10.0
# How a webhook whose client went away before its body arrived is counted (nginx's code for
# "client closed request"): no answer was sent, and it is not the restarter's error.
CLIENT_CLOSED_CODE = "499"


REQUESTS_SEEN_KEY = web.AppKey("requests_seen", RequestsSeen)
# Settings a running restarter keeps until its next start: its socket, and its open journal.
_KEPT_UNTIL_RESTART = ("listen", "tls_cert_file", "tls_key_file", "journal", "max_body_bytes")


class ConfigReloader:
    """Reload the restarter's config file: load and check it whole, then swap it in."""

    def __init__(self, restarter: Restarter, path: Path, clock: Callable[[], float]) -> None:
        self.restarter = restarter
        self.path = path
        registry = restarter.metrics.registry
        self.successful = Gauge(
            "stallwatch_restarter_config_last_reload_successful",
            "1 when the last configuration load or reload succeeded.",
            registry=registry,
        )
        self.last_success = Gauge(
            "stallwatch_restarter_config_last_reload_success_timestamp_seconds",
            "Unix time of the last successful configuration load or reload.",
            registry=registry,
        )
        self.clock = clock
        self.successful.set(1)
        self.last_success.set(clock())

    def reload(self) -> str | None:
        """Swap in the file's config; on any error keep the running one. Returns the error."""
        running = self.restarter.config
        try:
            loaded = load_restarter_config(self.path, reloading=True)
        except ConfigError as error:
            self.successful.set(0)
            log.error("reload refused, keeping the running config: %s", error)
            return str(error)
        for warning in loaded.warnings:
            log.warning("%s", warning)
        kept = {name: getattr(running, name) for name in _KEPT_UNTIL_RESTART}
        for name, value in kept.items():
            if getattr(loaded, name) != value:
                log.warning("reload: %s changes take effect on the next start", name)
        agent_listen = running.quarantine.agent_listen
        if loaded.quarantine.agent_listen != agent_listen:
            log.warning("reload: quarantine.agent_listen changes take effect on the next start")
            kept["quarantine"] = replace(loaded.quarantine, agent_listen=agent_listen)
        self.restarter.apply(replace(loaded, **kept))
        self.successful.set(1)
        self.last_success.set(self.clock())
        log.info("config reloaded: %d targets", len(loaded.targets))
        return None


RELOADER_KEY = web.AppKey("reloader", ConfigReloader)
AGENT_KEY = web.AppKey("agent", AgentResponder)


async def handle_reload(request: web.Request) -> web.StreamResponse:
    reloader = request.app[RELOADER_KEY]
    if not authorized(reloader.restarter.config, request):
        return unauthorized(request)
    error = reloader.reload()
    if error is not None:
        return error_response(400, f"reload refused, the running config is kept: {error}")
    return web.json_response({"status": "ok", "targets": len(reloader.restarter.config.targets)})


@web.middleware
async def count_webhook_answers(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    if request.path != "/alerts":
        return await handler(request)
    metrics = request.app[RESTARTER_KEY].metrics
    try:
        response = await handler(request)
    except ConnectionError:
        metrics.webhook_requests.labels(code=CLIENT_CLOSED_CODE).inc()
        raise
    except web.HTTPException as error:
        metrics.webhook_requests.labels(code=str(error.status)).inc()
        raise
    except Exception:
        metrics.webhook_requests.labels(code="500").inc()
        raise
    metrics.webhook_requests.labels(code=str(response.status)).inc()
    return response


# How many of a notification's alerts its arrival log line names.
MAX_ALERTS_NAMED = 5


async def handle_alerts(request: web.Request) -> web.StreamResponse:
    restarter = request.app[RESTARTER_KEY]
    if not authorized(restarter.config, request):
        return unauthorized(request)
    if not restarter.leads:
        # Not the Lease holder: Alertmanager retries, and the Service sends it to the holder.
        return error_response(503, "this replica does not hold the Lease; another one acts")
    limit = restarter.config.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        return error_response(413, f"body larger than {limit} bytes")
    try:
        async with asyncio.timeout(BODY_READ_TIMEOUT_SECONDS):
            body = await request.read()
    except web.HTTPRequestEntityTooLarge:
        return error_response(413, f"body larger than {limit} bytes")
    except TimeoutError:
        return error_response(408, f"body not received within {BODY_READ_TIMEOUT_SECONDS:g} s")
    except aiohttp.ClientPayloadError as error:  # the client went away mid-body
        log.info("webhook client went away before its body arrived: %s", error)
        raise ConnectionResetError(str(error)) from None
    try:
        notification = parse_notification(body)
    except PayloadError as error:
        log.warning("rejected a webhook payload: %s", printable(str(error)))
        return error_response(400, f"not an Alertmanager version 4 payload: {error}")
    # Said on arrival: the decision comes only after the confirming reads, seconds later.
    log.info(
        "webhook: %d alert(s) received: %s",
        len(notification.alerts),
        printable(
            ", ".join(
                f"{alert.alertname} {alert.status} target={alert.target}"
                for alert in notification.alerts[:MAX_ALERTS_NAMED]
            )
            + (" ..." if len(notification.alerts) > MAX_ALERTS_NAMED else "")
        ),
    )
    decisions = await restarter.handle(notification)
    if any(decision["reason"] == JOURNAL_UNWRITABLE for decision in decisions):
        answer = {
            "status": "error",
            "error": f"the journal cannot be written ({restarter.journal.failure}): "
            "alerts whose decision it could not record were not acted on",
            "decisions": decisions,
        }
        return web.json_response(answer, status=503)
    return web.json_response({"status": "ok", "decisions": decisions})


async def handle_journal(request: web.Request) -> web.StreamResponse:
    restarter = request.app[RESTARTER_KEY]
    if not authorized(restarter.config, request):
        return unauthorized(request)
    raw = request.query.get("limit", str(DEFAULT_JOURNAL_LIMIT))
    if not _JOURNAL_LIMIT.fullmatch(raw) or not 1 <= int(raw) <= MAX_JOURNAL_LIMIT:
        return error_response(400, f"limit: expected an integer from 1 to {MAX_JOURNAL_LIMIT}")
    entries = restarter.journal.recent(int(raw))
    return web.json_response({"entries": [entry.as_json() for entry in entries]})


async def handle_metrics(request: web.Request) -> web.StreamResponse:
    restarter = request.app[RESTARTER_KEY]
    try:
        restarter.refresh_gauges()
    except JournalError as error:  # serve what is known; the error is in the log
        log.error("metrics: gauges not refreshed from the journal: %s", error)
    return web.Response(
        body=restarter.metrics.exposition(), headers={"Content-Type": PROMETHEUS_CONTENT_TYPE}
    )


async def handle_healthy(request: web.Request) -> web.StreamResponse:
    failure = request.app[RESTARTER_KEY].journal.failure
    if failure is not None:
        return web.Response(status=503, text=f"journal failing: {failure}\n")
    return web.Response(text="OK\n")


async def handle_ready(request: web.Request) -> web.StreamResponse:
    """Ready to take alerts: the journal works and, with a Lease, this replica holds it."""
    restarter = request.app[RESTARTER_KEY]
    failure = restarter.journal.failure
    if failure is not None:
        return web.Response(status=503, text=f"journal failing: {failure}\n")
    kube = restarter.kube
    if kube is not None and kube.lease is not None:
        holder = restarter.metrics.lease_holder.labels(lease=kube.lease.settings.name)
        holder.set(1 if kube.acting else 0)
        if not kube.acting:
            held_by = kube.lease.holder or "nobody yet"
            return web.Response(status=503, text=f"standing by: the Lease is held by {held_by}\n")
    return web.Response(text="OK\n")


@web.middleware
async def journal_errors_are_503(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        return await handler(request)
    except JournalError as error:
        log.error("%s %s: %s", request.method, request.path, error)
        return error_response(503, str(error))


def build_app(
    config: RestarterConfig,
    *,
    clock: Callable[[], float] = time.time,
    confirmer: Confirmer = confirm_stall,
    config_path: Path | None = None,
) -> web.Application:
    """The restarter's aiohttp application (journal opened now, HTTP session on startup).

    With `config_path`, `POST /-/reload` (authenticated) reloads that file.
    """
    if config.token is None:
        log.warning(
            "INSECURE: insecure_no_auth is set; anyone who can reach %s can ask for restarts",
            config.listen,
        )
    seen = RequestsSeen()
    app = web.Application(
        client_max_size=config.max_body_bytes,
        middlewares=[seen.middleware, count_webhook_answers, journal_errors_are_503],
    )
    app[REQUESTS_SEEN_KEY] = seen
    app[AUTH_FAILURES_KEY] = AuthFailureLog()
    app[CLOCK_KEY] = clock
    restarter = Restarter(config, clock=clock, confirmer=confirmer)
    app[RESTARTER_KEY] = restarter
    agent_listen = config.quarantine.agent_listen
    agent = AgentResponder(agent_answer(restarter)) if agent_listen is not None else None
    if agent is not None:
        app[AGENT_KEY] = agent

    async def start(_: web.Application) -> None:
        await restarter.start()
        if agent is not None and agent_listen is not None:
            # After the restarter's start, so that its first answers already know who is out
            # of rotation (an early `up` would put a quarantined server back).
            try:
                await agent.start(agent_listen)
            except OSError:
                await restarter.stop()
                raise
            log.info("HAProxy agent-check responder listening on %s", agent_listen)

    async def stop(_: web.Application) -> None:
        if agent is not None:
            await agent.stop()
        await restarter.stop()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    app.router.add_post("/alerts", handle_alerts)
    app.router.add_get("/journal", handle_journal)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/-/healthy", handle_healthy)
    app.router.add_get("/-/ready", handle_ready)
    app.router.add_get("/routable", handle_routable)
    app.router.add_post("/-/pause", handle_pause)
    app.router.add_post("/-/resume", handle_resume)
    app.router.add_post("/-/hold", handle_hold)
    app.router.add_delete("/-/hold", handle_hold)
    if config_path is not None:
        app[RELOADER_KEY] = ConfigReloader(restarter, config_path, clock)
        app.router.add_post("/-/reload", handle_reload)
    return app


def ssl_context(config: RestarterConfig) -> ssl.SSLContext | None:
    if config.tls_cert_file is None or config.tls_key_file is None:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(config.tls_cert_file, config.tls_key_file)
    return context


async def serve(
    config: RestarterConfig,
    *,
    stop: asyncio.Event | None = None,
    config_path: Path | None = None,
) -> None:
    """Run the restarter until `stop` is set (or forever); SIGHUP reloads `config_path`.

    The journal is claimed first: a second restarter on it stops here, before it reads or
    writes anything."""
    lock = JournalLock.take(config.journal)
    try:
        await _serve_locked(config, stop, config_path)
    finally:
        lock.release()


async def _serve_locked(
    config: RestarterConfig, stop: asyncio.Event | None, config_path: Path | None
) -> None:
    app = build_app(config, config_path=config_path)
    runner = web.AppRunner(
        app,
        access_log=None,
        keepalive_timeout=IDLE_KEEPALIVE_SECONDS,
        logger=MalformedRequestLog(log),
    )
    await runner.setup()
    host, port = config.host_port
    assert runner.server is not None  # set up above
    gate = ConnectionGate(runner.server, app[REQUESTS_SEEN_KEY])
    try:
        listener = await asyncio.get_running_loop().create_server(
            gate.protocol, host, port, ssl=ssl_context(config)
        )
    except BaseException:
        await runner.cleanup()
        raise
    scheme = "https" if config.tls_cert_file else "http"
    log.info("restarter listening on %s://%s (journal %s)", scheme, config.listen, config.journal)
    for line in config.quarantine_summary():
        log.info("%s", line)
    loop = asyncio.get_running_loop()
    if config_path is not None:
        loop.add_signal_handler(signal.SIGHUP, app[RELOADER_KEY].reload)
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        if config_path is not None:
            loop.remove_signal_handler(signal.SIGHUP)
        listener.close()
        await runner.cleanup()
