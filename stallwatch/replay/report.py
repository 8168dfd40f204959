"""The replay's result as a table with its assumptions, or as plain JSON-ready data."""

from __future__ import annotations

from typing import Any

from stallwatch.replay.config import ReplayConfig
from stallwatch.replay.day import ReplayResult, WayResult
from stallwatch.replay.silences import SilenceOutcome, SilencePlan


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
        "restart_after_seconds": way.restart_after,
        "restarts_in_silence": way.restarts_in_silence,
        "test_requests_in_silence": way.test_requests_in_silence,
        "recovered_in_window": way.recovered_in_window,
        "exporter_recovered_stalls": way.exporter_recovered_stalls,
        "longest_recovered_stall_seconds": round(way.longest_recovered_stall_seconds, 1),
        "silences": [_silence_document(silence) for silence in way.silences],
        "degraded_minutes_noticed": round(way.degraded_minutes_noticed, 1),
        "false_degraded_alerts": way.false_degraded_alerts,
        "restarts_in_degraded": way.restarts_in_degraded,
        "degraded_alerts": [
            {
                "alertname": alert.alertname,
                "fired_at_seconds": round(alert.fired_at, 1),
                "resolved_at_seconds": None
                if alert.resolved_at is None
                else round(alert.resolved_at, 1),
            }
            for alert in way.degraded_alerts
        ],
    }


def _silence_document(silence: SilenceOutcome) -> dict[str, Any]:
    return {
        "started_at_seconds": round(silence.started_at, 1),
        "causes": list(silence.causes),
        "seconds": round(silence.seconds, 1),
        "held": silence.held,
        "restarted_after_seconds": None
        if silence.restarted_after is None
        else round(silence.restarted_after, 1),
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
        "degraded_periods": [
            {
                "start_seconds": round(period.start, 1),
                "end_seconds": round(period.end, 1),
                "mode": period.mode,
            }
            for period in result.degraded_periods
        ],
        "old": _way_document(result.old),
        "new": _way_document(result.new),
        "two_poll_rule": None if result.two_poll is None else _way_document(result.two_poll),
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


def _silences(way: WayResult) -> str:
    cut = sum(1 for silence in way.silences if silence.restarted_after is not None)
    return f"{len(way.silences)} ({cut} cut short)"


def _near_misses(way: WayResult) -> str:
    if way.restart_after is None:
        return "-"
    return f"{way.recovered_in_window} ({way.exporter_recovered_stalls})"


def _window(seconds: float) -> str:
    return f"{seconds / 60:g}m" if seconds >= 60 else f"{seconds:g}s"


def _planned(plan: SilencePlan | None, result: ReplayResult) -> str:
    if plan is None or not (plan.compiles or plan.compile_times or plan.weight_syncs):
        return "legitimate silences: none planned"
    held = sum(1 for sync in plan.weight_syncs if sync.held)
    syncs = len(plan.weight_syncs)
    config = result.config
    return (
        f"legitimate silences planned: {len(plan.compiles)} prompt shapes that compile when "
        f"first seen and {len(plan.compile_times)} other compiles "
        f"({config.compile_seconds[0]:g}-{config.compile_seconds[1]:g} s), {syncs} weight "
        f"sync(s) ({held} held), an autotune on every start after a restart"
    )


def _planned_degraded(result: ReplayResult) -> str:
    periods = result.degraded_periods
    if not periods:
        return "degraded periods: none planned"
    listed = ", ".join(f"{_clock(p.start)} {p.mode} {p.seconds / 60:.0f} min" for p in periods)
    return f"degraded periods planned (slow, not stuck): {listed}"


def format_result(result: ReplayResult, elapsed: float | None = None) -> str:
    """The old way, stallwatch and stallwatch with the two-poll rule side by side, and the
    model's assumptions, as text."""
    old, new = result.old, result.new
    two = result.two_poll or new
    ways = (old, new, two)

    def row(name: str, value: Any) -> tuple[str, ...]:
        return (name, *(str(value(way)) for way in ways))

    rows = [
        row("restarts", lambda w: w.restarts),
        row("  of a healthy server (false)", lambda w: w.false_restarts),
        row("    of them in a legitimate silence", lambda w: w.restarts_in_silence),
        row("  of a hung server (true)", lambda w: w.true_restarts),
        row("requests failed with HTTP 500", lambda w: w.failed_500),
        row("requests refused while the model loaded", lambda w: w.refused_while_loading),
        row("requests completed", lambda w: w.completed_requests),
        row("test requests sent", lambda w: w.test_requests),
        row("test requests sent to a busy server", lambda w: w.test_requests_to_busy_server),
        row("  sent during a legitimate silence", lambda w: w.test_requests_in_silence),
        row(
            "minutes the model was down (loading + hung)",
            lambda w: f"{w.minutes_down:.0f} ({w.minutes_loading:.0f} + {w.minutes_hung:.0f})",
        ),
        row("real hangs caught", lambda w: f"{w.hangs_caught} of {len(w.hangs)}"),
        row("time to catch each hang", _catch_times),
        row("legitimate silences (cut short by a restart)", _silences),
        row("near misses: recovered in the window (exporter)", _near_misses),
        row(
            f"degraded minutes noticed (of {result.degraded_minutes:.0f})",
            lambda w: "-" if w.restart_after is None else f"{w.degraded_minutes_noticed:.0f}",
        ),
        row(
            "false degraded alerts",
            lambda w: "-" if w.restart_after is None else w.false_degraded_alerts,
        ),
        row("restarts of a degraded server (caused)", lambda w: w.restarts_in_degraded),
    ]
    heads = (
        "",
        "old way",
        f"stallwatch (restart_after {_window(result.config.restart_after)})",
        "two-poll rule (restart_after 0)",
    )
    table = [heads, *rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(heads))]
    config = result.config
    lines = [
        f"stallwatch replay: {config.hours:g} h on one model server, seed {config.seed}, "
        f"batch load {config.load:g}",
        f"hangs at {', '.join(_clock(t) for t in result.hang_times) or 'none'}; "
        f"batch phases: {len(result.batch_phases)}",
        _planned(result.silence_plan, result),
        _planned_degraded(result),
        "",
    ]
    lines += [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True)).rstrip()
        for line in table
    ]
    if any(hang.kind == "running_at_0" for way in ways for hang in way.hangs):
        lines.append(
            "* hung idle: running and waiting frozen at 0, only a failing test request shows it"
        )
    by = ", ".join(f"{name} {count}" for name, count in sorted(old.restarts_by.items()))
    lines += ["", f"old way restarts by: {by or 'none'}"]
    for label, way in (("stallwatch", new), ("two-poll rule", two)):
        if way.restarter_skips:
            skips = ", ".join(f"{k} {v}" for k, v in sorted(way.restarter_skips.items()))
            lines.append(f"{label} restarter skips: {skips}")
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
        f"(idle test request: 1 token, {config.test_request_timeout:g} s timeout, only when a "
        f"read shows no work and nothing completed, at most one per "
        f"{config.test_request_min_interval:g} s "
        f"while the server answers); stuck = two consecutive stalled polls; Prometheus scrape and "
        f"evaluation every {config.scrape_interval:g} s; Alertmanager group_wait "
        f"{config.group_wait:g} s; the restarter's real policy (cooldown "
        f"{config.cooldown / 60:g} min, budget {config.budget_max_restarts} per "
        f"{config.budget_window / 3600:g} h) and confirmation by two fresh reads "
        f"{config.confirm_gap:g} s apart",
        "requests failed / completed count the batch job's and users' requests, not test requests",
        *silence_assumptions(config),
        *degraded_assumptions(config),
    ]


