"""The fleet replay's result as a table with its assumptions, or as plain JSON-ready data."""

from __future__ import annotations

from statistics import median
from typing import Any

from stallwatch.replay.fleet import FleetResult
from stallwatch.replay.fleet_plan import FleetConfig
from stallwatch.replay.fleet_state import WayTally


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _catch(way: WayTally) -> str:
    times = way.catch_seconds()
    if not times:
        return "-"
    return f"median {_duration(median(times))}, max {_duration(times[-1])}"


def _missed(way: WayTally) -> str:
    missed = [hang for hang in way.hangs if hang.caught_after is None]
    busy = sum(1 for hang in missed if hang.running_at_hang)
    return f"{len(missed)} ({busy} hung while busy)"


def _silences(way: WayTally) -> str:
    return f"{len(way.silences)} ({way.restarts_in_silences} cut short)"


def _near_misses(way: WayTally) -> str:
    return "-" if way.restart_after is None else str(way.recovered_in_window)


def _rows(result: FleetResult) -> list[tuple[str, ...]]:
    ways = result.ways
    return [
        ("restarts of healthy servers", *(str(w.healthy_restarts) for w in ways)),
        ("  of them during a network blip", *(str(w.healthy_restarts_in_blips) for w in ways)),
        ("  of them in a legitimate silence", *(str(w.restarts_in_silences) for w in ways)),
        ("hangs caught", *(f"{w.hangs_caught} of {len(w.hangs)}" for w in ways)),
        ("hangs left to a person", *(_missed(w) for w in ways)),
        ("time to catch a hang", *(_catch(w) for w in ways)),
        ("server-hours hung", *(f"{w.minutes_hung / 60:.1f}" for w in ways)),
        ("requests failed", *(str(w.requests_failed) for w in ways)),
        ("legitimate silences (cut short by a restart)", *(_silences(w) for w in ways)),
        ("near misses: recovered in the window", *(_near_misses(w) for w in ways)),
        ("users' requests sent to hung servers", *(_stuck(w, False) for w in ways)),
        ("  same, without quarantine", *(_stuck(w, True) for w in ways)),
        ("healthy server-minutes out of rotation", *(_healthy_out(w) for w in ways)),
    ]


def _stuck(way: WayTally, without: bool) -> str:
    """Requests sent to hung servers and the request-minutes they waited there."""
    stuck = way.stuck
    if stuck is None:
        return "-"
    if without:
        count, seconds = stuck.requests_without_quarantine, stuck.request_seconds_without_quarantine
    else:
        count, seconds = stuck.requests, stuck.request_seconds
    return f"{count:.0f} ({seconds / 60:.0f} req-min)"


def _healthy_out(way: WayTally) -> str:
    stuck = way.stuck
    if stuck is None:
        return "-"
    return f"{stuck.healthy_minutes_out:.0f} ({stuck.quarantines} quarantines)"


