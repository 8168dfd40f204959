"""Many lightweight `/metrics` servers in one process, each on its own port: the exporter's targets.

Run as `python -m benchmarks.targets COUNT PAYLOAD_FILE`; prints one JSON line with the ports,
then serves until stdin closes (or the process is terminated).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from aiohttp import web

CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"


async def serve(count: int, payload: bytes) -> None:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    ports: list[int] = []
    for _ in range(count):
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        ports.append(server.sockets[0].getsockname()[1])
    print(json.dumps({"ports": ports}), flush=True)
    loop = asyncio.get_running_loop()
    try:
        await loop.run_in_executor(None, sys.stdin.read)  # until the parent closes our stdin
    finally:
        await runner.cleanup()


def main() -> None:
    count, payload_file = int(sys.argv[1]), Path(sys.argv[2])
    asyncio.run(serve(count, payload_file.read_bytes()))


if __name__ == "__main__":
    main()
