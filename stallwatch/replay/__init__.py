"""A deterministic, virtual-time replay of one day on one model server: the old way vs stallwatch.

Pure model, no I/O and no real clock. One simulated server (the simulator's own engine model,
`simulator.engine.Engine`, driven by a virtual clock) serves the same traffic twice:

- the **old way** (`old_way`): watchdogs that send real requests and restart on failures, plus
  one that restarts on HTTP 500s;
- the **new way** (`stallwatch_way`): stallwatch, calling the project's own pure steps for
  every decision: the exporter's poll plan (`core/poll_plan.py`, the same steps the exporter
  drives) and `TargetHistory` on `Reading`s of the engine's counters, the restart alerts'
  condition (`restart_alerts`), and the restarter's
  `decide` then `decide_confirmed` on two fresh reads (`judge_confirmation`). Only the timing of
  Prometheus and Alertmanager is modelled (scrape, evaluation, group_wait, group_interval,
  repeat_interval).

The day holds legitimate silences as production does (`silences`): JIT compiles of unseen
prompt shapes, an RL trainer's weight syncs (some held), an autotune on every start. The
engine freezes and goes on by itself; a restart during one is a false restart. Stallwatch's
way runs twice, with its restart window (`restart_after`, the restarter's own alert plans) and
with the old two-poll rule (`restart_after` 0), so the report puts both side by side.

The engine advances `tokens_per_step` tokens per request per step (time scaled to match), so
that a whole day runs in about a second a way; what the decisions read (which counters moved between
two reads 15 s apart) is unchanged by that.

Modules: `config` (the settings), `clock` (the virtual clock), `server` (the simulated server),
`traffic` (the seeded plan and its replay), `silences` (the seeded legitimate silences),
`old_way`, `stallwatch_way`, `day` (running the three ways), `report` (table and JSON), `cli`
(`stallwatch replay`).

With `--servers N --days D` the same package replays a fleet with correlated faults (network
blips, exporter restarts, a bad node) and legitimate silences, watched five ways: `fleet_plan`
(settings and the seeded plan), `fleet_state` (each way's coarse per-server state and tally),
`fleet_stallwatch` (stallwatch with its fleet rules, the same with the two-poll rule, and
without the fleet rules, on the project's own policy steps), `fleet_probes` (a kubelet
`/health` probe, a canary-on-idle watchdog), `fleet` (all five on one plan), `fleet_report`.
"""

from stallwatch.replay.config import ReplayConfig
from stallwatch.replay.day import HangOutcome, ReplayResult, WayResult, run_replay
from stallwatch.replay.server import engine_reading
from stallwatch.replay.traffic import plan_traffic

__all__ = [
    "HangOutcome",
    "ReplayConfig",
    "ReplayResult",
    "WayResult",
    "engine_reading",
    "plan_traffic",
    "run_replay",
]
