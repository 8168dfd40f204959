"""The incident replay: the old watchdogs vs stallwatch's real decision code, in virtual time."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
import yaml

from stallwatch.cli import main
from stallwatch.common.cli import EXIT_USAGE
from stallwatch.core.reading import parse_reading
from stallwatch.replay import (
    ReplayConfig,
    ReplayResult,
    engine_reading,
    plan_traffic,
    run_replay,
    stallwatch_way,
)
from stallwatch.replay import restarter as virtual_restarter
from stallwatch.replay.clock import Scheduler
from stallwatch.replay.server import SimulatedServer
from stallwatch.replay.stallwatch_way import DEGRADATION_RULES
from stallwatch.simulator.engine import SimRequest
from stallwatch.simulator.metrics import EngineView, RenderOptions, render_payload
from tests.support.real_payloads import REPO_ROOT

SEEDS = (1, 2, 3)
HOURS = 12.0


class _DaysBySeed(dict[int, ReplayResult]):
    """Each seed's day, replayed when a test first asks for it: the tests of one seed may run
    in another worker than the others', which then replays only the days it needs."""

    def __missing__(self, seed: int) -> ReplayResult:
        self[seed] = run_replay(ReplayConfig(seed=seed, hours=HOURS))
        return self[seed]


@pytest.fixture(scope="module")
def results() -> dict[int, ReplayResult]:
    return _DaysBySeed()


@pytest.mark.parametrize("seed", SEEDS)
def test_old_way_restarts_a_healthy_server_under_batch_load(
    results: dict[int, ReplayResult], seed: int
) -> None:
    """Request-sending watchdogs time out behind the batch job and restart a healthy server."""
    old = results[seed].old
    assert old.false_restarts >= 1
    assert old.test_requests_to_busy_server > 0
    assert old.failed_500 > results[seed].new.failed_500


@pytest.mark.parametrize("seed", SEEDS)
def test_new_way_never_restarts_a_healthy_server(
    results: dict[int, ReplayResult], seed: int
) -> None:
    """stallwatch restarts only hung servers and never sends a test request to a busy one."""
    new = results[seed].new
    assert new.false_restarts == 0
    assert new.restarts_in_degraded == 0
    assert new.test_requests_to_busy_server == 0
    assert new.test_requests > 0  # it does probe, but only idle servers


@pytest.mark.parametrize("seed", SEEDS)
def test_new_way_catches_every_real_hang(results: dict[int, ReplayResult], seed: int) -> None:
    """Every seeded engine hang is caught, by a restart, once its restart window has run out:
    after restart_after and within two minutes more (the alert, then the window's last reads)."""
    result = results[seed]
    restart_after = result.config.restart_after
    assert restart_after == 300.0
    assert len(result.new.hangs) == len(result.hang_times) >= 1
    for hang in result.new.hangs:
        assert hang.caught_after is not None
        assert restart_after < hang.caught_after < restart_after + 120
    assert result.new.true_restarts == len(result.hang_times)


@pytest.mark.parametrize("seed", SEEDS)
def test_silences_that_end_by_themselves_are_not_restarted_at_the_defaults(
    results: dict[int, ReplayResult], seed: int
) -> None:
    """A day with compiles and weight syncs: 0 false restarts with the 5 m window, while the old
    two-poll rule (restart_after 0) restarts servers that were in a silence and would have
    recovered; the window's near misses are counted."""
    result = results[seed]
    new, two_poll = result.new, result.two_poll
    assert two_poll is not None
    assert any("compile" in silence.causes for silence in new.silences)
    assert any("weight_sync" in silence.causes and not silence.held for silence in new.silences)
    assert any("weight_sync" in silence.causes and silence.held for silence in new.silences)
    assert new.false_restarts == new.restarts_in_silence == 0
    assert all(silence.restarted_after is None for silence in new.silences)
    assert two_poll.restarts_in_silence > 0
    # The two-poll rule also restarts a server so slow that two polls saw no step (degraded).
    assert two_poll.false_restarts == two_poll.restarts_in_silence + two_poll.restarts_in_degraded
    assert new.recovered_in_window > 0
    assert new.restarter_skips["recovered_in_window"] == new.recovered_in_window
    assert new.exporter_recovered_stalls >= new.recovered_in_window


