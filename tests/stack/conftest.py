"""Fixtures of the stack tier: podman serving the Docker API, the images, the running stack.

The tier skips, saying why, where it cannot run: not root, or podman and its parts missing
and not installable. Figures (build times, sizes, time to healthy, hang to restart) are
printed at the end of the run.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from .compose import SERVICES, ComposeProject
from .figures import FIGURES
from .images import StackImages, build_images
from .podman import Podman, PodmanUnavailable, podman_service

HEALTHY_TIMEOUT = 180.0


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if FIGURES:
        terminalreporter.section("stack figures")
        for line in FIGURES:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    """Podman set up for this machine, its Docker API on a socket in a temporary directory."""
    try:
        with podman_service() as service:
            yield service
    except PodmanUnavailable as reason:
        pytest.skip(f"stack tier skipped: {reason}")


@pytest.fixture(scope="session")
def images(podman: Podman) -> StackImages:
    """The base, stallwatch, Prometheus and Alertmanager images (cached by content hash)."""
    started = time.monotonic()
    built = build_images(podman)
    for name, image in built.all().items():
        how = f"built in {image.seconds:.1f} s" if image.built else "cached"
        FIGURES.append(f"image {name}: {how}, {image.size_bytes / 1e6:.0f} MB ({image.reference})")
    FIGURES.append(f"images ready in {time.monotonic() - started:.1f} s")
    return built


@pytest.fixture(scope="module")
def stack(podman: Podman, images: StackImages) -> Iterator[ComposeProject]:
    """The compose stack up with every healthcheck passing; `down -v` afterwards, always."""
    project = ComposeProject.create(podman, images)
    project.down()  # what a crashed earlier run may have left
    try:
        started = time.monotonic()
        project.up()
        names = project.container_names()
        assert sorted(names) == sorted(SERVICES), names
        project.wait_healthy(list(names.values()), HEALTHY_TIMEOUT)
        FIGURES.append(f"docker-compose up -> all healthy: {time.monotonic() - started:.1f} s")
        yield project
    finally:
        project.down()
