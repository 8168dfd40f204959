"""What routers are told: the agent-send line and the Host header to a target, the verdict to an
agent-check reply and to `GET /routable`'s status, text and JSON (core/routing_answers.py)."""

from __future__ import annotations

import pytest

from stallwatch.core.quarantine import Quarantine, Verdict, verdict
from stallwatch.core.routing_answers import (
    AGENT_DESCRIPTION_CHARS,
    agent_reply,
    agent_target,
    host_target,
    routable_answer,
    valid_target_name,
)

KNOWN = {"gpu-a", "gpu-b", "llm/vllm-0"}
OUT = Verdict("gpu-a", False, "stalled", "work present and no progress signal moved", 1000.0)
IN = Verdict("gpu-a", True, "in_rotation", "in rotation")


@pytest.mark.parametrize(
    ("line", "target"),
    [
        ("gpu-a", "gpu-a"),  # the whole line
        ("gpu-a\n", "gpu-a"),
        ("gpu-a\r\n", "gpu-a"),
        ("  gpu-a  ", "gpu-a"),
        ("llm/gpu-b", "gpu-b"),  # backend/server: the server
        ("a/b/gpu-b", "gpu-b"),  # the part after the last /
        ("llm/vllm-0", "llm/vllm-0"),  # a known name with a / is taken whole
        ("be/unknown-server", "unknown-server"),
        ("no-such", "no-such"),
        ("", ""),
        ("llm/", ""),
    ],
)
def test_an_agent_send_line_names_a_target(line: str, target: str) -> None:
    """The whole line when it is a known target or has no `/`, else what follows the last `/`."""
    assert agent_target(line, KNOWN) == target


def test_a_routable_target_is_answered_up_which_reverts_a_down() -> None:
    """Routable: exactly `up` (never silence; never `ready`, which undoes an operator's MAINT)."""
    assert agent_reply(IN) == "up\n"


def test_a_quarantined_target_is_answered_down_with_its_reason() -> None:
    """Out of rotation: `down` and a `#` description naming stallwatch, the reason and detail."""
    reply = agent_reply(OUT)
    assert reply == "down #stallwatch: stalled: work present and no progress signal moved\n"


def test_an_unknown_target_is_answered_up() -> None:
    """A target nobody quarantined (unknown to the restarter) is routable: fail-open."""
    assert agent_reply(verdict("never-heard-of", {})) == "up\n"


def test_the_agent_reply_is_one_short_ascii_line_whatever_the_detail() -> None:
    """Newlines, non-ASCII and a long detail cannot break the one-line reply HAProxy reads."""
    hostile = Verdict("gpu-a", False, "hung", "line one\nline two\r" + "é" * 10 + "x" * 1000, 1.0)
    reply = agent_reply(hostile)
    assert reply.endswith("\n")
    assert reply.count("\n") == 1
    assert "\r" not in reply
    assert reply.isascii()
    assert reply.startswith("down #stallwatch: hung: line one line two ??????????")
    assert len(reply) <= len("down #") + AGENT_DESCRIPTION_CHARS + 1


@pytest.mark.parametrize(
    ("host", "target"),
    [
        ("gpu-a", "gpu-a"),
        ("gpu-a:9733", "gpu-a"),
        ("127.0.0.1:9733", "127.0.0.1"),
        ("[::1]:9733", "::1"),
        ("[::1]", "::1"),
        ("gpu-a:notaport", "gpu-a:notaport"),
        ("", ""),
    ],
)
def test_a_host_header_names_a_target_without_its_port(host: str, target: str) -> None:
    """Envoy's per-endpoint `hostname` arrives as the Host header, maybe with a port."""
    assert host_target(host) == target


@pytest.mark.parametrize(
    ("name", "valid"),
    [("gpu-a", True), ("", False), ("x" * 253, True), ("x" * 254, False), ("a\nb", False)],
)
def test_a_target_name_must_be_printable_and_short(name: str, valid: bool) -> None:
    """Empty, over 253 characters or with control characters is no target's name."""
    assert valid_target_name(name) is valid


def test_routable_is_200_with_one_word() -> None:
    """A known routable target: 200 and `routable`."""
    answer = routable_answer(IN, known=True, now=2000.0)
    assert (answer.status, answer.text) == (200, "routable\n")
    assert answer.document["routable"] is True
    assert answer.document["reason"] == "in_rotation"


def test_an_unknown_target_is_200_and_says_unknown() -> None:
    """Fail-open: an unknown target is routable, and the answer says it is unknown."""
    answer = routable_answer(verdict("nope", {}), known=False, now=2000.0)
    assert answer.status == 200
    assert answer.text == "routable: unknown target 'nope' (fail-open)\n"
    assert answer.document["known"] is False
    assert answer.document["reason"] == "unknown"


def test_out_of_rotation_is_503_with_reason_detail_and_time_out() -> None:
    """A quarantined target: 503, one line with the reason and detail, and how long it is out."""
    answer = routable_answer(OUT, known=True, now=1042.0)
    assert answer.status == 503
    assert answer.text == (
        "not routable: stalled: work present and no progress signal moved "
        "(out of rotation for 42 s)\n"
    )
    assert answer.document == {
        "target": "gpu-a",
        "known": True,
        "routable": False,
        "reason": "stalled",
        "detail": "work present and no progress signal moved",
        "since": 1000.0,
        "out_for_seconds": 42.0,
    }


def test_the_verdict_of_a_quarantine_reaches_both_answers() -> None:
    """From the quarantine core to the router: a hung quarantine is `down` and a 503."""
    quarantine = Quarantine("gpu-b", "default", 10.0, "hung", "no answer for 3 s", 10.0)
    out = verdict("gpu-b", {"gpu-b": quarantine})
    assert agent_reply(out) == "down #stallwatch: hung: no answer for 3 s\n"
    assert routable_answer(out, known=True, now=15.0).status == 503
