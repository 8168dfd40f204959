"""An HTTP/1.1 answer read from its bytes, as they arrive: status, headers, body framing.

Pure: `AnswerParser.feed` takes whatever the socket gave and says when the answer is complete;
no I/O, no clock. It reads what a GET of `/metrics` can get back: a status line, headers, and a
body framed by `Content-Length`, by chunks, or by the server closing the connection; an
informational (1xx) answer before the real one is skipped; a body larger than the cap is not
kept. Anything else (a malformed status line, oversized headers, a bad chunk) is a
`MalformedAnswer` naming what was wrong.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Literal

# The most header bytes an answer may have; a server sending more is not a metrics endpoint.
MAX_HEADER_BYTES = 64 * 1024
# Statuses whose answer has no body whatever its headers say.
_NO_BODY = frozenset({204, 304})


class MalformedAnswer(ValueError):
    """The bytes are not an HTTP/1.x answer this reader can take."""


@dataclass(frozen=True)
class Answer:
    """A complete answer: its status, headers (lower-case names) and body (None: over the cap)."""

    status: int
    headers: dict[str, str]
    body: bytes | None


Framing = Literal["length", "chunked", "close"]


class AnswerParser:
    """Feed it the bytes of one answer; `answer` is set once they are all in."""

    def __init__(self, max_body_bytes: int) -> None:
        self.max_body_bytes = max_body_bytes
        self.answer: Answer | None = None
        self._buffer = bytearray()
        self._status = 0
        self._headers: dict[str, str] = {}
        self._framing: Framing | None = None  # None: still in the headers
        self._left = 0  # bytes left of the body (length) or of the chunk (chunked)
        self._chunk_state: Literal["size", "data", "data_end", "trailers"] = "size"
        self._body: list[bytes] = []
        self._size = 0
        self._over = False
        self._decoder: zlib._Decompress | None = None

    def feed(self, data: bytes) -> bool:
        """Take the next bytes; True once the answer is complete (more bytes are ignored)."""
        if self.answer is not None:
            return True
        if self._framing is None:
            self._buffer += data
            if not self._read_head():
                return False
            data = bytes(self._buffer)
            self._buffer.clear()
        if self._framing == "length":
            self._take_length(data)
        elif self._framing == "chunked":
            self._take_chunks(data)
        else:
            self._keep(data)
        if self._over and self.answer is None:
            self._finish()  # too large: nothing more of it is read
        return self.answer is not None

    def closed(self) -> Answer:
        """The answer when the server has closed the connection (which ends a `close` body)."""
        if self.answer is not None:
            return self.answer
        if self._framing == "close":
            self._finish()
            assert self.answer is not None
            return self.answer
        if self._framing is None:
            raise MalformedAnswer("connection closed before the answer's headers ended")
        raise MalformedAnswer(
            f"connection closed before the answer's body ended ({self._size} bytes read)"
        )

    def _read_head(self) -> bool:
        """Parse the status line and headers once they are all buffered; True when done."""
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEADER_BYTES:
                    raise MalformedAnswer(f"headers longer than {MAX_HEADER_BYTES} bytes")
                return False
            if end > MAX_HEADER_BYTES:
                raise MalformedAnswer(f"headers longer than {MAX_HEADER_BYTES} bytes")
            head = bytes(self._buffer[:end]).decode("latin-1")
            del self._buffer[: end + 4]
            status, headers = _parse_head(head)
            if 100 <= status < 200:
                continue  # an informational answer; the real one follows
            self._status, self._headers = status, headers
            self._framing = self._framing_of(status, headers)
            return True

    def _framing_of(self, status: int, headers: dict[str, str]) -> Framing:
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("gzip", "x-gzip", "deflate"):
            self._decoder = zlib.decompressobj(47 if encoding != "deflate" else zlib.MAX_WBITS)
        elif encoding not in ("identity", ""):
            raise MalformedAnswer(f"unsupported Content-Encoding {encoding!r}")
        transfer = headers.get("transfer-encoding", "").lower()
        if status in _NO_BODY:
            self._left = 0
            return "length"
        if transfer:
            if transfer.rsplit(",", 1)[-1].strip() != "chunked":
                raise MalformedAnswer(f"unsupported Transfer-Encoding {transfer!r}")
            return "chunked"
        length = headers.get("content-length")
        if length is None:
            return "close"
        if not length.strip().isdigit():
            raise MalformedAnswer(f"bad Content-Length {length!r}")
        self._left = int(length)
        if self._left > self.max_body_bytes and self._decoder is None:
            self._over = True
        return "length"

    def _take_length(self, data: bytes) -> None:
        taken = data[: self._left]
        self._left -= len(taken)
        self._keep(taken)
        if self._left == 0:
            self._finish()

    def _take_chunks(self, data: bytes) -> None:
        self._buffer += data
        while not self._over and self.answer is None:
            if self._chunk_state == "data":
                taken = bytes(self._buffer[: self._left])
                del self._buffer[: len(taken)]
                self._left -= len(taken)
                self._keep(taken)
                if self._left:
                    return
                self._chunk_state = "data_end"
                continue
            line_end = self._buffer.find(b"\r\n")
            if line_end < 0:
                if len(self._buffer) > MAX_HEADER_BYTES:
                    raise MalformedAnswer("chunk line too long")
                return
            line = bytes(self._buffer[:line_end])
            del self._buffer[: line_end + 2]
            if self._chunk_state == "data_end":
                if line:
                    raise MalformedAnswer("chunk data longer than its size")
                self._chunk_state = "size"
            elif self._chunk_state == "size":
                size_text = line.split(b";", 1)[0].strip()
                try:
                    self._left = int(size_text, 16)
                except ValueError:
                    raise MalformedAnswer(f"bad chunk size {size_text[:20]!r}") from None
                if self._left < 0:
                    raise MalformedAnswer(f"bad chunk size {size_text[:20]!r}")
                self._chunk_state = "data" if self._left else "trailers"
            elif not line:  # the blank line after the trailers ends the body
                self._finish()

    def _keep(self, data: bytes) -> None:
        if self._over or not data:
            return
        if self._decoder is not None:
            room = self.max_body_bytes - self._size + 1
            try:
                data = self._decoder.decompress(data, room)
            except zlib.error as error:
                raise MalformedAnswer(f"body does not decompress: {error}") from None
        self._size += len(data)
        if self._size > self.max_body_bytes:
            self._over = True
            self._body.clear()
            return
        self._body.append(data)

    def _finish(self) -> None:
        body = None if self._over else b"".join(self._body)
        self.answer = Answer(self._status, self._headers, body)


def _parse_head(head: str) -> tuple[int, dict[str, str]]:
    """The status and the headers (lower-case names; a repeated header's values joined)."""
    lines = head.split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or not parts[1].isdigit():
        raise MalformedAnswer(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    status = int(parts[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise MalformedAnswer(f"bad header line {line[:80]!r}")
        key = name.lower()
        value = value.strip()
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    return status, headers
