"""The restart window and holds in the running restarter: a confirmed stall waits out its window
and is judged again by the restarter itself; one that recovers is never restarted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from stallwatch.cli import main
from stallwatch.common.cli import EXIT_USAGE
from stallwatch.restarter.journal import Journal
from tests.support.restarter import (
    AUTH,
    alert,
    fake_vllm,
    marker_argv,
    marker_lines,
    payload,
    post_alerts,
    running_restarter,
    settle,
    target_entry,
    write_config,
)

WINDOW = "3s"


def command_target(url: str, marker: Path, **extra: Any) -> dict[str, Any]:
    return target_entry("gpu1", url, {"kind": "command", "argv": marker_argv(marker)}, **extra)


async def wait_for(check: Callable[[], Awaitable[bool] | bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")
        await asyncio.sleep(0.1)


def reasons(journal_path: Path) -> list[str]:
    journal = Journal.open(journal_path)
    try:
        rows = reversed(journal.recent(100))
        return [entry.reason for entry in rows if entry.decision not in ("routing", "window")]
    finally:
        journal.close()


async def test_a_stall_that_lasts_its_window_is_restarted_without_a_second_delivery(
    tmp_path: Path,
) -> None:
    """One delivery: the first confirmation waits; at the window's end the restarter judges the
    alert again by itself, finds nothing moved since its first look, and restarts once."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target(fake.url, marker)], restart_after=WINDOW)
        async with running_restarter(config) as (client, restarter):
            answer = await post_alerts(client, payload(alert()))
            assert answer["decisions"][0]["reason"] == "restart_window"
            assert marker_lines(marker) == []
            await wait_for(lambda: bool(marker_lines(marker)), 30, "the restart")
            await settle(restarter)
            metrics = await (await client.get("/metrics")).text()
    assert marker_lines(marker) == ["gpu1"]
    assert reasons(tmp_path / "journal.sqlite")[:2] == ["restart_window", "confirmed"]
    assert 'stallwatch_restarter_restart_after_seconds{target="gpu1"} 3.0' in metrics


async def test_a_stall_that_moves_inside_its_window_is_never_restarted(tmp_path: Path) -> None:
    """A server that moves again before the window ends is journaled recovered_in_window (a
    near miss, counted) and its action never runs."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target(fake.url, marker)], restart_after=WINDOW)
        async with running_restarter(config) as (client, restarter):
            answer = await post_alerts(client, payload(alert()))
            assert answer["decisions"][0]["reason"] == "restart_window"
            fake.mode = "progress"  # the JIT compile is over
            await wait_for(
                lambda: "recovered_in_window" in reasons(tmp_path / "journal.sqlite"),
                30,
                "the window's end",
            )
            await asyncio.sleep(1.5)  # a second look would come now if the alert were held
            await settle(restarter)
            metrics = await (await client.get("/metrics")).text()
    assert marker_lines(marker) == []
    assert "confirmed" not in reasons(tmp_path / "journal.sqlite")
    assert 'stallwatch_restarter_recovered_in_window_total{target="gpu1"} 1.0' in metrics
    assert "stallwatch_restarter_restart_windows 0.0" in metrics


async def test_an_alert_resolved_inside_its_window_is_a_journaled_near_miss(
    tmp_path: Path,
) -> None:
    """The resolved notice of a server that moved closes the window: resolved, then
    recovered_in_window (counted), and the window's end restarts nothing."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target(fake.url, marker)], restart_after=WINDOW)
        async with running_restarter(config) as (client, restarter):
            await post_alerts(client, payload(alert()))
            fake.mode = "progress"
            await post_alerts(client, payload(alert(status="resolved")))
            await restarter.settled()
            await asyncio.sleep(4.5)  # past the window's end
            await settle(restarter)
            metrics = await (await client.get("/metrics")).text()
    assert marker_lines(marker) == []
    assert reasons(tmp_path / "journal.sqlite") == [
        "restart_window",
        "resolved",
        "recovered_in_window",
    ]
    assert 'stallwatch_restarter_recovered_in_window_total{target="gpu1"} 1.0' in metrics


