"""The exporter's HTTP side and process life: `/metrics`, reload on SIGHUP or `POST /-/reload`."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import html
import json
import logging
import os
import signal
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    generate_latest,
)
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from stallwatch import USER_AGENT
from stallwatch.common.config import ConfigError, netloc
from stallwatch.common.config_files import load_exporter_config
from stallwatch.common.exporter_config import ExporterConfig
from stallwatch.core.probe_schedule import read_budget
from stallwatch.exporter.collector import ExporterProcessCollector, TargetCollector
from stallwatch.exporter.exposition import UnsupportedFamily, exposition
from stallwatch.exporter.multitarget import ProbeCollector
from stallwatch.exporter.peers import PeerAnswer, PeerServer
from stallwatch.exporter.service import ExporterService
from stallwatch.exporter.web_config import WebConfig, protect, server_ssl_context
from stallwatch.exporter.worker_links import WORKER_LINKS_KEY, WorkerCollector, WorkerLinks
from stallwatch.exporter.workers import WorkerShare, families_json, family_data, merged
from stallwatch.net.gate import (
    ConnectionGate,
    MalformedRequestLog,
    RequestsSeen,
    cap_for_open_files,
)

log = logging.getLogger("stallwatch.exporter")

SERVICE_KEY = web.AppKey("service", ExporterService)
REGISTRY_KEY = web.AppKey("registry", CollectorRegistry)
CONFIG_PATH_KEY = web.AppKey("config_path", Path)
REQUESTS_SEEN_KEY = web.AppKey("requests_seen", RequestsSeen)
# What Prometheus sends with every scrape: its scrape_timeout, in seconds.
SCRAPE_TIMEOUT_HEADER = "X-Prometheus-Scrape-Timeout-Seconds"
TEXT = "text/plain; charset=utf-8"
ORPHAN_CHECK_SECONDS = 1.0


class ListenError(Exception):
    """The exporter cannot listen where its config says (port in use, address not local)."""


def listen_error(host: str, port: int, error: OSError) -> ListenError:
    return ListenError(f"cannot listen on {netloc(host, port)}: {error.strerror or error}")


def build_registry(service: ExporterService, links: WorkerLinks | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TargetCollector(service.polled_config, lambda: service.histories))
    if links is not None:
        registry.register(WorkerCollector(links))
    registry.register(ExporterProcessCollector(lambda: service.reload_status))
    registry.register(ProbeCollector(lambda: service.probes))
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    return registry


async def reload_config(service: ExporterService, path: Path) -> str | None:
    """Load, validate, then swap in; on a bad file keep the running config. Returns the error."""
    try:
        new_config = load_exporter_config(path, reloading=True)
    except ConfigError as error:
        service.reload_status.successful = False
        log.error("reload refused, keeping the running config: %s", error)
        return str(error)
    for warning in new_config.warnings:
        log.warning("%s", warning)
    if (new_config.listen_host, new_config.listen_port) != (
        service.config.listen_host,
        service.config.listen_port,
    ):
        log.warning("listen address changes take effect on the next start")
    await service.apply(new_config)
    service.reload_status.successful = True
    service.reload_status.last_success_at = time.time()
    log.info("config reloaded: %d targets", len(new_config.targets))
    return None


def _written(families: list[Metric]) -> bytes:
    try:
        return exposition(families)
    except UnsupportedFamily:  # a family of another kind: the reference writer writes it
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_Families(families))
        return generate_latest(registry)


class _Families(Collector):
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        yield from self.families


async def handle_metrics(request: web.Request) -> web.Response:
    registry = request.app[REGISTRY_KEY]
    links = request.app.get(WORKER_LINKS_KEY)
    if links is None:
        body = _written(list(registry.collect()))
    else:
        own = family_data(registry.collect())
        others = await links.families()
        body = _written([*merged([own, *others]), links.answering(1 + len(others))])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def probe_answer(
    service: ExporterService, module: str, target: str, scrape_timeout: str | None, debug: bool
) -> PeerAnswer:
    """The answer to `/probe?module=&target=` (`debug=true`: one read's steps as plain text),
    `scrape_timeout` the value of Prometheus' scrape timeout header, if sent."""
    probes = service.probes
    try:
        budget = read_budget(scrape_timeout)
    except ValueError as error:
        return _text(400, f"probe refused: {SCRAPE_TIMEOUT_HEADER}: {error}\n")
    if debug:
        steps = await probes.debug(module, target, budget)
        if isinstance(steps, str):
            return _text(200, steps)
        return _text(steps.status, f"probe refused: {steps.detail}\n")
    answer = await probes.probe(module, target, budget)
    if answer.target is None or answer.history is None:
        return _text(answer.status, f"probe refused: {answer.detail}\n")
    return PeerAnswer(200, CONTENT_TYPE_LATEST, answer.body)


def _text(status: int, text: str) -> PeerAnswer:
    return PeerAnswer(status, TEXT, text.encode("utf-8"))


async def handle_probe(request: web.Request) -> web.Response:
    """`GET /probe?target=URL&module=NAME[&debug=true]`: the target's series, read now or from
    memory, within the scrape's timeout; with `debug=true`, one read's steps as plain text.
    With workers, the worker owning the target answers it (`exporter.workers`)."""
    service = request.app[SERVICE_KEY]
    module = request.query.get("module", "")
    target = request.query.get("target", "")
    debug = request.query.get("debug", "false").lower() == "true"
    scrape_timeout = request.headers.get(SCRAPE_TIMEOUT_HEADER)
    links = request.app.get(WORKER_LINKS_KEY)
    owner = links.owner(service.probes.owner_key(module, target)) if links else None
    if links is None or owner is None:
        answer = await probe_answer(service, module, target, scrape_timeout, debug)
    else:
        answer = await links.probe(owner, module, target, scrape_timeout, debug)
    return web.Response(
        status=answer.status, body=answer.body, headers={"Content-Type": answer.content_type}
    )


async def answer_worker(app: web.Application, request: dict[str, Any]) -> PeerAnswer:
    """What another worker asks of this one: a `/probe` of a target it owns, its families for
    `/metrics`, its configured targets' verdicts for `/`, a reload."""
    service = app[SERVICE_KEY]
    match request.get("op"):
        case "probe":
            timeout = request.get("scrape_timeout")
            return await probe_answer(
                service,
                str(request.get("module", "")),
                str(request.get("target", "")),
                None if timeout is None else str(timeout),
                bool(request.get("debug")),
            )
        case "metrics":
            body = families_json(family_data(app[REGISTRY_KEY].collect()))
            return PeerAnswer(200, "application/json", body)
        case "verdicts":
            body = json.dumps(own_verdicts(service)).encode()
            return PeerAnswer(200, "application/json", body)
        case "reload":
            error = await reload_config(service, app[CONFIG_PATH_KEY])
            return _text(200, "reloaded\n") if error is None else _text(400, error)
        case other:
            return _text(400, f"unknown request {other!r}\n")


async def handle_reload(request: web.Request) -> web.Response:
    error = await reload_config(request.app[SERVICE_KEY], request.app[CONFIG_PATH_KEY])
    links = request.app.get(WORKER_LINKS_KEY)
    if error is None and links is not None:
        error = await links.reload()
    if error is not None:
        return web.Response(status=400, text=f"reload refused: {error}\n")
    return web.Response(text="reloaded\n")


async def handle_healthy(_: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def handle_ready(_: web.Request) -> web.Response:
    """Ready as soon as it answers: the config is loaded before the exporter listens, and
    /probe needs no warm-up (Prometheus's /-/ready, for the probes that expect it)."""
    return web.Response(text="ok\n")


def own_verdicts(service: ExporterService) -> dict[str, tuple[str, str]]:
    """(state, reason) of each configured target this process has judged, by name."""
    verdicts = {}
    for target in service.config.targets:
        history = service.histories.get(target.name)
        if history is not None and history.verdict is not None:
            verdicts[target.name] = (str(history.verdict.state), history.verdict.reason)
    return verdicts


async def handle_index(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    verdicts = own_verdicts(service)
    links = request.app.get(WORKER_LINKS_KEY)
    if links is not None:
        verdicts.update(await links.verdicts())  # each target has one owner
    rows = []
    for target in service.config.targets:
        state, reason = verdicts.get(target.name, ("not polled yet", ""))
        cells = (target.name, target.url, state, reason)
        rows.append("<tr>" + "".join(f"<td>{html.escape(cell)}</td>" for cell in cells) + "</tr>")
    page = (
        "<html><head><title>stallwatch exporter</title></head><body>"
        "<h1>stallwatch exporter</h1><p><a href='/metrics'>metrics</a></p>"
        "<table border=1><tr><th>target</th><th>url</th><th>state</th><th>why</th></tr>"
        + "".join(rows)
        + "</table></body></html>"
    )
    return web.Response(text=page, content_type="text/html")


def build_app(
    service: ExporterService, config_path: Path, workers: WorkerShare | None = None
) -> web.Application:
    seen = RequestsSeen()
    app = web.Application(client_max_size=64 * 1024, middlewares=[seen.middleware])
    app[REQUESTS_SEEN_KEY] = seen
    app[SERVICE_KEY] = service
    links = WorkerLinks(workers) if workers is not None else None
    app[REGISTRY_KEY] = build_registry(service, links)
    if links is not None:
        app[WORKER_LINKS_KEY] = links
    app[CONFIG_PATH_KEY] = config_path
    app.router.add_get("/", handle_index)
    app.router.add_get("/metrics", handle_metrics)
    app.router.add_get("/probe", handle_probe)
    app.router.add_post("/-/reload", handle_reload)
    app.router.add_get("/-/healthy", handle_healthy)
    app.router.add_get("/-/ready", handle_ready)
    return app


@contextlib.asynccontextmanager
async def running_exporter(
    config: ExporterConfig,
    config_path: Path,
    *,
    host: str | None = None,
    port: int | None = None,
    web_config: WebConfig | None = None,
    max_connections: int | None = None,
    sock: socket.socket | None = None,
    workers: WorkerShare | None = None,
) -> AsyncIterator[tuple[ExporterService, str]]:
    """Run the exporter in this event loop; yields the service and its base URL.

    `web_config` (from --web.config.file) adds TLS and basic auth to every endpoint.
    Incoming connections beyond `max_connections` (default: half the open-files limit) are
    refused with a 503, and one that sends no request headers in time is closed, so that
    connections piling up on the port leave the polls their file descriptors.
    With `workers` (this process one of several), it serves on `sock`, the listening socket
    the supervisor made, and answers the other workers on its own local socket."""
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=4)
    async with aiohttp.ClientSession(
        connector=connector, headers={"User-Agent": USER_AGENT}
    ) as session:
        service = ExporterService(
            config,
            session,
            owns=workers.owns if workers is not None else None,
            workers=workers.count if workers is not None else 1,
        )
        app = build_app(service, config_path, workers)
        protect(app, web_config)
        runner = web.AppRunner(app, access_log=None, logger=MalformedRequestLog(log))
        await runner.setup()
        assert runner.server is not None  # set up above
        cap = max_connections if max_connections is not None else cap_for_open_files()
        gate = ConnectionGate(
            runner.server, app[REQUESTS_SEEN_KEY], max_connections=cap, max_per_address=cap
        )
        listen_host = host if host is not None else config.listen_host
        listen_port = port if port is not None else config.listen_port
        loop = asyncio.get_running_loop()
        ssl = server_ssl_context(web_config)
        try:
            if sock is not None:
                listener = await loop.create_server(gate.protocol, sock=sock, ssl=ssl)
            else:
                listener = await loop.create_server(
                    gate.protocol, listen_host, listen_port, ssl=ssl
                )
        except OSError as error:
            await runner.cleanup()
            raise listen_error(listen_host, listen_port, error) from None
        bound_host, bound_port = listener.sockets[0].getsockname()[:2]
        service.start()
        peers = None
        if workers is not None:
            peers = PeerServer(functools.partial(answer_worker, app))
            await peers.start(workers.socket_path(workers.index))
        try:
            scheme = "https" if web_config is not None and web_config.tls else "http"
            yield service, f"{scheme}://{netloc(bound_host, bound_port)}"
        finally:
            if peers is not None:
                await peers.close()
            if workers is not None:
                await app[WORKER_LINKS_KEY].close()
            await service.stop()
            listener.close()  # not wait_closed: that would wait for every client to hang up
            await runner.cleanup()


async def serve(
    config: ExporterConfig,
    config_path: Path,
    web_config: WebConfig | None = None,
    *,
    sock: socket.socket | None = None,
    workers: WorkerShare | None = None,
) -> None:
    """Run until SIGTERM or SIGINT; SIGHUP reloads the config file. A worker (`workers`)
    serves on `sock` and leaves saying where it listens to its supervisor."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    pending: set[asyncio.Task[str | None]] = set()
    # The handlers come first: whoever learns that this process is ready (the line below, or a
    # worker's socket for its supervisor) may signal it at once, and a SIGHUP that came before
    # the handler would end the process or be lost. One that comes while it starts is kept and
    # carried out once it serves.
    running: list[ExporterService] = []
    hangup_while_starting = False

    def on_hangup() -> None:
        nonlocal hangup_while_starting
        if not running:
            hangup_while_starting = True
            return
        task = loop.create_task(reload_config(running[0], config_path))
        pending.add(task)
        task.add_done_callback(pending.discard)

    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    orphaned = None
    try:
        async with running_exporter(
            config, config_path, web_config=web_config, sock=sock, workers=workers
        ) as (service, url):
            running.append(service)
            if hangup_while_starting:
                on_hangup()
            if workers is None:
                log.info("listening on %s with %d targets", url, len(config.targets))
                print(f"listening on {url}", flush=True)
            else:
                orphaned = loop.create_task(_stop_when_orphaned(stop))
            await stop.wait()
    finally:
        for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        if orphaned is not None:
            orphaned.cancel()


async def _stop_when_orphaned(stop: asyncio.Event) -> None:
    """A worker whose supervisor is gone (killed, not stopped) stops too."""
    parent = os.getppid()
    while os.getppid() == parent:  # noqa: ASYNC110 - no event says a parent is gone
        await asyncio.sleep(ORPHAN_CHECK_SECONDS)
    log.error("the supervisor (pid %d) is gone; stopping", parent)
    stop.set()
