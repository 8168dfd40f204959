"""examples/wiring/alertmanager.yml pasted into Debian's default alertmanager.yml as its comment
says (text, not YAML: the indentation is part of what is checked) passes `amtool check-config`,
and `amtool config routes test` sends the restart alerts to the restarter AND to people."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from tests.contract.chart import REPO, explain, run, tool

SNIPPET = REPO / "examples" / "wiring" / "alertmanager.yml"
DEBIAN = REPO / "tests" / "testdata" / "debian-alertmanager" / "alertmanager.yml"
START, END = "# stallwatch: from here ...", "# ... to here."
RESTARTER = "stallwatch-restarter"
PEOPLE = "team-X-mails"  # the top-level receiver of Debian's file


def marked_parts(text: str) -> list[list[str]]:
    """The snippet's marked parts, line by line as written (markers excluded)."""
    parts, current = [], None
    for line in text.splitlines():
        if line.strip() == START:
            current = []
        elif line.strip() == END:
            assert current is not None
            parts.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return parts


def pasted(tmp_path: Path) -> Path:
    """Debian's file with the routes pasted right under the top-level `  routes:` line and the
    receiver right under `receivers:`."""
    routes, receiver = marked_parts(SNIPPET.read_text())
    lines = DEBIAN.read_text().splitlines()
    out = []
    for line in lines:
        out.append(line)
        if line == "  routes:":
            out += routes
        elif line == "receivers:":
            out += receiver
    assert len(out) == len(lines) + len(routes) + len(receiver), "no place to paste"
    config = tmp_path / "alertmanager.yml"
    config.write_text("\n".join(out) + "\n")
    return config


def routes_test(config: Path, *labels: str) -> str:
    result = run(tool("amtool"), "config", "routes", "test", f"--config.file={config}", *labels)
    assert result.returncode == 0, explain(result)
    return result.stdout.strip()


def test_the_debian_file_is_the_packages_default() -> None:
    """The test data is Debian's conffile, unmodified (md5 as the package lists it)."""
    digest = hashlib.md5(DEBIAN.read_bytes(), usedforsecurity=False).hexdigest()
    assert digest == "2a24929f4650dcef3e68993d6740eab0"


def test_the_pasted_file_passes_amtool_check_config(tmp_path: Path) -> None:
    """Pasted as written, the config loads: the snippet's indentation fits Debian's file."""
    result = run(tool("amtool"), "check-config", str(pasted(tmp_path)))
    assert result.returncode == 0, explain(result)


@pytest.mark.parametrize("alertname", ["LLMServerStuck", "LLMServerUnresponsive", "LLMServerHung"])
def test_a_restart_alert_reaches_the_restarter_and_people(tmp_path: Path, alertname: str) -> None:
    """A restart alert that none of Debian's own routes match reaches the restarter and the
    top-level receiver (people), restarter first."""
    assert routes_test(pasted(tmp_path), f"alertname={alertname}", "target=gpu1") == (
        f"{RESTARTER},{PEOPLE}"
    )


def test_a_restart_alert_still_reaches_the_operators_own_routes(tmp_path: Path) -> None:
    """One that an own route matches (service foo1, critical) also reaches that route's pager."""
    receivers = routes_test(
        pasted(tmp_path), "alertname=LLMServerStuck", "service=foo1", "severity=critical"
    )
    assert receivers == f"{RESTARTER},{PEOPLE},team-X-pager"


@pytest.mark.parametrize(
    ("labels", "receivers"),
    [
        (("alertname=LLMServerDegraded",), PEOPLE),
        (("alertname=DiskFull", "service=database"), "team-DB-pager"),
        (("alertname=DiskFull", "service=files", "severity=critical"), "team-Y-pager"),
    ],
)
def test_other_alerts_are_routed_as_before(
    tmp_path: Path, labels: tuple[str, ...], receivers: str
) -> None:
    """Every other alert goes where Debian's file alone sends it, never to the restarter."""
    assert routes_test(pasted(tmp_path), *labels) == receivers
    assert routes_test(DEBIAN, *labels) == receivers


def test_without_the_people_route_the_restarter_would_be_alone(tmp_path: Path) -> None:
    """The people route matters: without it amtool shows the restarter alone (the fault the
    snippet once had)."""
    config = pasted(tmp_path)
    text = config.read_text()
    people = (
        "  - matchers:\n"
        '    - alertname=~"LLMServerStuck|LLMServerUnresponsive|LLMServerHung"\n'
        "    continue: true\n"
    )
    assert people in text
    config.write_text(text.replace(people, ""))
    assert routes_test(config, "alertname=LLMServerStuck") == RESTARTER
