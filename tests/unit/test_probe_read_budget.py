"""How long a `/probe` read may take, from Prometheus' X-Prometheus-Scrape-Timeout-Seconds."""

from __future__ import annotations

import pytest

from stallwatch.core.probe_schedule import ReadBudget, read_budget


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