@pytest.mark.parametrize("seed", SEEDS)
def test_the_two_poll_rule_catches_hangs_sooner(
    results: dict[int, ReplayResult], seed: int
) -> None:
    """The window's cost: with restart_after 0 every hang is caught within two minutes."""
    two_poll = results[seed].two_poll
    assert two_poll is not None
    assert two_poll.restart_after == 0.0
    assert two_poll.hangs_caught == len(two_poll.hangs)
    assert max(two_poll.catch_seconds) < 120


# A day of weight syncs longer than the window: 7 minutes each, every 1.5 h.
LONG_SYNCS = ReplayConfig(
    seed=2, hours=4, weight_sync_every_hours=1.5, weight_sync_seconds=(420.0, 420.0)
)


def _syncs(result: ReplayResult) -> list[Any]:
    return [silence for silence in result.new.silences if "weight_sync" in silence.causes]


def test_a_sync_longer_than_the_window_without_a_hold_is_restarted() -> None:
    """A 7 m weight sync with no hold outlasts the 5 m window and is restarted although it would
    have ended by itself: the reason a trainer takes a hold before it."""
    result = run_replay(replace(LONG_SYNCS, weight_sync_holds="never"))
    syncs = _syncs(result)
    assert syncs
    assert all(sync.restarted_after is not None for sync in syncs)
    assert result.new.restarts_in_silence == len(syncs)


@pytest.mark.parametrize("hold_clause", [True, False])
def test_a_held_sync_is_never_restarted(hold_clause: bool) -> None:
    """The same 7 m syncs with a hold: never restarted, by the rules' hold clause or, without
    it, by the restarter's own on_hold check (History.holds)."""
    result = run_replay(
        replace(LONG_SYNCS, weight_sync_holds="always", rules_hold_clause=hold_clause)
    )
    syncs = _syncs(result)
    assert syncs
    assert all(sync.held and sync.restarted_after is None for sync in syncs)
    assert result.new.restarts_in_silence == 0
    assert ("on_hold" in result.new.restarter_skips) is not hold_clause


def test_an_autotune_at_start_with_its_port_closed_reads_down() -> None:
    """A start's autotune happens before vLLM opens its port: the server is down (loading) for
    the weights and the autotune, and no way restarts it for that."""
    config = ReplayConfig(seed=4, hours=4, load=0, interactive_per_hour=0)
    result = run_replay(config)
    assert result.new.true_restarts == 1
    autotune = result.silence_plan.autotune(0) if result.silence_plan else 0.0
    assert 206 <= autotune <= 363
    assert result.new.minutes_loading * 60 == pytest.approx(config.restart_load_seconds + autotune)
    assert result.new.restarts_in_silence == 0


def test_an_autotune_with_its_port_open_is_left_to_finish_by_stallwatch() -> None:
    """With /metrics answering during a start's autotune (frozen counters, requests queued),
    the restart's cooldown keeps stallwatch from cutting it short under either rule; the old
    watchdogs, which check once the port is open, do cut autotunes short."""
    result = run_replay(ReplayConfig(seed=1, hours=HOURS, start_autotune_port_open=True))
    assert result.two_poll is not None
    for way in (result.new, result.two_poll):
        autotunes = [s for s in way.silences if "start_autotune" in s.causes]
        assert autotunes
        assert all(s.restarted_after is None for s in autotunes)
        assert way.restarter_skips["cooldown"] > 0
    assert any(
        s.restarted_after is not None for s in result.old.silences if "start_autotune" in s.causes
    )


def test_same_seed_gives_the_same_result(results: dict[int, ReplayResult]) -> None:
    """The replay is deterministic: the same seed and settings give the same day, silences
    included."""
    assert run_replay(ReplayConfig(seed=SEEDS[0], hours=HOURS)) == results[SEEDS[0]]


