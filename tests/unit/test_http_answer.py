"""`net.http_answer`: an HTTP/1.1 answer read from its bytes, however they are split."""

from __future__ import annotations

import gzip
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stallwatch.net.http_answer import MAX_HEADER_BYTES, Answer, AnswerParser, MalformedAnswer

BODY = b'vllm:num_requests_running{model_name="m"} 3.0\n' * 40


def fed(parts: list[bytes], *, cap: int = 1 << 20, close: bool = False) -> Answer | None:
    """What the parser holds after `parts` (and the server closing, when `close`)."""
    parser = AnswerParser(cap)
    for part in parts:
        if parser.feed(part):
            break
    if close:
        return parser.closed()
    return parser.answer


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at the given offsets (clamped, sorted)."""
    points = sorted({min(max(cut, 0), len(data)) for cut in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def chunked(body: bytes, size: int) -> bytes:
    pieces = [body[i : i + size] for i in range(0, len(body), size)]
    encoded = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces)
    return encoded + b"0\r\nX-Trailer: t\r\n\r\n"


LENGTH_ANSWER = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n" % len(BODY)
) + BODY
CHUNKED_ANSWER = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(BODY, 333)


@given(st.lists(st.integers(0, len(LENGTH_ANSWER)), max_size=8))
def test_a_content_length_answer_is_the_same_however_it_is_split(cuts: list[int]) -> None:
    """A Content-Length body comes out whole and complete, wherever the socket cut it."""
    answer = fed(split(LENGTH_ANSWER, cuts))
    assert answer == Answer(
        200, {"content-type": "text/plain", "content-length": str(len(BODY))}, BODY
    )


@given(st.lists(st.integers(0, len(CHUNKED_ANSWER)), max_size=8), st.integers(1, 700))
def test_a_chunked_answer_is_the_same_however_it_is_split(cuts: list[int], size: int) -> None:
    """Chunks (with extensions and trailers) join to the body, wherever the socket cut them."""
    data = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked(BODY, size)
    answer = fed(split(data, cuts))
    assert answer is not None
    assert answer.body == BODY


def test_bytes_after_a_complete_answer_are_ignored() -> None:
    """Once the answer is complete, what follows it is not part of its body."""
    parser = AnswerParser(1 << 20)
    assert parser.feed(LENGTH_ANSWER + b"HTTP/1.1 200 OK\r\n")
    assert parser.answer is not None
    assert parser.answer.body == BODY


def test_a_body_without_length_ends_when_the_server_closes() -> None:
    """With neither Content-Length nor chunks, the body is everything until the connection
    closes: not complete before it."""
    parser = AnswerParser(1 << 20)
    assert not parser.feed(b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" + BODY[:100])
    assert not parser.feed(BODY[100:])
    assert parser.answer is None
    assert parser.closed().body == BODY


def test_an_informational_answer_before_the_real_one_is_skipped() -> None:
    """A `100 Continue` ahead of the answer is not taken for it."""
    answer = fed([b"HTTP/1.1 100 Continue\r\n\r\n" + LENGTH_ANSWER])
    assert answer is not None
    assert answer.status == 200
    assert answer.body == BODY


def test_a_no_content_answer_is_complete_at_its_headers() -> None:
    """204 has no body, whatever Content-Length it names."""
    answer = fed([b"HTTP/1.1 204 No Content\r\nContent-Length: 10\r\n\r\n"])
    assert answer == Answer(204, {"content-length": "10"}, b"")


def test_a_declared_length_over_the_cap_ends_the_read_at_the_headers() -> None:
    """A Content-Length over the cap gives no body, without waiting for the body's bytes."""
    parser = AnswerParser(100)
    assert parser.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\n")
    assert parser.answer is not None
    assert parser.answer.body is None


def test_a_chunked_body_over_the_cap_is_not_kept() -> None:
    """Chunks that add up past the cap end the read with no body."""
    answer = fed([CHUNKED_ANSWER], cap=len(BODY) - 1)
    assert answer is not None
    assert answer.body is None
    assert fed([CHUNKED_ANSWER], cap=len(BODY)) is not None


def test_a_gzipped_body_is_read_decompressed_and_capped_after_decompression() -> None:
    """A server that compresses anyway is read as the text it compressed; a small archive that
    expands past the cap is over the cap."""
    packed = gzip.compress(BODY)
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(packed)
    answer = fed([head + packed])
    assert answer is not None
    assert answer.body == BODY
    bomb = gzip.compress(b"0" * 1_000_000)
    head = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n" % len(bomb)
    capped = fed([head + bomb], cap=10_000)
    assert capped is not None
    assert capped.body is None


def test_repeated_headers_are_joined_under_lower_case_names() -> None:
    """Header names are case-blind; a repeated header keeps every value."""
    answer = fed(
        [b"HTTP/1.1 302 Found\r\nLOCATION: /a\r\nVary: x\r\nvary: y\r\nContent-Length: 0\r\n\r\n"]
    )
    assert answer is not None
    assert answer.headers == {"location": "/a", "vary": "x, y", "content-length": "0"}


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 abc OK\r\n\r\n", "not an HTTP/1.x status line"),
        (b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "bad header line"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "bad Content-Length"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported Transfer-Encoding"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\n\r\n", "unsupported Content-Encoding"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "bad chunk size"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabc\r\n",
            "chunk data longer than its size",
        ),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEADER_BYTES, "headers longer than"),
    ],
)
def test_bytes_that_are_no_answer_say_what_is_wrong(data: bytes, says: str) -> None:
    """What is not an HTTP/1.x answer fails with the reason, never a half answer."""
    with pytest.raises(MalformedAnswer, match=says):
        AnswerParser(1 << 20).feed(data)


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Len", "before the answer's headers ended"),
        (LENGTH_ANSWER[:-10], "before the answer's body ended"),
        (CHUNKED_ANSWER[:-40], "before the answer's body ended"),
    ],
)
def test_a_connection_closed_too_early_is_no_answer(data: bytes, says: str) -> None:
    """A server that closes before its answer is complete gave no answer, said so."""
    parser = AnswerParser(1 << 20)
    assert not parser.feed(data)
    with pytest.raises(MalformedAnswer, match=says):
        parser.closed()
