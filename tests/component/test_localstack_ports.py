"""The local stack's ports: chosen where outgoing connections never take them, chosen again
when another process took one first."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from stallwatch.localstack.processes import ephemeral_port_range, free_port, http_get
from stallwatch.localstack.rewrite import ScrapeTargets, Webhook
from stallwatch.localstack.stack import LocalStack


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[LocalStack]:
    local = LocalStack(
        tmp_path,
        scrape=ScrapeTargets(exporter="127.0.0.1:9", restarter="127.0.0.1:9"),
        webhook=Webhook(url="http://127.0.0.1:9/alerts", token="t"),
    )
    try:
        yield local
    finally:
        local.stop()


def test_free_ports_are_below_the_ephemeral_range_and_never_repeat() -> None:
    """Ports come from below the kernel's range for outgoing connections, each one once."""
    low, _ = ephemeral_port_range()
    ports = [free_port() for _ in range(50)]
    assert all(port < low for port in ports)
    assert len(set(ports)) == len(ports)


def test_an_unreadable_range_file_falls_back_to_linux_default(tmp_path: Path) -> None:
    """A missing or garbled range file reads as Linux's default range."""
    garbled = tmp_path / "range"
    garbled.write_text("not numbers\n")
    assert ephemeral_port_range(garbled) == (32_768, 60_999)
    assert ephemeral_port_range(tmp_path / "absent") == (32_768, 60_999)


def test_a_stack_whose_port_was_taken_starts_on_new_ports(stack: LocalStack) -> None:
    """Prometheus' chosen port taken by another listener before start: the stack starts anyway."""
    taken_port = stack.prometheus_port
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken_port))
        squatter.listen(1)
        stack.start()
        assert stack.prometheus_port != taken_port
        assert b"Ready" in http_get(f"{stack.prometheus_url}/-/ready")
        assert http_get(f"{stack.alertmanager_url}/-/ready") is not None


def test_a_port_given_by_the_owner_is_not_replaced(tmp_path: Path) -> None:
    """A port the owner chose and another process holds is an error that says so."""
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen(1)
        taken_port = squatter.getsockname()[1]
        local = LocalStack(
            tmp_path,
            scrape=ScrapeTargets(exporter="127.0.0.1:9", restarter="127.0.0.1:9"),
            webhook=Webhook(url="http://127.0.0.1:9/alerts", token="t"),
            prometheus_port=taken_port,
            alertmanager_port=free_port(),
        )
        try:
            with pytest.raises(Exception, match="address already in use"):
                local.start()
            assert not any(process.running for process in local.processes)
        finally:
            local.stop()
