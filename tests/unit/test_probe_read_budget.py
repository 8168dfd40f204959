"""How long a `/probe` read may take, from Prometheus' X-Prometheus-Scrape-Timeout-Seconds."""

from __future__ import annotations

import pytest

from stallwatch.core.probe_schedule import (
    MIN_SCRAPE_TIMEOUT_SECONDS,
    ReadBudget,
    after_cut,
    after_read,
    read_budget,
    read_due,
)


@pytest.mark.parametrize(
    ("header", "budget"),
    [
        (None, None),
        ("10", ReadBudget(scrape_timeout=10.0, requests=9.25, read=9.5)),
        ("2.5", ReadBudget(scrape_timeout=2.5, requests=1.8, read=2.0)),
        # A scrape shorter than twice the offset keeps half of it for the read.
        ("1", ReadBudget(scrape_timeout=1.0, requests=0.45, read=0.5)),
        ("0.4", ReadBudget(scrape_timeout=0.4, requests=0.18, read=0.2)),
    ],
)
def test_the_read_ends_before_the_scrape_and_its_requests_before_the_read(
    header: str | None, budget: ReadBudget | None
) -> None:
    """The read ends an offset (0.5 s, or half a short scrape) before the scrape's deadline, and
    each request a little earlier still, so a server that never answers is judged in time."""
    result = read_budget(header)
    if budget is None:
        assert result is None
        return
    assert result is not None
    figures = (result.scrape_timeout, result.requests, result.read)
    assert figures == pytest.approx((budget.scrape_timeout, budget.requests, budget.read))


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("ten", "expected a number of seconds, got 'ten'"),
        ("", "expected a number of seconds, got ''"),
        ("0", "expected a positive number of seconds, got '0'"),
        ("-3", "expected a positive number of seconds, got '-3'"),
        ("inf", "expected a positive number of seconds, got 'inf'"),
        ("nan", "expected a positive number of seconds, got 'nan'"),
    ],
)
def test_a_header_that_is_no_positive_number_is_refused(header: str, message: str) -> None:
    """A scrape timeout that is not a positive, finite number of seconds is an error, not 0."""
    with pytest.raises(ValueError, match=message):
        read_budget(header)


@pytest.mark.parametrize(
    "header",
    ["\u0661", "\u0661\u0660", "\uff15", "1_0", " 10", "10 ", "0x10", "\u00b2"],
    ids=[
        "arabic-indic-1",
        "arabic-indic-10",
        "fullwidth-5",
        "underscore",
        "lead",
        "trail",
        "hex",
        "superscript",
    ],
)
def test_a_header_that_is_not_ascii_decimal_seconds_is_refused(header: str) -> None:
    """The scrape timeout is read in the ASCII grammar of every other duration: a digit of
    another script, an underscore or spaces are no number (float() took them)."""
    with pytest.raises(ValueError, match="expected a number of seconds"):
        read_budget(header)


@pytest.mark.parametrize("header", ["1e-9", "0.000001", "0.2", "1e-1"])
def test_a_scrape_timeout_too_short_to_serve_a_read_is_refused(header: str) -> None:
    """A positive scrape timeout below MIN_SCRAPE_TIMEOUT_SECONDS cannot serve a read: refused,
    so it never takes the target's read slot for a read cut at once."""
    with pytest.raises(ValueError, match=r"too short to serve a read: at least 0\.25"):
        read_budget(header)
    assert read_budget(str(MIN_SCRAPE_TIMEOUT_SECONDS)) is not None


def test_a_cut_read_gives_its_slot_back() -> None:
    """After a read cut at the scrape's deadline the clock is as before it: the slot's next
    /probe reads instead of answering the verdict from before."""
    first = after_read(None, 100.0, 15.0)
    second = after_read(first, 116.0, 15.0)
    assert not read_due(second, 117.0, 15.0)
    assert after_cut(first) == first
    assert read_due(after_cut(first), 117.0, 15.0)
    assert after_cut(None) is None
