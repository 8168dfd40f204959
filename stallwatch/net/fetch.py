"""Every request to a model server, the exporter's and the restarter's: read `/metrics`, ask
`/v1/models`, send the idle test request (and the restarter's to a target out of rotation).

Every endpoint called here is one the target's engine profile marks safe: `/v1/models` (which
`kind: auto` asks first, to identify the engine), its metrics path, the profile's sleep check
(llama.cpp `/props`, LMDeploy `/health`) and its idle test request; never a generation-backed
health check, never llama.cpp's `/slots`, never trtllm-serve's destructive `/metrics`.

Each function takes the process's one `aiohttp.ClientSession`, has a timeout and a body-size
cap, follows no redirect (a redirect is a failed read, see `redirect_detail`), and returns a
result object instead of raising for the failures a server can produce.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

import aiohttp

from stallwatch import USER_AGENT
from stallwatch.common.exporter_config import TestRequestEndpoint
from stallwatch.core.poll_plan import (
    TEST_PATHS,
    join_url,
)
from stallwatch.core.reading import Reading, parse_reading, with_start_marker
from stallwatch.core.reads import (
    ModelsAnswer,
    ReadResult,
    TestRequestResult,
)
from stallwatch.engines import AUTO, PROFILES, model_owners
from stallwatch.engines.llamacpp import START_HEADER
from stallwatch.engines.profile import faulted_engines
from stallwatch.net.http_answer import MalformedAnswer
from stallwatch.net.offload import run_sized
from stallwatch.net.plain_get import ConnectTimeout, PlainRequest, plain_get, plain_request

DEFAULT_MAX_BYTES = 8 * 1024 * 1024
# llama.cpp sends its process start (monotonic microseconds) in this header of /metrics.
START_MARKER_HEADER = START_HEADER
# A `/metrics` read that has not connected within this share of its timeout could not connect
# (`connection`: down); one that connected and got no answer in the whole timeout is `timeout`
# (hung). A kernel completes the handshake for a listening socket whatever its process does.
CONNECT_SHARE_OF_TIMEOUT = 0.5
# How much of a redirect's Location a detail repeats.
MAX_LOCATION_SHOWN = 200


# Every request asks for the answer as it is: an HTTP client offers gzip by default, and a
# server built on prometheus_client's ASGI app (SGLang) then compresses its whole `/metrics` at
# every read, on its own event loop (about 1 ms for SGLang's 73 KB, level 9), only for the
# reader to decompress it. A read must cost the server it watches as little as it can.
IDENTITY = "identity"


IDENTITY_HEADERS = (("User-Agent", USER_AGENT), ("Accept-Encoding", IDENTITY))


def default_headers() -> dict[str, str]:
    return dict(IDENTITY_HEADERS)


def redirect_detail(response: aiohttp.ClientResponse) -> str | None:
    """What a redirect answer said, or None when `response` is no redirect.

    No request of stallwatch follows a redirect: a server in the allow-list must not send the
    exporter (or the restarter) to an address outside it. A redirect is a failed read.
    """
    return plain_redirect_detail(response.status, response.headers.get("Location", ""))


def plain_redirect_detail(status: int, location: str) -> str | None:
    """`redirect_detail` from the status and the Location header."""
    if not 300 <= status < 400:
        return None
    if len(location) > MAX_LOCATION_SHOWN:
        location = location[:MAX_LOCATION_SHOWN] + "..."
    where = f" to {location}" if location else ""
    return f"HTTP {status} redirect{where}, not followed"


async def _read_body(response: aiohttp.ClientResponse, max_bytes: int) -> bytes | None:
    """The body, or None when it is larger than `max_bytes`."""
    declared = response.content_length
    if declared is not None and declared > max_bytes:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(64 * 1024):
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def read_metrics(
    session: aiohttp.ClientSession,
    url: str,
    *,
    timeout: float,
    max_bytes: int = DEFAULT_MAX_BYTES,
    now: float | None = None,
    kind: str = AUTO,
) -> ReadResult:
    """GET `url` (a full `/metrics` URL) and parse it with the `kind` profile (or `auto`)."""
    plain = plain_request(url, IDENTITY_HEADERS)
    if plain is not None:
        got = await _read_plain(plain, timeout=timeout, max_bytes=max_bytes)
    else:
        got = await _read_through(session, url, timeout=timeout, max_bytes=max_bytes)
    if isinstance(got, ReadResult):
        return got
    body, marker = got
    if body is None:
        return ReadResult(None, "too_large", f"payload larger than {max_bytes} bytes")
    taken_at = time.time() if now is None else now
    profile = kind if kind in PROFILES else AUTO
    reading = await run_sized(len(body), _parse, body, taken_at, profile, marker)
    return ReadResult(reading, payload_bytes=len(body))


# The body (None: over the cap) and the llama.cpp start marker, or the failed read.
_Got = tuple[bytes | None, str | None] | ReadResult


def _not_connected(timeout: float) -> ReadResult:
    connect = timeout * CONNECT_SHARE_OF_TIMEOUT
    return ReadResult(None, "connection", f"not connected within {connect:g} s")


def _no_answer(timeout: float) -> ReadResult:
    return ReadResult(None, "timeout", f"connected, no answer within {timeout:g} s")


def _status_failure(status: int, location: str) -> ReadResult:
    """A `/metrics` answer other than 200: the redirect it was, or its status."""
    detail = plain_redirect_detail(status, location) or f"HTTP {status}"
    return ReadResult(None, "http_status", detail, status=status)


async def _read_plain(plain: PlainRequest, *, timeout: float, max_bytes: int) -> _Got:
    """The read of a plain-HTTP target (`net.plain_get`)."""
    try:
        answer = await plain_get(
            plain,
            timeout=timeout,
            connect_timeout=timeout * CONNECT_SHARE_OF_TIMEOUT,
            max_body_bytes=max_bytes,
        )
    except ConnectTimeout:
        return _not_connected(timeout)
    except TimeoutError:
        return _no_answer(timeout)
    except (OSError, MalformedAnswer) as error:
        return ReadResult(None, "connection", f"{type(error).__name__}: {error}")
    if answer.status != 200:
        return _status_failure(answer.status, answer.headers.get("location", ""))
    return answer.body, answer.headers.get(START_MARKER_HEADER.lower())


async def _read_through(
    session: aiohttp.ClientSession, url: str, *, timeout: float, max_bytes: int
) -> _Got:
    """The read of any other target, through aiohttp's client."""
    try:
        async with session.get(
            url,
            headers=default_headers(),
            timeout=aiohttp.ClientTimeout(
                total=timeout, connect=timeout * CONNECT_SHARE_OF_TIMEOUT
            ),
            allow_redirects=False,
        ) as response:
            if response.status != 200:
                return _status_failure(response.status, response.headers.get("Location", ""))
            return await _read_body(response, max_bytes), response.headers.get(START_MARKER_HEADER)
    except aiohttp.ConnectionTimeoutError:
        return _not_connected(timeout)
    except TimeoutError:
        return _no_answer(timeout)
    except aiohttp.ClientError as error:
        return ReadResult(None, "connection", f"{type(error).__name__}: {error}")


