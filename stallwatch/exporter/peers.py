"""Workers asking each other: a `/probe` handed to its target's owner, every worker's
`/metrics` families, a reload. Over a Unix socket per worker, in frames.

A frame is a 4-byte big-endian length, then the payload. A request's payload is a JSON object
with an `id` and an `op`; an answer's is a 4-byte length, a JSON head (`id`, `status`,
`content_type`), then the body. Requests on one connection are answered in any order (by
`id`): a slow read of one target holds no other `/probe`. Only the worker's own processes
reach the socket: it is made in a directory only its user can enter.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("stallwatch.exporter")

_LENGTH = struct.Struct(">I")
# A frame larger than this is refused (a worker's /metrics families are far smaller).
MAX_FRAME_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class PeerAnswer:
    """What a worker answered: an HTTP status, a content type and a body."""

    status: int
    content_type: str
    body: bytes


PeerHandler = Callable[[dict[str, Any]], Awaitable[PeerAnswer]]


class PeerUnavailable(Exception):
    """The other worker could not be asked (not started yet, restarting, gone)."""


async def _read_frame(reader: asyncio.StreamReader) -> bytes:
    (length,) = _LENGTH.unpack(await reader.readexactly(_LENGTH.size))
    if length > MAX_FRAME_BYTES:
        raise ValueError(f"frame of {length} bytes")
    return await reader.readexactly(length)


def _frame(payload: bytes) -> bytes:
    return _LENGTH.pack(len(payload)) + payload


def _answer_frame(request_id: int, answer: PeerAnswer) -> bytes:
    head = json.dumps(
        {"id": request_id, "status": answer.status, "content_type": answer.content_type}
    ).encode()
    return _frame(_LENGTH.pack(len(head)) + head + answer.body)


def _parse_answer(payload: bytes) -> tuple[int, PeerAnswer]:
    (length,) = _LENGTH.unpack_from(payload)
    head = json.loads(payload[_LENGTH.size : _LENGTH.size + length])
    body = payload[_LENGTH.size + length :]
    return int(head["id"]), PeerAnswer(int(head["status"]), str(head["content_type"]), body)


class PeerServer:
    """Answers the other workers' requests on a Unix socket with `handler`."""

    def __init__(self, handler: PeerHandler) -> None:
        self._handler = handler
        self._server: asyncio.AbstractServer | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, path: Path) -> None:
        self._server = await asyncio.start_unix_server(self._connection, path=str(path))

    async def _answer(self, writer: asyncio.StreamWriter, request: dict[str, Any]) -> None:
        try:
            result = await self._handler(request)
        except Exception:  # a bug in one answer must not end the connection
            log.exception("worker request %s failed", request.get("op"))
            result = PeerAnswer(500, "text/plain", b"worker request failed\n")
        if not writer.is_closing():
            writer.write(_answer_frame(int(request["id"]), result))

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            while True:
                request = json.loads(await _read_frame(reader))
                task = asyncio.create_task(self._answer(writer, request))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def close(self) -> None:
        """Stop listening, end every connection and every answer under way."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


class PeerLink:
    """One worker's connection to another: opened when first needed, opened again after the
    other worker restarted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[PeerAnswer]] = {}
        self._writer: asyncio.StreamWriter | None = None
        self._reading: asyncio.Task[None] | None = None
        self._connecting = asyncio.Lock()

    async def _connected(self) -> asyncio.StreamWriter:
        async with self._connecting:
            if self._writer is None or self._writer.is_closing():
                try:
                    reader, writer = await asyncio.open_unix_connection(str(self.path))
                except OSError as error:
                    raise PeerUnavailable(f"{self.path.name}: {error.strerror or error}") from None
                self._writer = writer
                self._reading = asyncio.create_task(self._read_answers(reader, writer))
            return self._writer

    async def _read_answers(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        try:
            while True:
                request_id, answer = _parse_answer(await _read_frame(reader))
                future = self._pending.pop(request_id, None)
                if future is not None and not future.done():
                    future.set_result(answer)
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, KeyError):
            pass
        finally:
            writer.close()
            failed, self._pending = self._pending, {}
            for future in failed.values():
                if not future.done():
                    future.set_exception(PeerUnavailable(f"{self.path.name}: connection lost"))

    async def ask(self, request: dict[str, Any], timeout: float) -> PeerAnswer:
        """Send `request` (an `op` and its arguments) and wait at most `timeout` seconds."""
        writer = await self._connected()
        request_id = next(self._ids)
        future: asyncio.Future[PeerAnswer] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            writer.write(_frame(json.dumps({**request, "id": request_id}).encode()))
            async with asyncio.timeout(timeout):
                return await future
        except ConnectionError as error:
            raise PeerUnavailable(f"{self.path.name}: {error}") from None
        finally:
            self._pending.pop(request_id, None)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        if self._reading is not None:
            self._reading.cancel()
            await asyncio.gather(self._reading, return_exceptions=True)
