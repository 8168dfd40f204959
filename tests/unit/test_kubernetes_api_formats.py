"""The text the restarter writes into Kubernetes objects: times in the API's exact formats,
and Event fields cut to the API's byte limits."""

from __future__ import annotations

import pytest

from stallwatch.restarter.kube.api import clipped, micro_time, rfc3339_time
from tests.support.kube_gotime import RFC3339, RFC3339_MICRO, GoParseError, go_parse


@pytest.mark.parametrize(
    ("seconds", "micro", "whole"),
    [
        (1_796_000_000.0, "2026-11-30T00:53:20.000000Z", "2026-11-30T00:53:20Z"),
        (1_796_000_000.5, "2026-11-30T00:53:20.500000Z", "2026-11-30T00:53:20Z"),
        (1_796_000_000.000001, "2026-11-30T00:53:20.000001Z", "2026-11-30T00:53:20Z"),
        (0.0, "1970-01-01T00:00:00.000000Z", "1970-01-01T00:00:00Z"),
    ],
)
def test_times_are_written_in_the_apis_formats(seconds: float, micro: str, whole: str) -> None:
    """A MicroTime always has six fraction digits (a whole second too), a Time none; both
    pass Go's parser with the layout the API server decodes them with."""
    assert micro_time(seconds) == micro
    assert rfc3339_time(seconds) == whole
    go_parse(RFC3339_MICRO, micro_time(seconds))
    go_parse(RFC3339, rfc3339_time(seconds))


def test_isoformat_at_a_whole_second_is_what_the_api_refuses() -> None:
    """The format the restarter used to send: no fraction at a whole second, refused."""
    with pytest.raises(GoParseError, match=r'cannot parse "\+00:00" as "\.000000"'):
        go_parse(RFC3339_MICRO, "2026-12-01T18:33:08+00:00")


@pytest.mark.parametrize(
    ("text", "limit", "expected"),
    [("abc", 2, "ab"), ("é" * 3, 5, "éé"), ("é" * 3, 6, "ééé"), ("", 4, "")],
)
def test_clipped_cuts_bytes_at_a_character(text: str, limit: int, expected: str) -> None:
    """Event text is cut to the API's limit in UTF-8 bytes, never inside a character."""
    assert clipped(text, limit) == expected