def _parse(body: bytes, taken_at: float, kind: str, marker: str | None) -> Reading:
    text = body.decode("utf-8", errors="replace")
    reading = parse_reading(text, taken_at=taken_at, kind=kind)
    return with_start_marker(reading, marker)


async def ask_models(
    session: aiohttp.ClientSession, base_url: str, *, timeout: float
) -> ModelsAnswer:
    """`GET /v1/models` (API server only on every engine; it takes no slot)."""
    try:
        async with session.get(
            join_url(base_url, "/v1/models"),
            headers=default_headers(),
            timeout=aiohttp.ClientTimeout(
                total=timeout, connect=timeout * CONNECT_SHARE_OF_TIMEOUT
            ),
            allow_redirects=False,
        ) as response:
            status = response.status
            redirect = redirect_detail(response)
            body = await _read_body(response, 1024 * 1024) if status == 200 else None
    except aiohttp.ConnectionTimeoutError:
        connect = timeout * CONNECT_SHARE_OF_TIMEOUT
        return ModelsAnswer(error_reason="connection", detail=f"not connected within {connect:g} s")
    except TimeoutError:
        return ModelsAnswer(
            error_reason="timeout", detail=f"connected, no answer within {timeout:g} s"
        )
    except aiohttp.ClientError as error:
        return ModelsAnswer(error_reason="connection", detail=f"{type(error).__name__}: {error}")
    if redirect is not None:
        return ModelsAnswer(status=status, error_reason="http_status", detail=redirect)
    if body is None:
        return ModelsAnswer(status=status, detail=f"HTTP {status}")
    try:
        owners = model_owners(json.loads(body))
    except ValueError:
        owners = None
    return ModelsAnswer(
        status=status, owners=owners or (), listed=owners is not None, detail=f"HTTP {status}"
    )


