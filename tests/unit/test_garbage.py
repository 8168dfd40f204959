"""The exporter's garbage-collector settings."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from stallwatch.common.garbage import YOUNG_COLLECTION_THRESHOLD, set_for_service


@pytest.fixture
def restored_collector() -> Iterator[None]:
    thresholds = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*thresholds)


@pytest.mark.usefixtures("restored_collector")
def test_young_generation_collected_less_often() -> None:
    """The youngest generation's threshold is raised; the older generations' are kept."""
    _, middle, oldest = gc.get_threshold()
    set_for_service()
    assert gc.get_threshold() == (YOUNG_COLLECTION_THRESHOLD, middle, oldest)
    assert YOUNG_COLLECTION_THRESHOLD > 700  # the interpreter's default


@pytest.mark.usefixtures("restored_collector")
def test_objects_loaded_before_are_set_aside() -> None:
    """What exists when the service starts is frozen: full collections no longer walk it."""
    kept = [{"a": 1}, {"b": 2}]
    before = gc.get_freeze_count()
    set_for_service()
    assert gc.get_freeze_count() > before
    assert not any(obj is kept for obj in gc.get_objects())
