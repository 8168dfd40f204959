"""What a read of a model server gives, as the decisions take it: a reading or why there is
none, what `/v1/models` said, whether an idle test request was answered. The edges that read
(`net/fetch.py`, the replays) build them; the plans (`poll_plan.py`, `alert_plan.py`) judge them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from stallwatch.core.reading import Reading

ErrorReason = Literal["timeout", "connection", "http_status", "too_large", "parse"]


@dataclass(frozen=True)
class ReadResult:
    """A reading, or why there is none."""

    reading: Reading | None
    error_reason: ErrorReason | None = None
    detail: str = ""
    status: int | None = None
    payload_bytes: int = 0  # the size of the body read

    @property
    def ok(self) -> bool:
        return self.reading is not None


@dataclass(frozen=True)
class ModelsAnswer:
    """What `GET /v1/models` said: its status and the cards' `owned_by`, or why it said nothing.

    `error_reason` is `connection` (not connected within half the timeout, refused, reset) or
    `timeout` (connected, no answer in time): the server is down or hung, and nothing else is
    read; `http_status` is a redirect (never followed): the server cannot be read, and is down.
    Any other answer, whatever its status, is an answer.
    """

    status: int | None = None
    owners: tuple[str, ...] = ()
    listed: bool = False  # 200 with a model list
    error_reason: Literal["timeout", "connection", "http_status"] | None = None
    detail: str = ""


@dataclass(frozen=True)
class TestRequestResult:
    """Whether the idle test request answered, and how."""

    __test__ = False  # not a test class, whatever its name

    succeeded: bool
    detail: str