def idle_request_body(
    model: str, endpoint: Literal["completions", "chat"]
) -> tuple[str, dict[str, Any]]:
    """The path and JSON body of the smallest request that proves the engine answers.

    Without a model name (llama.cpp, TGI publish none) the field is left out: those servers
    answer with the one model they serve.
    """
    body: dict[str, Any] = {"model": model} if model else {}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "ping"}]
    else:
        body["prompt"] = "ping"
    body.update(max_tokens=1, temperature=0)
    return TEST_PATHS[endpoint], body


async def engine_sleeps(
    session: aiohttp.ClientSession, base_url: str, engine_kind: str | None, *, timeout: float
) -> bool | None:
    """Ask the engine's own sleep check (never one that wakes it); None when it has none or
    the answer says nothing."""
    profile = PROFILES.get(engine_kind or "")
    check = profile.sleep_check if profile is not None else None
    if check is None:
        return None
    try:
        async with session.get(
            join_url(base_url, check.path),
            headers=default_headers(),
            timeout=aiohttp.ClientTimeout(total=timeout),
            allow_redirects=False,
        ) as response:
            if redirect_detail(response) is not None:
                return None
            body = await _read_body(response, 1024 * 1024)
    except (TimeoutError, aiohttp.ClientError):
        return None
    try:
        document = json.loads(body or b"")
    except ValueError:
        return None
    if not isinstance(document, dict) or check.field not in document:
        return None
    value: object = document[check.field]
    if check.equals is not None:
        return value == check.equals
    return value if isinstance(value, bool) else None


async def engine_faults(
    session: aiohttp.ClientSession, base_url: str, engine_kind: str | None, *, timeout: float
) -> tuple[str, ...]:
    """The engines the engine's own fault tolerance says it holds faulted (vLLM
    `/fault_tolerance/status`); empty when it has no such endpoint, the feature is off (404) or
    the answer says nothing."""
    profile = PROFILES.get(engine_kind or "")
    check = profile.fault_status if profile is not None else None
    if check is None:
        return ()
    try:
        async with session.get(
            join_url(base_url, check.path),
            headers=default_headers(),
            timeout=aiohttp.ClientTimeout(total=timeout),
            allow_redirects=False,
        ) as response:
            if response.status != 200:
                return ()
            body = await _read_body(response, 1024 * 1024)
    except (TimeoutError, aiohttp.ClientError):
        return ()
    try:
        document = json.loads(body or b"")
    except ValueError:
        return ()
    return faulted_engines(check, document)


async def send_test_request(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    model: str,
    endpoint: TestRequestEndpoint,
    timeout: float,
) -> TestRequestResult:
    """Send one `max_tokens: 1` request. Only ever called for a server with no work."""
    path, body = idle_request_body(model, endpoint)
    started = time.monotonic()
    try:
        async with session.post(
            join_url(base_url, path),
            json=body,
            headers=default_headers(),
            timeout=aiohttp.ClientTimeout(total=timeout),
            allow_redirects=False,
        ) as response:
            redirect = redirect_detail(response)
            answer = await _read_body(response, 1024 * 1024)
            status = response.status
    except TimeoutError:
        return TestRequestResult(False, f"no answer within {timeout:g} s")
    except aiohttp.ClientError as error:
        return TestRequestResult(False, f"{type(error).__name__}: {error}")
    elapsed = time.monotonic() - started
    if redirect is not None:
        return TestRequestResult(False, redirect)
    if status != 200:
        return TestRequestResult(False, f"HTTP {status}")
    if answer is None or b'"choices"' not in answer:
        return TestRequestResult(False, "answer without choices")
    return TestRequestResult(True, f"answered in {elapsed:.2f} s")
