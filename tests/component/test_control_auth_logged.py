"""A refused token on the control endpoints is logged as the webhook's is."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tests.support.restarter import fake_vllm, marker_argv, running_restarter, write_config


@pytest.mark.parametrize(
    ("method", "path"),
    [("POST", "/-/pause"), ("POST", "/-/resume"), ("POST", "/-/hold?target=gpu1&for=5m")],
)
async def test_a_refused_token_on_a_control_endpoint_is_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, method: str, path: str
) -> None:
    """pause, resume and hold answer 401 to a wrong token and log one warning naming the path."""
    async with fake_vllm("stalled") as fake:
        target = {
            "name": "gpu1",
            "metrics_url": fake.url,
            "action": {"kind": "command", "argv": marker_argv(tmp_path / "marker")},
        }
        config = write_config(tmp_path, [target])
        async with running_restarter(config) as (client, _):
            with caplog.at_level(logging.WARNING, logger="stallwatch.restarter"):
                response = await client.request(
                    method, path, headers={"Authorization": "Bearer wrong"}
                )
    assert response.status == 401
    refusals = [r.getMessage() for r in caplog.records if "authentication failed" in r.getMessage()]
    assert len(refusals) == 1
    assert path.split("?")[0] in refusals[0]
