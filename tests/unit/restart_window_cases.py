"""The restart window as a table of cases: the window's tests and the skip-reason census use it."""

from __future__ import annotations

from dataclasses import replace

from stallwatch.common.restarter_config import CommandAction, Target
from stallwatch.core.confirmation import Confirmation
from stallwatch.core.policy import CONFIRMED, Decision
from stallwatch.core.reading import Reading, parse_reading
from stallwatch.core.restart_window import RestartWindow
from tests.support.real_payloads import real_payload

NOW = 1_800_000_000.0
KEY = "f1@2026-11-30T05:29:50Z"
TARGET = Target(
    name="gpu1",
    metrics_url="http://gpu1:8000/metrics",
    action=CommandAction(argv=("true",)),
    restart_after=300.0,
)
NO_WINDOW_TARGET = replace(TARGET, restart_after=0.0)


def reading(name: str, at: float) -> Reading:
    return parse_reading(real_payload(name), taken_at=at)


# Two reads of one busy real server, a few steps apart: counters moved between them.
BUSY_1 = reading("vllm-0.32.0-cpu-busy-1.txt", NOW - 200)
BUSY_2 = reading("vllm-0.32.0-cpu-busy-2.txt", NOW)
FROZEN_LATER = reading("vllm-0.32.0-cpu-busy-1.txt", NOW)
CONFIRMED_STALL = Decision("restart", CONFIRMED, "stalled: work present, nothing moved")
DRY_RUN = Decision("skip", "dry_run", "would restart: stalled")
PROGRESS = Decision("skip", "not_confirmed_progress", "busy: moved")
COOLDOWN = Decision("skip", "cooldown", "restarted 5 s ago")


def stall(read: Reading | None) -> Confirmation:
    return Confirmation(True, None, "stalled", reading=read)


def opened(ago: float, first: Reading | None = BUSY_1) -> RestartWindow:
    return RestartWindow(KEY, "gpu1", NOW - ago, 300.0, first)


WINDOW_CASES: list[
    tuple[str, Target, Decision, RestartWindow | None, Confirmation, str, str]
] = [
    # (case, target, decision, open window, confirmation, action, reason)
    ("no window configured: the old two-poll rule acts at once", NO_WINDOW_TARGET,
     CONFIRMED_STALL, None, stall(FROZEN_LATER), "restart", CONFIRMED),
    ("first confirmation opens the window and waits", TARGET, CONFIRMED_STALL, None,
     stall(FROZEN_LATER), "skip", "restart_window"),
    ("inside the window, nothing moved: still waits", TARGET, CONFIRMED_STALL, opened(100),
     stall(FROZEN_LATER), "skip", "restart_window"),
    ("window over and nothing moved since its first read: restart", TARGET, CONFIRMED_STALL,
     opened(300), stall(FROZEN_LATER), "restart", CONFIRMED),
    ("window over but counters moved since its first read: a new window", TARGET,
     CONFIRMED_STALL, opened(300), stall(BUSY_2), "skip", "restart_window"),
    ("hung: no readings to compare, the window's end acts on the end reads", TARGET,
     CONFIRMED_STALL, opened(301, first=None), stall(None), "restart", CONFIRMED),
    ("dry run waits out the window too", TARGET, DRY_RUN, None, stall(FROZEN_LATER), "skip",
     "restart_window"),
    ("dry run at the window's end says what it would do", TARGET, DRY_RUN, opened(300),
     stall(FROZEN_LATER), "skip", "dry_run"),
    ("progress while the window is open: recovered, not restarted", TARGET, PROGRESS,
     opened(100), Confirmation(False, "progress", "busy"), "skip", "recovered_in_window"),
    ("progress with no window open is the confirmation's refusal", TARGET, PROGRESS, None,
     Confirmation(False, "progress", "busy"), "skip", "not_confirmed_progress"),
    ("another refusal keeps the window open", TARGET, COOLDOWN, opened(100),
     Confirmation(True, None, "stalled"), "skip", "cooldown"),
]  # fmt: skip
