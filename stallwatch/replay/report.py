"""The replay's result as a table with its assumptions, or as plain JSON-ready data."""

from __future__ import annotations

from typing import Any

from stallwatch.replay.config import ReplayConfig
from stallwatch.replay.day import ReplayResult, WayResult


def _way_document(way: WayResult) -> dict[str, Any]:
    return {
        "restarts": way.restarts,
        "false_restarts": way.false_restarts,
        "true_restarts": way.true_restarts,
        "restarts_by": way.restarts_by,
        "requests_failed_500": way.failed_500,
        "requests_refused_while_loading": way.refused_while_loading,
        "requests_completed": way.completed_requests,
        "test_requests": way.test_requests,
        "test_requests_to_busy_server": way.test_requests_to_busy_server,
        "minutes_down": round(way.minutes_down, 1),
        "minutes_loading": round(way.minutes_loading, 1),
        "minutes_hung": round(way.minutes_hung, 1),
        "hangs": [
            {
                "started_at_seconds": round(hang.started_at, 1),
                "kind": hang.kind,
                "caught": hang.caught_after is not None,
                "seconds_to_catch": None
                if hang.caught_after is None
                else round(hang.caught_after, 1),
                "lasted_seconds": round(hang.lasted, 1),
            }
            for hang in way.hangs
        ],
        "restarter_skips": way.restarter_skips,
    }


def result_document(result: ReplayResult) -> dict[str, Any]:
    """The result as plain JSON-ready data."""
    config = result.config
    return {
        "seed": config.seed,
        "hours": config.hours,
        "load": config.load,
        "hang_times_seconds": [round(t, 1) for t in result.hang_times],
        "batch_phases": [
            {"start_seconds": round(s, 1), "end_seconds": round(e, 1), "concurrency": c}
            for s, e, c in result.batch_phases
        ],
        "old": _way_document(result.old),
        "new": _way_document(result.new),
        "assumptions": assumptions(config),
    }


