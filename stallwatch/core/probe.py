"""Settle an idle server's verdict once its test request has answered or failed: pure code.

The exporter and the replay send the request and take the fresh read; this decides what they mean.
"""

from __future__ import annotations

from dataclasses import dataclass

from stallwatch.core.classify import State, Verdict, classify, with_probe_result
from stallwatch.core.reading import Reading


@dataclass(frozen=True)
class SettledProbe:
    """The poll's final verdict, the reading it stands on, and whether the test request failed."""

    verdict: Verdict
    reading: Reading
    probes_failed: int


def settle_probe(
    verdict: Verdict,
    reading: Reading,
    *,
    answered: bool,
    detail: str,
    reread: Reading | None = None,
) -> SettledProbe:
    """The verdict of a poll whose idle test request answered (or not).

    `reading` is the read that asked for the test request; `reread` is the fresh read taken
    after a failed one (None when none was taken or it failed). A reread that shows the engine
    moving wins over the failed request: work may have arrived while the request waited, and a
    busy server is never unresponsive. A new process in the reread is not such proof.
    """
    if answered:
        return SettledProbe(with_probe_result(verdict, True, detail), reading, 0)
    if reread is not None and reread.has_engines:
        recheck = classify(reading, reread)
        if recheck.progressed and recheck.state != State.RESTARTED:
            return SettledProbe(recheck, reread, 1)
    return SettledProbe(with_probe_result(verdict, False, detail), reading, 1)
