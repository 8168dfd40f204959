"""A target that leaves the restarter's config takes its series with it."""

from __future__ import annotations

from pathlib import Path

from tests.support.restarter import (
    alert,
    fake_vllm,
    marker_argv,
    payload,
    post_alerts,
    running_restarter,
    write_config,
)


def target(name: str, url: str, marker: Path) -> dict[str, object]:
    return {
        "name": name,
        "metrics_url": url,
        "action": {"kind": "command", "argv": marker_argv(marker)},
    }


async def test_a_reload_that_drops_a_target_leaves_no_series_of_it(tmp_path: Path) -> None:
    """After a reload without gpu2, /metrics has no series labelled gpu2 (it had several)."""
    marker = tmp_path / "marker"
    async with fake_vllm("progress") as fake:
        both = write_config(
            tmp_path, [target("gpu1", fake.url, marker), target("gpu2", fake.url, marker)]
        )
        async with running_restarter(both) as (client, restarter):
            await post_alerts(client, payload(alert("gpu2")))
            before = await (await client.get("/metrics")).text()
            only = write_config(tmp_path, [target("gpu1", fake.url, marker)])
            restarter.apply(only)
            after = await (await client.get("/metrics")).text()
    assert before.count('target="gpu2"') >= 5
    assert 'target="gpu2"' not in after
    assert 'target="gpu1"' in after