def _clock(seconds: float) -> str:
    minutes = int(seconds // 60)
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def _catch_times(way: WayResult) -> str:
    parts = []
    for hang in way.hangs:
        if hang.caught_after is None:
            text = f"never (hung {hang.lasted / 60:.0f} min)"
        elif hang.caught_after < 120:
            text = f"{hang.caught_after:.0f} s"
        else:
            text = f"{hang.caught_after / 60:.1f} min"
        parts.append(text + ("*" if hang.kind == "running_at_0" else ""))
    return ", ".join(parts) or "-"


def format_result(result: ReplayResult, elapsed: float | None = None) -> str:
    """The old-vs-new table and the model's assumptions, as text."""
    old, new = result.old, result.new
    rows = [
        ("restarts", str(old.restarts), str(new.restarts)),
        ("  of a healthy server (false)", str(old.false_restarts), str(new.false_restarts)),
        ("  of a hung server (true)", str(old.true_restarts), str(new.true_restarts)),
        ("requests failed with HTTP 500", str(old.failed_500), str(new.failed_500)),
        (
            "requests refused while the model loaded",
            str(old.refused_while_loading),
            str(new.refused_while_loading),
        ),
        ("requests completed", str(old.completed_requests), str(new.completed_requests)),
        ("test requests sent", str(old.test_requests), str(new.test_requests)),
        (
            "test requests sent to a busy server",
            str(old.test_requests_to_busy_server),
            str(new.test_requests_to_busy_server),
        ),
        (
            "minutes the model was down (loading + hung)",
            f"{old.minutes_down:.0f} ({old.minutes_loading:.0f} + {old.minutes_hung:.0f})",
            f"{new.minutes_down:.0f} ({new.minutes_loading:.0f} + {new.minutes_hung:.0f})",
        ),
        (
            "real hangs caught",
            f"{old.hangs_caught} of {len(old.hangs)}",
            f"{new.hangs_caught} of {len(new.hangs)}",
        ),
        ("time to catch each hang", _catch_times(old), _catch_times(new)),
    ]
    width = max(len(row[0]) for row in rows)
    old_width = max(len("old way"), *(len(row[1]) for row in rows))
    config = result.config
    lines = [
        f"stallwatch replay: {config.hours:g} h on one model server, seed {config.seed}, "
        f"batch load {config.load:g}",
        f"hangs at {', '.join(_clock(t) for t in result.hang_times) or 'none'}; "
        f"batch phases: {len(result.batch_phases)}",
        "",
        f"{'':<{width}}  {'old way':<{old_width}}  stallwatch",
    ]
    lines += [f"{name:<{width}}  {a:<{old_width}}  {b}" for name, a, b in rows]
    if any(hang.kind == "running_at_0" for hang in (*old.hangs, *new.hangs)):
        lines.append(
            "* hung idle: running and waiting frozen at 0, only a failing test request shows it"
        )
    by = ", ".join(f"{name} {count}" for name, count in sorted(old.restarts_by.items()))
    lines += ["", f"old way restarts by: {by or 'none'}"]
    if new.restarter_skips:
        skips = ", ".join(f"{k} {v}" for k, v in sorted(new.restarter_skips.items()))
        lines.append(f"stallwatch restarter skips: {skips}")
    lines += ["", "Assumptions:"]
    lines += [f"- {line}" for line in assumptions(config)]
    if elapsed is not None:
        lines += ["", f"(replayed in {elapsed:.1f} s)"]
    return "\n".join(lines)


def assumptions(config: ReplayConfig) -> list[str]:
    """The model's assumptions, stated next to its result."""
    timers = ", ".join(f"{t / 60:g}" for t in config.timer_intervals)
    return [
        f"one server: {config.tokens_per_second:g} tokens/s for a single request, decode speed "
        f"shared by the running requests, {config.max_num_seqs} slots, prefill "
        f"{config.prefill_tokens_per_second:g} tokens/s; the simulator's engine model, "
        f"stepping {config.tokens_per_step} tokens at a time on a virtual clock",
        f"a restart kills the requests in flight (HTTP 500) and takes "
        f"{config.restart_load_seconds / 60:g} min to load the weights; requests arriving "
        "meanwhile are refused",
        "batch job: phases of 30-120 min keeping 2-4 long requests "
        f"({config.batch_prompt_tokens[0]}-{config.batch_prompt_tokens[1]} prompt, "
        f"{config.batch_max_tokens[0]}-{config.batch_max_tokens[1]} output tokens) in flight, "
        f"about {min(0.95, config.batch_busy_fraction * config.load):.0%} of the day; it "
        f"resubmits a failed request after {config.batch_retry_seconds:g} s",
        f"interactive users: {config.interactive_per_hour:g} requests/hour (Poisson), "
        f"{config.interactive_max_tokens[0]}-{config.interactive_max_tokens[1]} output tokens",
        f"{max(1, round(config.hangs_per_day * config.hours / 24))} real engine hang(s) at "
        "seeded random times, at least "
        f"{config.min_hang_spacing_seconds / 60:g} min apart; a hung engine freezes its counters, "
        "keeps accepting requests, and only a restart ends it",
        f"old way: a chat request ({config.check_max_tokens} tokens) every "
        f"{config.chat_check_interval / 60:g} min with a {config.chat_check_timeout:g} s "
        f"timeout, restart after {config.chat_check_failures} failures in a row; watchdogs on "
        f"{timers} min timers sending the same request ({config.timer_check_timeout:g} s "
        f"timeout, restart after {config.timer_check_failures} failures in a row) unless a "
        "'busy' flag file exists, which the batch job never creates; a watchdog restarting on "
        f"HTTP 500s in the last {config.error_window / 60:g} min after "
        f"ceil({config.error_pressure:g} / errors) checks of {config.error_check_interval:g} s "
        "(sooner as errors grow); none of them checks while the port is closed",
        f"new way: the exporter's real decision code every {config.exporter_interval:g} s "
        f"(idle test request: 1 token, {config.probe_timeout:g} s timeout, only when a read "
        f"shows no work and nothing completed, at most one per {config.probe_min_interval:g} s "
        f"while the server answers); stuck = two consecutive stalled polls; Prometheus scrape and "
        f"evaluation every {config.scrape_interval:g} s; Alertmanager group_wait "
        f"{config.group_wait:g} s; the restarter's real policy (cooldown "
        f"{config.cooldown / 60:g} min, budget {config.budget_max_restarts} per "
        f"{config.budget_window / 3600:g} h) and confirmation by two fresh reads "
        f"{config.confirm_gap:g} s apart",
        "requests failed / completed count the batch job's and users' requests, not test requests",
    ]