def test_different_seeds_give_different_days() -> None:
    """The seed drives the traffic and the hang times."""
    first = plan_traffic(ReplayConfig(seed=1))
    second = plan_traffic(ReplayConfig(seed=2))
    assert first.hang_times != second.hang_times


def test_hang_of_an_idle_server_is_caught_through_the_idle_test_request() -> None:
    """With no traffic, a hang shows only through the failing idle test request (unresponsive)."""
    config = ReplayConfig(seed=4, hours=4, load=0, interactive_per_hour=0)
    result = run_replay(config)
    assert result.new.true_restarts == len(result.hang_times) == 1
    assert result.new.false_restarts == 0
    assert result.new.hangs[0].caught_after is not None
    assert result.new.hangs[0].kind == "running_at_0"


def test_replay_reads_what_the_parser_reads_from_the_simulator_payload() -> None:
    """The replay's reading of the engine equals parse_reading of the simulator's /metrics."""
    server = SimulatedServer(ReplayConfig(), Scheduler())
    assert server.engine is not None
    engine = server.engine
    engine.submit(SimRequest("a", 10, 50, True, 0.0), 0.0)
    engine.submit(SimRequest("b", 300, 50, True, 0.0), 0.0)
    engine.advance_to(20.0)
    views = [EngineView("0", engine.stats, engine.sleep_level, engine.config.kv_cache_tokens)]
    options = RenderOptions(
        model_name="model", multiprocess=False, vllm_metrics=True, process_start_time=123.0
    )
    parsed = parse_reading(render_payload(views, options), taken_at=20.0)
    assert engine_reading(engine, 123.0, 20.0) == parsed
    assert parsed.engines[0].steps


