"""The faults the simulator injects on request (`POST /sim/fault`): the checks and what each does.

`hang` stops the engine core (no steps, no aborts; /health still 200, /metrics frozen);
`hang_before_update` also leaves the running and waiting gauges at zero; `freeze` stops the whole
process as SIGSTOP does (the engines stop, and every endpoint but `/sim/*` accepts and never
answers); `api_hang` blocks only the API (an API server whose event loop is blocked: the engines go
on, no endpoint but `/sim/*` answers); `slow` lowers the engines' speed; `degrade` keeps the
engines working, badly (`mode`: `throughput` cuts their speed by `factor`, `admission` admits a
waiting request only into an empty batch, `preemption` shrinks the KV cache to `factor` of its
size, so that requests are preempted over and over); `recover` undoes those six; `engine_fault` is
an engine core whose busy loop raised: with fault tolerance on it aborts every request and waits
(`/fault_tolerance/status` says `unhealthy`, the gauges keep their last values) until `recover`,
without it it is a `crash`; `crash` fails every request and closes the socket; `restart` fails
every request and starts every counter over, optionally with the port closed for
`downtime_seconds`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from stallwatch.simulator.api import ENGINE_DEAD_MESSAGE, RequestFailed

if TYPE_CHECKING:
    from stallwatch.simulator.host import FaultHost

FAULTS = (
    "hang",
    "hang_before_update",
    "freeze",
    "api_hang",
    "engine_fault",
    "crash",
    "restart",
    "slow",
    "degrade",
    "recover",
)
DEGRADE_MODES = ("throughput", "admission", "preemption")
ABORTED_MESSAGE = "request aborted: the engine faulted and waits for recovery"
RESTART_MESSAGE = "cannot schedule new futures after shutdown"


@dataclass(frozen=True)
class Fault:
    """A checked fault request: its name and the option it needs, if any."""

    name: str
    tokens_per_second: float = 0.0  # `slow`
    downtime_seconds: float = 0.0  # `restart`
    mode: str = ""  # `degrade`
    factor: float = 1.0  # `degrade`: throughput and preemption


def parse_fault(name: str, options: Mapping[str, Any]) -> Fault:
    """The fault named `name` with its options; ValueError names a bad fault or option."""
    if name == "slow":
        speed = options.get("tokens_per_second")
        if not isinstance(speed, int | float) or isinstance(speed, bool) or speed <= 0:
            raise ValueError("fault 'slow' needs a positive number 'tokens_per_second'")
        return Fault(name, tokens_per_second=float(speed))
    if name == "degrade":
        mode = options.get("mode", "throughput")
        if mode not in DEGRADE_MODES:
            raise ValueError(f"fault 'degrade' needs a 'mode' of {', '.join(DEGRADE_MODES)}")
        factor = options.get("factor", 0.1)
        if not isinstance(factor, int | float) or isinstance(factor, bool) or not 0 < factor <= 1:
            raise ValueError("fault 'degrade' needs a 'factor' above 0 and at most 1")
        return Fault(name, mode=mode, factor=float(factor))
    if name == "restart":
        downtime = options.get("downtime_seconds", 0)
        if not isinstance(downtime, int | float) or isinstance(downtime, bool) or downtime < 0:
            raise ValueError("'downtime_seconds' must be a number >= 0")
        return Fault(name, downtime_seconds=float(downtime))
    if name not in FAULTS:
        raise ValueError(f"unknown fault {name!r}; known faults: {', '.join(FAULTS)}")
    return Fault(name)


def parse_fault_body(body: object) -> Fault:
    """The fault a `POST /sim/fault` JSON body asks for; ValueError says what is wrong with it."""
    if not isinstance(body, dict) or not isinstance(body.get("fault"), str):
        raise ValueError('body must be a JSON object with a string "fault"')
    return parse_fault(body["fault"], body)


def inject(server: FaultHost, fault: Fault) -> str:
    """Do what `fault` does to `server`; returns a short description."""
    now = server.clock()
    if fault.name == "hang":
        server.hung = True
    elif fault.name == "hang_before_update":
        server.hung = True
        for engine in server.engines:
            engine.freeze_gauges_at_zero()
    elif fault.name == "freeze":
        server.freeze()
    elif fault.name == "api_hang":
        server.api_answers.clear()
    elif fault.name == "slow":
        for engine in server.engines:
            engine.tokens_per_second = fault.tokens_per_second
    elif fault.name == "degrade":
        for engine in server.engines:
            if fault.mode == "throughput":
                engine.tokens_per_second = server.config.tokens_per_second * fault.factor
            elif fault.mode == "admission":
                engine.admitting = False
            else:
                engine.kv_cache_tokens = max(1, int(server.config.kv_cache_tokens * fault.factor))
        described = f"degrade:{fault.mode}"
        server.fault = described
        return described
    elif fault.name == "engine_fault" and server.config.fault_tolerance:
        server.hung = True  # the busy loop waits for a `retry`; its last stats stay published
        server.engine_status = "unhealthy"
        server.fail_all(RequestFailed(500, "InternalServerError", ABORTED_MESSAGE))
    elif fault.name == "recover":
        server.hung = False
        server.engine_status = "healthy"
        server.thaw()
        for engine in server.engines:
            engine.tokens_per_second = server.config.tokens_per_second
            engine.admitting = True
            engine.kv_cache_tokens = server.config.kv_cache_tokens
            engine.next_step_at = now
        server.fault = None
        return "recovered"
    elif fault.name in ("crash", "engine_fault"):
        server.dead = True
        server.fail_all(RequestFailed(500, "InternalServerError", ENGINE_DEAD_MESSAGE))
        server.in_background(server.close_socket())
    elif fault.name == "restart":
        server.fail_all(RequestFailed(500, "InternalServerError", RESTART_MESSAGE))
        server.boot()
        if fault.downtime_seconds > 0:
            server.down_until = now + fault.downtime_seconds
            server.in_background(server.close_port_for(fault.downtime_seconds))
        return "restarted"
    server.fault = fault.name
    return fault.name
