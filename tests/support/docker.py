"""A fake Docker Engine API on a Unix socket, and the short temporary directory its socket needs."""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

from aiohttp import web


@contextlib.contextmanager
def short_tmp_dir() -> Iterator[Path]:
    """A directory with a short path: a Unix socket path is limited to about 100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="sw-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def fake_docker(socket_path: Path, containers: set[str]) -> AsyncIterator[list[str]]:
    """A Docker Engine API on a Unix socket that knows `containers`; yields the requests seen."""
    seen: list[str] = []

    async def restart(request: web.Request) -> web.Response:
        seen.append(str(request.rel_url))
        name = request.match_info["name"]
        if name not in containers:
            return web.json_response({"message": f"No such container: {name}"}, status=404)
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/containers/{name}/restart", restart)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.UnixSite(runner, str(socket_path))
    await site.start()
    try:
        yield seen
    finally:
        await runner.cleanup()
