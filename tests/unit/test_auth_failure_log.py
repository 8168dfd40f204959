"""Failed authentications are logged at most once per client address per interval (pure)."""

from __future__ import annotations

from stallwatch.restarter.auth_failures import AuthFailureLog


def test_the_first_failure_of_a_client_is_logged() -> None:
    """A client's first failure is logged, with nothing suppressed before it."""
    assert AuthFailureLog(interval=60).failure("10.0.0.9", now=1000.0) == 0


def test_failures_within_the_interval_are_counted_and_reported_on_the_next_line() -> None:
    """Repeats within the interval are not logged; the next logged line carries their count."""
    failures = AuthFailureLog(interval=60)
    assert failures.failure("10.0.0.9", now=1000.0) == 0
    assert [failures.failure("10.0.0.9", now=1000.0 + i) for i in range(1, 6)] == [None] * 5
    assert failures.failure("10.0.0.9", now=1060.0) == 5
    assert failures.failure("10.0.0.9", now=1061.0) is None
    assert failures.failure("10.0.0.9", now=1120.0) == 1


def test_each_client_address_has_its_own_interval() -> None:
    """One noisy client does not hide another's first failure."""
    failures = AuthFailureLog(interval=60)
    assert failures.failure("10.0.0.9", now=1000.0) == 0
    assert failures.failure("10.0.0.9", now=1001.0) is None
    assert failures.failure("10.0.0.10", now=1002.0) == 0


def test_a_flood_from_many_addresses_keeps_the_table_bounded() -> None:
    """Past max_clients addresses the oldest are forgotten, and new ones are still logged."""
    failures = AuthFailureLog(interval=60, max_clients=3)
    for index in range(10):
        assert failures.failure(f"10.0.0.{index}", now=1000.0 + index) == 0
    assert len(failures._clients) <= 3
    assert failures.failure("10.0.0.9", now=1010.0) is None
