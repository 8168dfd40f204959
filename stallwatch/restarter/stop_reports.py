"""What a restart's stop did, for the result's detail: pure readings of a Docker engine's events
and of a systemd unit's stop settings and journal.

When an action saw the stop escalate, its detail says KILL_MARKER ("ignored SIGTERM: SIGKILL
after N s"); otherwise it states the bound that applied.
"""

from __future__ import annotations

import signal

KILL_MARKER = "ignored SIGTERM: SIGKILL after"
_SIGKILL_NAMES = frozenset({str(int(signal.SIGKILL)), "SIGKILL", "KILL"})
# A process that SIGKILL ended exits with 128 + 9, as the engines report it.
_KILLED_EXIT_CODE = str(128 + int(signal.SIGKILL))
# What systemd logs when a stop ran out of TimeoutStopSec and it sends SIGKILL
# ("State 'stop-sigterm' timed out. Killing.").
SYSTEMD_KILL_LINE = "timed out. Killing"
SYSTEMD_STOP_PROPERTIES = ("TimeoutStopUSec", "KillMode", "SendSIGKILL")


def docker_kill_time(event: object, container: str) -> float | None:
    """When one Docker Engine API event says `container` was SIGKILLed (Unix seconds), else
    None. Docker logs a `kill` event per signal it sends (its `signal` attribute); Docker and
    podman both log a `die` event with the exit code (137: SIGKILL)."""
    if not isinstance(event, dict) or event.get("Type", "container") != "container":
        return None
    actor = event.get("Actor")
    if not isinstance(actor, dict):
        return None
    attributes = actor.get("Attributes")
    attributes = attributes if isinstance(attributes, dict) else {}
    identity = str(actor.get("ID", ""))
    # The action may name the container by its id, or by a short id (12 characters or more).
    by_id = identity == container or (len(container) >= 12 and identity.startswith(container))
    if attributes.get("name") != container and not by_id:
        return None
    action = event.get("Action", event.get("status"))
    if action == "kill":
        killed = str(attributes.get("signal", "")) in _SIGKILL_NAMES
    elif action in ("die", "died"):
        code = attributes.get("exitCode", attributes.get("containerExitCode"))
        killed = str(code) == _KILLED_EXIT_CODE
    else:
        killed = False
    at = event.get("timeNano", event.get("time"))
    if not killed or isinstance(at, bool) or not isinstance(at, int | float):
        return None
    return at / 1e9 if "timeNano" in event else float(at)


def killed_after_the_grace(kill_times: list[float], started: float, stop_timeout: int) -> bool:
    """Whether a SIGKILL came once the grace had run out: not one at once (an image whose stop
    signal is SIGKILL), nor one from before the restart. A second of slack for whole-second
    event times."""
    return stop_timeout > 0 and any(at >= started + stop_timeout - 1.0 for at in kill_times)


def docker_detail(container: str, stop_timeout: int, killed: bool) -> str:
    detail = f"docker restarted {container} (t={stop_timeout})"
    return detail + (f": it {KILL_MARKER} {stop_timeout} s" if killed else "")


def systemd_properties(show_output: str) -> dict[str, str]:
    """`systemctl show -p ...` output (KEY=VALUE lines) as a mapping."""
    pairs = (line.split("=", 1) for line in show_output.splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def systemd_detail(detail: str, show_output: str, journal_text: str) -> str:
    """A systemd restart's detail: the kill when the unit's journal shows systemd had to send
    it, else the stop's bound as `systemctl show` gives it (nothing when it gave nothing)."""
    properties = systemd_properties(show_output)
    timeout = properties.get("TimeoutStopUSec", "")
    mode = properties.get("KillMode", "")
    if SYSTEMD_KILL_LINE in journal_text:
        return f"{detail}: it {KILL_MARKER} {timeout or 'TimeoutStopSec'}"
    if not timeout:
        return detail
    if properties.get("SendSIGKILL") == "no":
        return f"{detail}; its stop: SIGTERM, never SIGKILL (SendSIGKILL=no)"
    if timeout == "infinity":
        return f"{detail}; its stop: SIGTERM, never SIGKILL (TimeoutStopSec=infinity)"
    bound = f"{detail}; its stop: SIGTERM to the {mode or 'control-group'}, SIGKILL after {timeout}"
    if mode in ("process", "none"):
        bound += f" (KillMode={mode} leaves the unit's other processes running)"
    return bound
