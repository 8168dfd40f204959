"""Session fixture: one real Prometheus + Alertmanager pair for every end-to-end test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.alerting_stack import AlertingStack, running_stack

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def alerting_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlertingStack]:
    """Prometheus and Alertmanager on loopback with stallwatch's rules and routing (see harness)."""
    with running_stack(AlertingStack(tmp_path_factory.mktemp("alerting-stack"), REPO)) as stack:
        yield stack