def degraded_assumptions(config: ReplayConfig) -> list[str]:
    """What the degraded periods are, and how they are counted."""
    if config.degraded_per_day <= 0:
        return ["no degraded periods (degraded_per_day 0)"]
    return [
        f"degraded periods (issue: slow, not stuck): {config.degraded_per_day:g} a day inside "
        f"batch phases, {config.degraded_seconds[0] / 60:g}-"
        f"{config.degraded_seconds[1] / 60:g} min, away from the hangs, in turn a throughput "
        f"cut to {config.degraded_factor:g} of the speed, admission only into an empty batch "
        f"(at the same speed) and a KV cache of {config.degraded_kv_fraction:g} of its size; "
        "a slow band outlives a restart",
        "degradation alerts as shipped (exporter defaults; LLMServerAdmissionStalled for 1m, "
        "LLMServerDegraded for 5m), to people only: noticed = minutes of the periods during "
        "which one fired; false = one that fired outside every period; caused = restarts of a "
        "server degraded and neither hung nor in a silence",
    ]


def silence_assumptions(config: ReplayConfig) -> list[str]:
    """What the legitimate silences are, and where each comes from."""
    if not config.legitimate_silences:
        return ["no legitimate silences (legitimate_silences off)"]
    holds = {
        "always": "each with a hold",
        "never": "none with a hold",
        "alternate": "every other one with a hold",
    }[config.weight_sync_holds]
    port = (
        "the port is open and /metrics answers with frozen counters meanwhile"
        if config.start_autotune_port_open
        else "vLLM opens its port only after them, so /metrics reads down (never restarted)"
    )
    return [
        "legitimate silences: the engine freezes (counters and gauges still, requests accepted "
        "and queued, so a read with work present is stalled) and goes on by itself unless "
        "restarted; a restart during one is a false restart",
        f"JIT compiles (ai-dynamo/dynamo#14735: 30-70 s mid-traffic): a prompt shape "
        f"({config.compile_shape_tokens}-token prompt-length bucket) not seen before compiles "
        f"with probability {config.compile_probability:g}, and {config.compiles_per_hour:g} "
        "compiles an hour of shapes the traffic does not draw strike while work is present; "
        f"{config.compile_seconds[0]:g}-{config.compile_seconds[1]:g} s each; the kernel cache "
        "survives a restart",
        f"weight syncs (ai-dynamo/dynamo#14703): every {config.weight_sync_every_hours:g} h, "
        f"{config.weight_sync_seconds[0] / 60:g}-{config.weight_sync_seconds[1] / 60:g} min, "
        f"{holds}: the trainer holds the target for "
        f"{config.weight_sync_hold_seconds / 60:g} min before it (the restarter's History.holds; "
        "the rules' hold clause "
        + ("on" if config.rules_hold_clause else "off")
        + ") and releases the hold when the sync ends; the old watchdogs know no holds",
        f"autotune and CUDA-graph capture (getainode/ainode#112: 206 s, 363 s) on every start "
        f"after a restart, {config.start_autotune_seconds[0]:g}-"
        f"{config.start_autotune_seconds[1]:g} s after the weights load; {port}",
        f"stallwatch restarts only a stall its restarter has seen last restart_after "
        f"({config.restart_after:g} s), judged again when the window ends (the restarter's "
        "alert plans, core/alert_plan.py); the two-poll rule column is the same day with "
        "restart_after 0",
    ]
