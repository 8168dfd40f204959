"""Session fixture: one real Prometheus + Alertmanager pair for every end-to-end test; and, by
name, the module-scoped stack whose restart webhook is the real restarter's (restarter_stack)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.alerting_stack import AlertingStack, running_stack
from tests.support.restarter_pipeline import restarter_stack

REPO = Path(__file__).resolve().parents[2]

__all__ = ["alerting_stack", "restarter_stack"]  # fixtures, used by name


@pytest.fixture(scope="session")
def alerting_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AlertingStack]:
    """Prometheus and Alertmanager on loopback with stallwatch's rules and routing (see harness)."""
    with running_stack(AlertingStack(tmp_path_factory.mktemp("alerting-stack"), REPO)) as stack:
        yield stack