def test_cli_prints_the_table_and_json(capsys: pytest.CaptureFixture[str]) -> None:
    """`stallwatch replay` prints the old-vs-new table with assumptions, or JSON with --json."""
    assert main(["replay", "--seed", "2", "--hours", "3"]) == 0
    text = capsys.readouterr().out
    assert "test requests sent to a busy server" in text
    assert "Assumptions:" in text
    assert main(["replay", "--seed", "2", "--hours", "3", "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["new"]["test_requests_to_busy_server"] == 0
    assert document["seed"] == 2


def test_cli_without_silences_and_window_gives_the_earlier_day(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`--no-silences --no-degraded --restart-after 0` replays seed 1 as it was before silences,
    degraded periods and the window: 44 false restarts the old way, none by stallwatch, hangs
    caught in 60, 63, 60 s."""
    assert (
        main(
            [
                *("replay", "--seed", "1", "--no-silences", "--no-degraded"),
                *("--restart-after", "0", "--json"),
            ]
        )
        == 0
    )
    document = json.loads(capsys.readouterr().out)
    assert document["old"]["false_restarts"] == 44
    assert document["new"]["false_restarts"] == 0
    assert document["new"]["restart_after_seconds"] == 0.0
    assert document["new"]["silences"] == []
    catch = [round(hang["seconds_to_catch"]) for hang in document["new"]["hangs"]]
    assert catch == [60, 63, 60]


def test_cli_rejects_a_bad_number(capsys: pytest.CaptureFixture[str]) -> None:
    """A non-positive --hours is a usage error naming the value."""
    with pytest.raises(SystemExit) as exit_info:
        main(["replay", "--hours", "0"])
    assert exit_info.value.code == EXIT_USAGE
    assert "'0'" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("module", "step"),
    [
        (stallwatch_way, "poll_plan"),
        (stallwatch_way, "restart_alerts"),
        (stallwatch_way, "current_holds"),
        (virtual_restarter, "firing_plan"),
        (virtual_restarter, "resolved_plan"),
    ],
)
def test_stallwatchs_way_calls_the_pipelines_own_step(
    module: Any, step: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The replay decides through the core's own steps, not copies: each is called on a hung day."""
    calls: list[object] = []
    real = getattr(module, step)

    def spy(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(module, step, spy)
    result = run_replay(ReplayConfig(seed=4, hours=4, load=0, interactive_per_hour=0))
    assert result.new.true_restarts == 1
    assert calls


def _catch_times(result: ReplayResult) -> list[tuple[str, float | None]]:
    return [
        (hang.kind, None if hang.caught_after is None else round(hang.caught_after))
        for hang in result.new.hangs
    ]


def test_seed_11_day_is_pinned() -> None:
    """Seed 11's day (no silences, two-poll rule): 488 test requests, none to a busy server;
    its three idle hangs caught.

    With probe.min_interval 60 s (the default) an idle server gets a test request once a
    minute instead of every other poll: 1 072 test requests became 488 (the old watchdogs
    sent 793). All three hangs struck an idle server (running frozen at 0); they are caught
    after 76 s, 70 s and 60 s instead of 46 s, 70 s and 60 s: the first one waited up to a
    minute for the next test request instead of a poll.
    """
    result = run_replay(
        ReplayConfig(seed=11, legitimate_silences=False, restart_after=0.0, degraded_per_day=0.0)
    )
    assert result.new.test_requests == 488
    assert result.new.test_requests_to_busy_server == 0
    assert result.old.test_requests == 793
    assert (result.new.true_restarts, result.new.false_restarts) == (3, 0)
    assert _catch_times(result) == [
        ("running_at_0", 76),
        ("running_at_0", 70),
        ("running_at_0", 60),
    ]


def test_min_interval_zero_gives_back_a_test_request_on_every_idle_poll() -> None:
    """With probe.min_interval 0 the seed 11 day (no silences, two-poll rule) sends the 1 072
    test requests it used to."""
    result = run_replay(
        ReplayConfig(
            seed=11,
            test_request_min_interval=0.0,
            legitimate_silences=False,
            restart_after=0.0,
            degraded_per_day=0.0,
        )
    )
    assert result.new.test_requests == 1072
    assert result.new.test_requests_to_busy_server == 0
    assert _catch_times(result) == [
        ("running_at_0", 46),
        ("running_at_0", 70),
        ("running_at_0", 60),
    ]


@pytest.mark.parametrize("seed", SEEDS)
def test_degraded_periods_are_told_to_people_and_never_restarted(
    results: dict[int, ReplayResult], seed: int
) -> None:
    """Each day's degraded periods: stallwatch's degradation alerts cover part of them and it
    restarts nothing for them, while the old watchdogs restart the slow server."""
    result = results[seed]
    assert result.degraded_periods
    assert {period.mode for period in result.degraded_periods} <= {
        "throughput",
        "admission",
        "preemption",
    }
    assert result.new.restarts_in_degraded == 0
    assert 0 < result.new.degraded_minutes_noticed <= result.degraded_minutes
    assert result.old.degraded_minutes_noticed == 0
    assert not result.old.degraded_alerts
    assert sum(results[s].old.restarts_in_degraded for s in SEEDS) > 0


def test_the_replayed_degradation_rules_are_the_rule_files() -> None:
    """The replay's degradation alerts watch the reasons and wait the `for:` of alerts.yml."""
    document = yaml.safe_load((REPO_ROOT / "prometheus" / "alerts.yml").read_text())
    rules = {rule["alert"]: rule for group in document["groups"] for rule in group["rules"]}
    seconds = {"1m": 60.0, "5m": 300.0}
    for alertname, (reasons, hold_for) in DEGRADATION_RULES.items():
        rule = rules[alertname]
        assert seconds[rule["for"]] == hold_for, alertname
        if alertname == "LLMServerAdmissionStalled":
            assert reasons == {"admission_stalled"}
            assert 'reason="admission_stalled"' in rule["expr"]
        else:
            assert "admission_stalled" not in reasons
            assert 'reason!="admission_stalled"' in rule["expr"]