def format_fleet(result: FleetResult, elapsed: float | None = None) -> str:
    """The five ways side by side, the faults of the plan, and the model's assumptions."""
    plan = result.plan
    config = plan.config
    window = config.restart_after
    heads = (
        "",
        f"stallwatch + fleet rules ({window / 60:g}m)" if window else "stallwatch + fleet rules",
        "same, two-poll rule (0)",
        "stallwatch, no fleet rules",
        "kubelet /health",
        "canary on idle",
    )
    rows = [heads, *_rows(result)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(heads))]
    independent = sum(1 for _, _, cause in plan.hangs if cause == "independent")
    bad_nodes = len({t for t, _, cause in plan.hangs if cause == "bad_node"})
    lines = [
        f"stallwatch replay: {config.servers} servers, {config.days:g} days, seed {config.seed}",
        f"faults planned: {independent} independent hangs, {bad_nodes} bad node(s) "
        f"({config.servers_per_node} servers each), {len(plan.blips)} network blip(s) "
        f"({len(plan.blips[0].servers) if plan.blips else 0} servers unreadable for "
        f"{config.blip_seconds[0] / 60:g}-{config.blip_seconds[1] / 60:g} min), "
        f"{len(plan.exporter_restarts)} exporter restart(s)",
        _planned_silences(result),
        "",
    ]
    lines += [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines += [
        "",
        f"breaker opened {result.breaker_openings} time(s) (stallwatch + fleet rules)",
    ]
    for way in result.ways[:3]:
        if way.skips:
            skips = ", ".join(f"{k} {v}" for k, v in way.skips.items())
            lines.append(f"{way.name} restarter skips: {skips}")
    lines += ["", "Assumptions:"]
    lines += [f"- {line}" for line in fleet_assumptions(config)]
    if elapsed is not None:
        lines += ["", f"(replayed in {elapsed:.1f} s)"]
    return "\n".join(lines)


def _planned_silences(result: FleetResult) -> str:
    silences = result.plan.silences
    if not silences:
        return "legitimate silences: none planned"
    compiles = sum(1 for silence in silences if silence.cause == "compile")
    syncs = [silence for silence in silences if silence.cause == "weight_sync"]
    held = sum(1 for silence in syncs if silence.held)
    return (
        f"legitimate silences planned: {compiles} compiles, {len(syncs)} server weight syncs "
        f"({held} held), an autotune on every start after a restart"
    )


def fleet_document(result: FleetResult) -> dict[str, Any]:
    """The result as plain JSON-ready data."""
    plan = result.plan
    config = plan.config
    return {
        "seed": config.seed,
        "servers": config.servers,
        "days": config.days,
        "blips": [
            {
                "start_seconds": round(b.start, 1),
                "seconds": round(b.end - b.start, 1),
                "servers": sorted(b.servers),
            }
            for b in plan.blips
        ],
        "exporter_restarts_seconds": [round(t, 1) for t in plan.exporter_restarts],
        "breaker_openings": result.breaker_openings,
        "ways": [
            {
                "name": way.name,
                "healthy_restarts": way.healthy_restarts,
                "healthy_restarts_in_blips": way.healthy_restarts_in_blips,
                "hung_restarts": way.hung_restarts,
                "hangs": [
                    {
                        "server": hang.server,
                        "started_at_seconds": round(hang.started_at, 1),
                        "cause": hang.cause,
                        "hung_while_busy": hang.running_at_hang,
                        "seconds_to_catch": None
                        if hang.caught_after is None
                        else round(hang.caught_after, 1),
                    }
                    for hang in way.hangs
                ],
                "requests_failed": way.requests_failed,
                "minutes_hung": round(way.minutes_hung, 1),
                "restarter_skips": way.skips,
                "restart_after_seconds": way.restart_after,
                "restarts_in_silences": way.restarts_in_silences,
                "recovered_in_window": way.recovered_in_window,
                "stuck_traffic": None
                if way.stuck is None
                else {
                    "requests": round(way.stuck.requests, 1),
                    "request_seconds": round(way.stuck.request_seconds, 1),
                    "requests_without_quarantine": round(way.stuck.requests_without_quarantine, 1),
                    "request_seconds_without_quarantine": round(
                        way.stuck.request_seconds_without_quarantine, 1
                    ),
                    "healthy_minutes_out_of_rotation": round(way.stuck.healthy_minutes_out, 1),
                    "quarantines": way.stuck.quarantines,
                },
                "silences": [
                    {
                        "server": silence.planned.server,
                        "started_at_seconds": round(silence.planned.start, 1),
                        "cause": silence.planned.cause,
                        "seconds": round(silence.planned.seconds, 1),
                        "held": silence.planned.held,
                        "with_work": silence.running_at_start,
                        "restarted_after_seconds": None
                        if silence.restarted_after is None
                        else round(silence.restarted_after, 1),
                    }
                    for silence in way.silences
                ],
            }
            for way in result.ways
        ],
        "assumptions": fleet_assumptions(config),
    }


def fleet_assumptions(config: FleetConfig) -> list[str]:
    """The fleet model's assumptions, stated next to its result."""
    return [
        "coarse per-server states (busy, idle, hung, loading, unreadable); each server alternates "
        f"busy and idle spells (mean {config.mean_busy_seconds / 60:g} and "
        f"{config.mean_idle_seconds / 60:g} min), {config.running_when_busy} requests in flight "
        f"when busy; requests arrive at {config.requests_per_minute_busy:g}/min busy and "
        f"{config.requests_per_minute_idle:g}/min idle, and each one arriving while the server "
        "is hung or loading fails, as do those in flight when it hangs or is restarted busy",
        f"independent engine hangs: {config.hangs_per_server_day:g} per server-day; a bad node "
        f"hangs all {config.servers_per_node} of its servers at once "
        f"({config.bad_nodes_per_week:g} per week); a restart ends a hang (the pod is rescheduled) "
        f"and loads the model for {config.restart_load_seconds / 60:g} min",
        f"network blip: {config.blips_per_day:g} per day, {config.blip_fraction:.0%} of the "
        "servers accept connections but do not answer /metrics (the exporter sees hung) for "
        f"{config.blip_seconds[0] / 60:g}-{config.blip_seconds[1] / 60:g} min; it touches only "
        "the monitoring path (clients, the node-local kubelet and the canary are unaffected)",
        f"exporter restart: {config.exporter_restarts_per_day:g} per day, down "
        f"{config.exporter_restart_seconds:g} s, every server's history lost and every alert "
        "resolved at once",
        "stallwatch: every server polled each "
        f"{config.exporter_interval:g} s at once, the poll's state derived from the true state "
        "(not from counters), alert rules, group_wait "
        f"{config.group_wait:g} s per alert and target, then the restarter's own alert plans "
        "(core/alert_plan.py: decide, decide_confirmed, the restart window and the quarantine) "
        "driven as the restarter drives them, with one fleet-wide History (holds included) and "
        "breaker_trip; confirmation and quarantine reads are modelled from the true state (a "
        "step counter that moves only while the server serves); a server out of rotation gets "
        "no new requests (its share goes to the others, which are assumed to have room); "
        "shipped defaults (mass stall > 50 % and >= 3, "
        "max_in_flight 1, fleet_window 2 per 15 min, cooldown "
        f"{config.cooldown / 60:g} min); without fleet rules = no mass-stall cap and no "
        "breaker; a paged operator resumes an open breaker after "
        f"{config.operator_resume_seconds / 60:g} min",
        f"kubelet probe: /health every {config.probe_period:g} s, timeout 1 s, failureThreshold "
        f"{config.probe_failure_threshold}; /health stays 200 on a hung engine (as on vLLM); "
        "ASSUMED: each check of a busy server times out with probability "
        f"{config.probe_busy_timeout_probability:g} (event loop busy); the startup probe holds "
        "liveness off while the model loads",
        f"canary on idle: every {config.canary_period:g} s a canary to each worker whose running "
        "gauge reads 0; a worker frozen while idle reads 0 and fails it (restarted, "
        f"failureThreshold {config.canary_failure_threshold}); one frozen while busy is never "
        "checked",
        "legitimate silences, frozen counters that go on by themselves (a restart during one "
        "is a false restart): JIT compiles (ai-dynamo/dynamo#14735) at "
        f"{config.compiles_per_server_hour:g} per server-hour, striking busy servers, "
        f"{config.compile_seconds[0]:g}-{config.compile_seconds[1]:g} s; weight syncs "
        f"(ai-dynamo/dynamo#14703) into the first {config.weight_sync_servers} servers at once, "
        f"every {config.weight_sync_every_hours:g} h, {config.weight_sync_seconds[0] / 60:g}-"
        f"{config.weight_sync_seconds[1] / 60:g} min, holds: {config.weight_sync_holds} (a "
        f"{config.weight_sync_hold_seconds / 60:g} min hold, released when the sync ends; the "
        "restart rules' hold clause "
        + ("on" if config.rules_hold_clause else "off")
        + "); a silent server with work reads stalled, an idle one fails its test request "
        "(and the canary); autotune and CUDA-graph capture (getainode/ainode#112) of "
        f"{config.start_autotune_seconds[0]:g}-{config.start_autotune_seconds[1]:g} s after "
        "the weights load on every start, port closed meanwhile (loading, for every way)",
        f"stallwatch's restart window: restart_after {config.restart_after:g} s (the alert "
        "plan's; an alert waiting in it is judged again at its end); the two-poll rule "
        "column is the same with restart_after 0; requests sent to hung servers count those "
        "arriving while a hung server is in rotation, and the request-minutes they wait there "
        "until the hang ends; 'without quarantine' is the same run with every hung server in "
        "rotation until its restart",
        "a hang no watchdog catches is found and restarted by a person after "
        f"{config.person_notices_seconds / 3600:g} h (not counted as caught); a hang that "
        "strikes a server already hung or loading is dropped, so the ways can count different "
        "numbers of hangs",
    ]
