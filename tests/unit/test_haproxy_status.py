"""Which HAProxy `show stat` statuses mean a server gets users' requests."""

from __future__ import annotations

import pytest

from stallwatch.localstack.haproxy import in_rotation


@pytest.mark.parametrize("status", ["UP", "UP 1/3", "UP 2/3"])
def test_up_and_up_going_down_are_in_rotation(status: str) -> None:
    """`UP`, and `UP 2/3` (a health check failed since it came up: still serving), get traffic:
    a server back from quarantine may show the second first."""
    assert in_rotation(status)


@pytest.mark.parametrize(
    "status",
    [
        "DOWN (agent)",
        "DOWN",
        "DOWN 1/2",
        "MAINT",
        "MAINT (via)",
        "NOLB",
        "DRAIN",
        "no check",
        "UPPER",
    ],
)
def test_down_going_up_maintenance_and_draining_are_out(status: str) -> None:
    """A server down (by its agent or its checks, going up or not), in maintenance or draining
    gets no new requests."""
    assert not in_rotation(status)
