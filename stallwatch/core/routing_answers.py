"""What routers are answered about a target's routing verdict: `GET /routable` (a status, one
line of text, or a JSON document) and the HAProxy agent-check reply line; and which target an
agent-send line or a `Host` header names.

Pure: the verdict comes from the quarantine core; the edges only carry the words. Unknown
targets are routable (routers fail open, and so does every answer here).
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any

from stallwatch.core.quarantine import Verdict

ROUTABLE_STATUS = 200
NOT_ROUTABLE_STATUS = 503
# The longest description an agent reply carries after `down #`: HAProxy shows it on its stats
# page and in its log, and reads the reply into a small buffer.
AGENT_DESCRIPTION_CHARS = 200
# The longest target name /routable takes (a DNS name's limit; a Host header is one).
TARGET_NAME_CHARS = 253

# The agent's two words. `down` sets the server's operating state DOWN ("DOWN (agent)" on the
# stats page) and only `up` reverts it. Never `drain`, `maint` or `ready`: those change the
# server's administrative state, and `ready` would also cancel a DRAIN or MAINT an operator
# set through HAProxy's CLI for maintenance.
AGENT_UP = "up"
AGENT_DOWN = "down"


def agent_target(line: str, known: Container[str]) -> str:
    """The target an agent-send line names: the whole line (without its line ending and outer
    blanks) when it is a known target or holds no `/`, else the part after the last `/`
    (`backend/server`, the usual agent-send, names the server)."""
    name = line.rstrip("\r\n").strip()
    if name in known or "/" not in name:
        return name
    return name.rsplit("/", 1)[1]


def _one_ascii_line(text: str, limit: int) -> str:
    """`text` as printable ASCII on one line (anything else becomes `?`), at most `limit`."""
    cleaned = "".join(c if " " <= c <= "~" else "?" for c in " ".join(text.split()))
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 3] + "..."


def agent_reply(verdict: Verdict) -> str:
    """The agent-check reply to `verdict`, newline-terminated: `up` for a routable target (it
    reverts an earlier `down`), `down #stallwatch: REASON: DETAIL` for one out of rotation."""
    if verdict.routable:
        return AGENT_UP + "\n"
    description = _one_ascii_line(
        f"stallwatch: {verdict.reason}: {verdict.detail}", AGENT_DESCRIPTION_CHARS
    )
    return f"{AGENT_DOWN} #{description}\n"


def host_target(host: str) -> str:
    """The target a `Host` header names: the header without its port (`gpu-a:9733` is
    `gpu-a`, `[::1]:80` is `::1`)."""
    host = host.strip()
    if host.startswith("["):
        inside, bracket, _ = host[1:].partition("]")
        return inside if bracket else host
    name, colon, port = host.rpartition(":")
    if colon and port.isdigit() and ":" not in name:
        return name
    return host


def valid_target_name(name: str) -> bool:
    """Whether `name` can be a target's name at all: not empty, printable, not too long."""
    return 0 < len(name) <= TARGET_NAME_CHARS and name.isprintable()


@dataclass(frozen=True)
class RoutableAnswer:
    """`GET /routable`'s answer: the status, one line of text, and the JSON document."""

    status: int
    text: str
    document: dict[str, Any]


def routable_answer(verdict: Verdict, *, known: bool, now: float) -> RoutableAnswer:
    """200 for a routable target (an unknown one too: fail-open), 503 with the reason and
    detail for one out of rotation."""
    out_for = None if verdict.since is None else max(0.0, now - verdict.since)
    document: dict[str, Any] = {
        "target": verdict.target,
        "known": known,
        "routable": verdict.routable,
        "reason": verdict.reason if known or not verdict.routable else "unknown",
        "detail": verdict.detail,
        "since": verdict.since,
        "out_for_seconds": out_for,
    }
    if verdict.routable:
        if not known:
            document["detail"] = "unknown target: routable (fail-open)"
            return RoutableAnswer(
                ROUTABLE_STATUS,
                f"routable: unknown target {verdict.target!r} (fail-open)\n",
                document,
            )
        return RoutableAnswer(ROUTABLE_STATUS, "routable\n", document)
    detail = _one_ascii_line(verdict.detail, 1000)
    for_text = "" if out_for is None else f" (out of rotation for {out_for:.0f} s)"
    return RoutableAnswer(
        NOT_ROUTABLE_STATUS, f"not routable: {verdict.reason}: {detail}{for_text}\n", document
    )
