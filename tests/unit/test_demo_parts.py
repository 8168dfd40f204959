"""The demo's pure parts: reading the exporter, counting test requests, the restarter's action."""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.cli import build_parser
from stallwatch.demo.cli import run_restart_helper
from stallwatch.demo.observer import TargetView, parse_exporter_metrics, requests_sent_while_busy
from stallwatch.demo.supervisor import ask_supervisor_to_restart, restart_helper_argv


def test_test_requests_while_busy_counts_only_polls_with_work() -> None:
    """A test request counts against the server only when the poll that sent it read work."""

    def view(state: str, polls: int, sent: int) -> TargetView:
        return TargetView(state=state, polls=polls, test_requests=sent)

    idle = view("idle", 10, 3)
    assert requests_sent_while_busy(idle, view("idle", 11, 4)) == (1, 0)
    assert requests_sent_while_busy(idle, view("busy", 11, 4)) == (1, 1)
    # Two polls between reads: idle then busy may hide an idle poll that sent it.
    assert requests_sent_while_busy(idle, view("busy", 12, 4)) == (1, 0)
    busy = view("busy", 10, 3)
    assert requests_sent_while_busy(busy, view("stalled", 12, 5)) == (2, 2)
    assert requests_sent_while_busy(busy, view("busy", 11, 3)) == (0, 0)


def test_parse_exporter_metrics_reads_the_state_set() -> None:
    """The demo reads the current state and the counters per target from exporter /metrics."""
    text = "\n".join(
        [
            "# TYPE stallwatch_target_state gauge",
            *(
                f'stallwatch_target_state{{target="gpu-a",state="{state}"}} '
                f"{1 if state == 'busy' else 0}"
                for state in ("down", "busy", "stalled", "idle")
            ),
            "# TYPE stallwatch_test_requests counter",
            'stallwatch_test_requests_total{target="gpu-a"} 7',
            "# TYPE stallwatch_polls counter",
            'stallwatch_polls_total{target="gpu-a"} 42',
            "# TYPE stallwatch_target_up gauge",
            'stallwatch_target_up{target="gpu-a"} 1',
            "# TYPE stallwatch_requests_running gauge",
            'stallwatch_requests_running{target="gpu-a"} 4',
            "# TYPE stallwatch_build_info gauge",
            'stallwatch_build_info{version="0.1.0"} 1',
            "",
        ]
    )
    views = parse_exporter_metrics(text)
    assert views == {
        "gpu-a": TargetView(state="busy", polls=42, test_requests=7, up=True, running=4.0)
    }


def test_restart_helper_argv_is_a_stallwatch_subcommand() -> None:
    """The restarter's command action in the demo parses as `stallwatch demo restart-helper`."""
    argv = restart_helper_argv("http://127.0.0.1:9999", Path("/run/token"))
    assert argv[1:3] == ["-m", "stallwatch"]
    args = build_parser().parse_args(argv[3:])
    assert args.handler is run_restart_helper
    assert (args.supervisor_url, args.token_file) == ("http://127.0.0.1:9999", Path("/run/token"))


def test_plain_demo_runs_the_demo_not_the_helper() -> None:
    """`stallwatch demo --short` still runs the demo: the helper subcommand is optional."""
    args = build_parser().parse_args(["demo", "--short"])
    assert args.handler is not run_restart_helper
    assert args.short is True


def test_restart_helper_needs_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without STALLWATCH_TARGET the helper asks nothing and exits 2, naming the variable."""
    monkeypatch.delenv("STALLWATCH_TARGET", raising=False)
    token = tmp_path / "token"
    token.write_text("secret\n")
    assert ask_supervisor_to_restart("http://127.0.0.1:9", token) == 2
    assert "STALLWATCH_TARGET is not set" in capsys.readouterr().err
