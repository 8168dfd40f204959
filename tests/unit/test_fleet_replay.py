"""The fleet replay: correlated faults next to independent hangs, watched four ways."""

from __future__ import annotations

import json

import pytest

from stallwatch.cli import main
from stallwatch.common.cli import EXIT_USAGE
from stallwatch.replay.fleet import FleetResult, run_fleet
from stallwatch.replay.fleet_plan import FleetConfig, plan_fleet
from stallwatch.replay.fleet_report import fleet_document
from stallwatch.replay.fleet_state import WayTally


@pytest.fixture(scope="module")
def week() -> FleetResult:
    return run_fleet(FleetConfig(seed=1, servers=8, days=7))


def _way(result: FleetResult, prefix: str) -> WayTally:
    return next(way for way in result.ways if way.name.startswith(prefix))


def test_week_has_every_kind_of_fault(week: FleetResult) -> None:
    """The pinned week holds blips, an exporter restart, a bad node and independent hangs."""
    causes = {cause for _, _, cause in week.plan.hangs}
    assert week.plan.blips
    assert week.plan.exporter_restarts
    assert causes == {"independent", "bad_node"}


def test_fleet_rules_restart_no_healthy_server_and_catch_every_hang(week: FleetResult) -> None:
    """Stallwatch with its fleet rules: no healthy restart, none in a blip, every hang caught."""
    way = _way(week, "stallwatch with")
    assert way.healthy_restarts == 0
    assert way.healthy_restarts_in_blips == 0
    assert way.hangs
    assert way.hangs_caught == len(way.hangs)
    assert week.breaker_openings == len(week.plan.blips)


def test_without_fleet_rules_blips_restart_healthy_servers(week: FleetResult) -> None:
    """Without the mass-stall cap and breaker, a network blip restarts servers that were fine."""
    way = _way(week, "stallwatch without")
    assert way.healthy_restarts_in_blips > 0
    assert way.healthy_restarts == way.healthy_restarts_in_blips


def test_kubelet_probe_catches_no_hang(week: FleetResult) -> None:
    """A /health liveness probe never catches a hung engine (its /health stays 200)."""
    way = _way(week, "kubelet")
    assert way.hangs
    assert way.hangs_caught == 0
    assert way.healthy_restarts > 0


def test_canary_catches_only_hangs_of_idle_workers(week: FleetResult) -> None:
    """The canary on idle catches workers frozen at running 0, never one frozen while busy."""
    way = _way(week, "canary")
    caught = [hang for hang in way.hangs if hang.caught_after is not None]
    assert caught
    assert not any(hang.running_at_hang for hang in caught)
    assert any(hang.running_at_hang for hang in way.hangs)


def test_same_seed_gives_the_same_fleet_result() -> None:
    """The replay is deterministic: one seed, one result; another seed, another plan."""
    config = FleetConfig(seed=5, servers=4, days=1)
    assert fleet_document(run_fleet(config)) == fleet_document(run_fleet(config))
    other = plan_fleet(FleetConfig(seed=6, servers=4, days=1))
    assert plan_fleet(config).toggles != other.toggles


def test_cli_runs_the_fleet_replay(capsys: pytest.CaptureFixture[str]) -> None:
    """`--servers` and `--days` switch to the fleet replay, as a table or as JSON."""
    assert main(["replay", "--servers", "3", "--days", "0.5", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "3 servers, 0.5 days, seed 2" in out
    assert "Assumptions:" in out
    assert main(["replay", "--servers", "3", "--days", "0.5", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert [way["name"] for way in document["ways"]][2] == "kubelet /health probe"


def test_cli_rejects_zero_servers(capsys: pytest.CaptureFixture[str]) -> None:
    """A fleet of no servers is a usage error that names the option."""
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", "--servers", "0"])
    assert exit_info.value.code == EXIT_USAGE
    assert "--servers" in capsys.readouterr().err


def test_the_one_server_options_are_refused_in_fleet_mode(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--hours and --load shape the one-server replay; with --servers they are a usage error,
    not silently ignored."""
    assert main(["replay", "--servers", "4", "--days", "1", "--hours", "3"]) == EXIT_USAGE
    assert "takes neither" in capsys.readouterr().err
