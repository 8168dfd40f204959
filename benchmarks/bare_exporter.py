"""The least an aiohttp `/probe` exporter can do: read the target and answer a constant.

Run as `python -m benchmarks.bare_exporter [--event-loop=uvloop]` (asyncio's own loop by
default); prints `listening on URL` (as `stallwatch exporter` does), then serves until
terminated. `/probe?target=HOST:PORT` GETs `http://HOST:PORT/metrics`
with one shared `aiohttp.ClientSession` (the exporter's connector settings), reads the whole
body and answers a small constant text; nothing is parsed, judged or remembered. `/metrics`
counts the reads. It is the floor under any aiohttp exporter's cost per read.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

import aiohttp
from aiohttp import web

from stallwatch.common.event_loop import EVENT_LOOPS, choose_event_loop, run_on

READ_TIMEOUT_SECONDS = 5.0
SESSION_KEY = web.AppKey("session", aiohttp.ClientSession)
COUNTS_KEY = web.AppKey("counts", dict)


async def probe(request: web.Request) -> web.Response:
    """Read the target's whole `/metrics`; 200 and `bare_probe_success 1` when it answered 200."""
    target = request.query.get("target", "")
    if not target:
        return web.Response(status=400, text="target missing\n")
    counts: dict[str, int] = request.app[COUNTS_KEY]
    try:
        async with request.app[SESSION_KEY].get(
            f"http://{target}/metrics",
            timeout=aiohttp.ClientTimeout(total=READ_TIMEOUT_SECONDS),
        ) as response:
            await response.read()
            success = response.status == 200
    except (TimeoutError, aiohttp.ClientError):
        success = False
    counts["reads" if success else "failures"] += 1
    return web.Response(text=f"bare_probe_success {int(success)}\n")


async def metrics(request: web.Request) -> web.Response:
    counts: dict[str, int] = request.app[COUNTS_KEY]
    return web.Response(
        text=f"bare_reads_total {counts['reads']}\nbare_read_failures_total {counts['failures']}\n"
    )


async def serve() -> None:
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=4)
    async with aiohttp.ClientSession(connector=connector) as session:
        app = web.Application()
        app[SESSION_KEY] = session
        app[COUNTS_KEY] = {"reads": 0, "failures": 0}
        app.router.add_get("/probe", probe)
        app.router.add_get("/metrics", metrics)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        host, port = runner.addresses[0][:2]
        print(f"listening on http://{host}:{port}", flush=True)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        loop.add_signal_handler(signal.SIGINT, stop.set)
        try:
            await stop.wait()
        finally:
            await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--event-loop", choices=EVENT_LOOPS, default="asyncio")
    run_on(choose_event_loop(parser.parse_args().event_loop), serve())


if __name__ == "__main__":
    main()
