"""The fleet replay: correlated faults and legitimate silences next to independent hangs, watched
five ways."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from stallwatch.cli import main
from stallwatch.common.cli import EXIT_USAGE
from stallwatch.replay import fleet_stallwatch
from stallwatch.replay import restarter as virtual_restarter
from stallwatch.replay.config import SyncHolds
from stallwatch.replay.fleet import FleetResult, run_fleet
from stallwatch.replay.fleet_plan import FleetConfig, FleetPlan, plan_fleet
from stallwatch.replay.fleet_report import fleet_document
from stallwatch.replay.fleet_stallwatch import FleetStallwatch
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
    """Stallwatch with its fleet rules and its 5 m window: no healthy restart, none in a blip
    and none in a legitimate silence, every hang caught once its window has run out."""
    way = _way(week, "stallwatch with fleet rules")
    assert way.restart_after == 300.0
    assert way.healthy_restarts == 0
    assert way.healthy_restarts_in_blips == 0
    assert way.silences
    assert way.restarts_in_silences == 0
    assert way.hangs
    assert way.hangs_caught == len(way.hangs)
    assert min(way.catch_seconds()) > 300.0
    assert week.breaker_openings == len(week.plan.blips)


def test_the_week_holds_every_kind_of_legitimate_silence(week: FleetResult) -> None:
    """Compiles, held and unheld weight syncs, with and without work present, strike the fleet."""
    way = week.ways[0]
    causes = {(s.planned.cause, s.planned.held) for s in way.silences}
    assert causes == {("compile", False), ("weight_sync", True), ("weight_sync", False)}
    assert {s.running_at_start for s in way.silences} == {True, False}


def test_the_two_poll_rule_restarts_silences_that_would_have_ended(week: FleetResult) -> None:
    """The same fleet rules with restart_after 0: unheld syncs and long compiles are restarted
    (false restarts), held syncs never; hangs are caught sooner (the window's cost)."""
    way = _way(week, "stallwatch with fleet rules, two-poll rule")
    assert way.restart_after == 0.0
    assert way.restarts_in_silences > 0
    assert way.healthy_restarts == way.restarts_in_silences
    cut = [s for s in way.silences if s.restarted_after is not None]
    assert not any(s.planned.held for s in cut)
    assert max(way.catch_seconds()) < min(_way(week, "stallwatch with").catch_seconds())
    assert way.recovered_in_window == 0
    assert week.ways[0].recovered_in_window > 0


def test_without_fleet_rules_the_window_outlasts_the_blips(week: FleetResult) -> None:
    """Without the mass-stall cap and breaker, blips (2-5 min) end inside the 5 m window: no
    healthy restart, each blip's Hung alerts recover there as near misses."""
    way = _way(week, "stallwatch without")
    assert way.healthy_restarts == 0
    assert way.recovered_in_window > week.ways[0].recovered_in_window


def test_without_fleet_rules_and_window_blips_restart_healthy_servers(week: FleetResult) -> None:
    """Without the fleet rules and with the two-poll rule, a blip restarts servers that were
    fine: the fleet rules still matter wherever restart_after is short."""
    way = FleetStallwatch(week.plan, fleet_rules=False, restart_after=0.0).run()
    assert way.healthy_restarts_in_blips > 0


def _syncs_plan(holds: SyncHolds, hold_clause: bool = True) -> FleetPlan:
    """Two days of 7 m weight syncs (longer than the window) into two servers of four."""
    config = FleetConfig(
        seed=3,
        servers=4,
        days=2,
        weight_sync_seconds=(420.0, 420.0),
        weight_sync_holds=holds,
        rules_hold_clause=hold_clause,
    )
    return plan_fleet(config)


def test_an_unheld_sync_longer_than_the_window_is_restarted() -> None:
    """A 7 m sync with no hold outlasts the 5 m window and is restarted although it would have
    ended by itself: the reason a trainer takes a hold."""
    way = FleetStallwatch(_syncs_plan("never"), fleet_rules=True).run()
    syncs = [s for s in way.silences if s.planned.cause == "weight_sync"]
    assert syncs
    assert all(s.restarted_after is not None for s in syncs)


@pytest.mark.parametrize("hold_clause", [True, False])
def test_a_held_sync_is_never_restarted(hold_clause: bool) -> None:
    """The same 7 m syncs held: never restarted, by the rules' hold clause or, without it, by
    the restarter's own on_hold (History.holds)."""
    way = FleetStallwatch(_syncs_plan("always", hold_clause), fleet_rules=True).run()
    syncs = [s for s in way.silences if s.planned.cause == "weight_sync"]
    assert syncs
    assert all(s.planned.held and s.restarted_after is None for s in syncs)
    assert ("on_hold" in way.skips) is not hold_clause


@pytest.mark.parametrize(
    ("module", "step"),
    [
        (fleet_stallwatch, "current_holds"),
        (virtual_restarter, "firing_plan"),
        (virtual_restarter, "resolved_plan"),
    ],
)
def test_the_fleet_replay_calls_the_cores_own_step(
    module: object, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fleet's restarter decides through the core's own steps, not copies."""
    calls: list[object] = []
    real = getattr(module, step)

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, step, spy)
    FleetStallwatch(_syncs_plan("alternate"), fleet_rules=True).run()
    assert calls


def test_without_silences_the_plan_is_the_earlier_one() -> None:
    """The silences come from their own random stream: the rest of the plan is unchanged."""
    config = FleetConfig(seed=1, servers=8, days=7)
    with_silences = plan_fleet(config)
    without = plan_fleet(replace(config, legitimate_silences=False))
    assert with_silences.silences
    assert not without.silences
    assert (with_silences.toggles, with_silences.hangs, with_silences.blips) == (
        without.toggles,
        without.hangs,
        without.blips,
    )


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
    assert [way["name"] for way in document["ways"]][3] == "kubelet /health probe"


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