async def test_a_flap_between_states_does_not_start_the_window_over(tmp_path: Path) -> None:
    """An alert that resolves while nothing moved (one slow poll read hung) leaves the window
    open; the next episode goes on in it and is restarted at the first window's end."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target(fake.url, marker)], restart_after="4s")
        async with running_restarter(config) as (client, restarter):
            opened_at = time.monotonic()
            await post_alerts(client, payload(alert()))
            await post_alerts(client, payload(alert(status="resolved")))
            await restarter.settled()
            second = alert(fingerprint="9f8e7d6c5b4a3f2e", alertname="LLMServerHung")
            second["labels"]["alertname"] = "LLMServerStuck"
            second["startsAt"] = "2026-11-30T05:31:00.000Z"
            await post_alerts(client, payload(second))
            await wait_for(lambda: bool(marker_lines(marker)), 30, "the restart")
            restarted_after = time.monotonic() - opened_at
            await settle(restarter)
    journal = reasons(tmp_path / "journal.sqlite")
    assert journal[:4] == ["restart_window", "resolved", "restart_window", "restart_window"]
    assert "confirmed" in journal
    assert "recovered_in_window" not in journal
    assert restarted_after < 4 + 15  # the first window's end, not a second full window later


async def test_a_hold_defers_restarts_until_it_ends(tmp_path: Path) -> None:
    """POST /-/hold: the target's alerts are journaled on_hold and judged again by themselves
    once the hold runs out; the hold's end is a gauge while it runs."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target(fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            response = await client.post(
                "/-/hold", params={"target": "gpu1", "for": "2s", "reason": "weight sync"},
                headers=AUTH,
            )  # fmt: skip
            assert response.status == 200, await response.text()
            metrics = await (await client.get("/metrics")).text()
            assert 'stallwatch_restarter_hold_expiry_timestamp_seconds{target="gpu1"}' in metrics
            answer = await post_alerts(client, payload(alert()))
            assert answer["decisions"][0]["reason"] == "on_hold"
            assert marker_lines(marker) == []
            await wait_for(lambda: bool(marker_lines(marker)), 30, "the restart after the hold")
            await settle(restarter)
            metrics = await (await client.get("/metrics")).text()
    assert marker_lines(marker) == ["gpu1"]
    assert "stallwatch_restarter_hold_expiry_timestamp_seconds{" not in metrics


async def test_a_released_hold_frees_its_alerts_at_once(tmp_path: Path) -> None:
    """DELETE /-/hold ends the hold early and judges its held alerts again in the request."""
    marker = tmp_path / "marker"
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target(fake.url, marker)])
        async with running_restarter(config) as (client, restarter):
            await client.post("/-/hold", params={"target": "gpu1", "for": "1h"}, headers=AUTH)
            assert (await post_alerts(client, payload(alert())))["decisions"][0]["reason"] == (
                "on_hold"
            )
            response = await client.delete("/-/hold", params={"target": "gpu1"}, headers=AUTH)
            answer = await response.json()
            assert answer == {"status": "ok", "target": "gpu1", "released": True, "judged_again": 1}
            await settle(restarter)
    assert marker_lines(marker) == ["gpu1"]


async def test_bad_holds_are_refused_and_change_nothing(tmp_path: Path) -> None:
    """A hold without the token, of an unknown target, longer than max_hold or of no length
    is refused with the reason, and nothing is journaled."""
    async with fake_vllm("stalled") as fake:
        config = write_config(tmp_path, [command_target(fake.url, tmp_path / "m")], max_hold="10m")
        async with running_restarter(config) as (client, _):
            cases = [
                ({"target": "gpu1", "for": "5m"}, {}, 401, "token"),
                ({"target": "gpu9", "for": "5m"}, AUTH, 404, "gpu9"),
                ({"target": "gpu1", "for": "2h"}, AUTH, 400, "max_hold"),
                ({"target": "gpu1", "for": "0s"}, AUTH, 400, "longer than zero"),
                ({"target": "gpu1"}, AUTH, 400, "for="),
                ({"target": "gpu1", "for": "\uff15m"}, AUTH, 400, "for:"),  # a fullwidth 5
            ]
            for params, headers, status, word in cases:
                response = await client.post("/-/hold", params=params, headers=headers)
                assert response.status == status, params
                assert word in (await response.json())["error"], params
    journal = Journal.open(tmp_path / "journal.sqlite")
    try:
        assert journal.hold_events(0.0) == ()
    finally:
        journal.close()


def test_hold_from_the_command_line_is_bounded_and_journaled(tmp_path: Path, capsys: Any) -> None:
    """`stallwatch restarter hold TARGET --for 5m` writes a hold row; over max_hold it is
    refused (exit 2, nothing written); `unhold` ends it."""
    write_config(tmp_path, [command_target("http://127.0.0.1:9/metrics", tmp_path / "m")])
    config_file = str(tmp_path / "restarter.yml")
    assert main(["restarter", "hold", "gpu1", "--for", "5m", "--config", config_file]) == 0
    assert main(["restarter", "hold", "gpu1", "--for", "3h", "--config", config_file]) == EXIT_USAGE
    assert "max_hold" in capsys.readouterr().err
    journal = Journal.open(tmp_path / "journal.sqlite")
    try:
        events = journal.hold_events(0.0)
        assert [(e.kind, e.target, e.duration) for e in events] == [("hold", "gpu1", 300.0)]
    finally:
        journal.close()
    assert main(["restarter", "unhold", "gpu1", "--config", config_file]) == 0
    journal = Journal.open(tmp_path / "journal.sqlite")
    try:
        assert [e.kind for e in journal.hold_events(0.0)] == ["hold", "hold_released"]
    finally:
        journal.close()
