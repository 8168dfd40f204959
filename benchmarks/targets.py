"""Many lightweight `/metrics` servers in one process, each on its own port: the exporter's targets.

Run as `python -m benchmarks.targets COUNT PAYLOAD_FILE [--moving]`; prints one JSON line with
the ports, then serves until stdin closes (or the process is terminated). With `--moving` each
answer advances the payload's vLLM step and token counters, as a server making progress would:
a payload that never changes reads stalled, and a stalled read asks the server more than a
healthy one.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from aiohttp import web

CONTENT_TYPE = "text/plain; version=1.0.0; charset=utf-8"
SERVER_IDLE_TIMEOUT_SECONDS = 5.0


# The counters `--moving` advances, in the order they appear: a vLLM server's progress.
MOVING_SERIES = (
    b"vllm:generation_tokens_total{",
    b"vllm:iteration_tokens_total_count{",
    b"vllm:iteration_tokens_total_sum{",
)


def moving_payload(payload: bytes) -> tuple[list[bytes], list[float]]:
    """The payload cut around each MOVING_SERIES value: text pieces and the values between them."""
    pieces: list[bytes] = []
    values: list[float] = []
    rest = payload
    for series in MOVING_SERIES:
        start = rest.find(b"\n" + series)
        if start < 0:
            continue
        value_start = rest.index(b"} ", start) + 2
        value_end = rest.index(b"\n", value_start)
        pieces.append(rest[:value_start])
        values.append(float(rest[value_start:value_end]))
        rest = rest[value_end:]
    pieces.append(rest)
    return pieces, values


async def serve(count: int, payload: bytes, *, moving: bool = False) -> None:
    pieces, values = moving_payload(payload) if moving else ([payload], [])
    answers: dict[int, int] = {}

    async def metrics(request: web.Request) -> web.Response:
        if not values:
            return web.Response(body=payload, headers={"Content-Type": CONTENT_TYPE})
        port = request.transport.get_extra_info("sockname")[1] if request.transport else 0
        step = answers[port] = answers.get(port, 0) + 1
        body = pieces[0] + b"".join(
            repr(value + step).encode() + piece
            for value, piece in zip(values, pieces[1:], strict=True)
        )
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    # uvicorn (vLLM, SGLang) and llama.cpp's server close a connection idle for 5 s: at a 15 s
    # interval every read of a real server opens a new one, and so does every read here.
    runner = web.AppRunner(app, access_log=None, keepalive_timeout=SERVER_IDLE_TIMEOUT_SECONDS)
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
    asyncio.run(serve(count, payload_file.read_bytes(), moving="--moving" in sys.argv[3:]))


if __name__ == "__main__":
    main()
