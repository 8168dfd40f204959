"""Helpers for the engine table tests: read a fixture, edit one sample, classify a pair."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from stallwatch.core.classify import State, Verdict, classify
from stallwatch.core.reading import Reading, parse_reading
from tests.support.real_payloads import REPO_ROOT

ENGINES = REPO_ROOT / "tests" / "testdata" / "engines"


def payload(name: str) -> str:
    """One engine fixture; a missing file is an error, never a skip."""
    path: Path = ENGINES / name
    if not path.is_file():
        raise FileNotFoundError(f"engine fixture {path} is missing (see its README.md)")
    return path.read_text(encoding="utf-8")


def set_sample(text: str, sample: str, value: str) -> str:
    """Replace the value of the one line that starts with `sample` (name plus labels)."""
    pattern = re.compile(rf"^({re.escape(sample)}) \S+$", re.MULTILINE)
    edited, count = pattern.subn(lambda m: f"{m.group(1)} {value}", text)
    assert count == 1, f"expected one sample {sample}, found {count}"
    return edited


def drop(text: str, prefix: str) -> str:
    return "\n".join(line for line in text.splitlines() if not line.startswith(prefix)) + "\n"


def read(text: str, at: float, kind: str = "auto", marker: str | None = None) -> Reading:
    reading = parse_reading(text, taken_at=at, kind=kind)
    return reading if marker is None else Reading(**{**reading.__dict__, "start_marker": marker})


@dataclass(frozen=True)
class Case:
    name: str
    previous: str | None
    current: str
    state: State
    test_request_needed: bool = False
    restart: bool = False
    reason: str = ""
    gap: float = 15.0


def judge(case: Case, kind: str = "auto") -> Verdict:
    previous = read(case.previous, 0.0, kind) if case.previous is not None else None
    return classify(previous, read(case.current, case.gap, kind))


def check(case: Case, kind: str = "auto") -> None:
    verdict = judge(case, kind)
    assert verdict.state == case.state, verdict.reason
    assert verdict.test_request_needed == case.test_request_needed, verdict.reason
    assert verdict.restart_detected == case.restart, verdict.reason
    assert case.reason in verdict.reason
