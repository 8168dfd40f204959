"""The HAProxy agent-check responder: one TCP port that answers, for the target an agent-send
line names, `up` or `down #why` (`core/routing_answers.py` decides the words).

Per connection: read one newline-terminated line, write one reply line, close. Bounded: a line
longer than `max_line` bytes, or none within `line_timeout`, closes the connection unanswered,
and past `max_connections` at once a new connection is closed at once. HAProxy takes a missing
answer as no news (it keeps what the agent said last), never as a verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from stallwatch.common.config import parse_listen

log = logging.getLogger("stallwatch.restarter.agent")

MAX_LINE_BYTES = 512  # a `backend/server` line: HAProxy names are far shorter
LINE_TIMEOUT_SECONDS = 5.0  # HAProxy sends its line on connecting
MAX_CONNECTIONS = 256  # one check a server per `agent-inter`, from every HAProxy
WRITE_TIMEOUT_SECONDS = 5.0


class AgentResponder:
    """The agent-check port; `answer` maps an agent-send line (without its newline) to the
    reply line."""

    def __init__(
        self,
        answer: Callable[[str], str],
        *,
        max_line: int = MAX_LINE_BYTES,
        line_timeout: float = LINE_TIMEOUT_SECONDS,
        max_connections: int = MAX_CONNECTIONS,
    ) -> None:
        self.answer = answer
        self.max_line = max_line
        self.line_timeout = line_timeout
        self.max_connections = max_connections
        self.open_connections = 0
        self.answered = 0
        self.refused = 0  # closed unanswered: over the cap, too long, too slow, not a line
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, listen: str) -> None:
        """Listen on `listen` (`host:port`; port 0 picks a free one, see `port`)."""
        host, port = parse_listen(listen)
        # A newline further in than `max_line` bytes overruns the reader: the line is refused.
        self._server = await asyncio.start_server(
            self._connected, host, port, limit=self.max_line, reuse_address=True
        )

    @property
    def port(self) -> int:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("the agent-check responder is not listening")
        port: int = self._server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        """Stop listening and end the connections still open."""
        if self._server is not None:
            self._server.close()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()
            self._server = None

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        self.open_connections += 1
        try:
            if self.open_connections > self.max_connections:
                self.refused += 1
                return
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass
        finally:
            self.open_connections -= 1
            writer.close()
            with contextlib.suppress(OSError, asyncio.TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(writer.wait_closed(), WRITE_TIMEOUT_SECONDS)
            if task is not None:
                self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(self.line_timeout):
                raw = await reader.readuntil(b"\n")
        except (TimeoutError, asyncio.LimitOverrunError, asyncio.IncompleteReadError, OSError):
            self.refused += 1
            return
        line = raw.decode("ascii", errors="replace").rstrip("\r\n")
        reply = self.answer(line)
        writer.write(reply.encode("ascii", errors="replace"))
        try:
            async with asyncio.timeout(WRITE_TIMEOUT_SECONDS):
                await writer.drain()
        except (TimeoutError, OSError):
            return
        self.answered += 1
        log.debug("agent-check %r: %s", line, reply.rstrip())
