"""The kill bounds of the actions: the kubernetes grace period's config checks, the stated
bound of a pod's stop, which Docker Engine events mean the engine had to SIGKILL, and what a
systemd unit's stop settings and journal say."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from stallwatch.common.config import ConfigError
from stallwatch.common.config_files import load_restarter_config
from stallwatch.common.kubernetes_config import KubernetesAction
from stallwatch.core.pod_rules import PodFacts
from stallwatch.restarter.kube.action import stop_bound
from stallwatch.restarter.stop_reports import (
    docker_detail,
    docker_kill_time,
    killed_after_the_grace,
    systemd_detail,
)


def load_with_action(tmp_path: Path, action: dict[str, Any]) -> Any:
    (tmp_path / "token").write_text("t\n")
    (tmp_path / "token").chmod(0o600)
    document = {
        "token_file": "token",
        "journal": "journal.sqlite",
        "targets": [{"name": "gpu1", "url": "http://127.0.0.1:8000", "action": action}],
    }
    path = tmp_path / "restarter.yml"
    path.write_text(yaml.safe_dump(document))
    return load_restarter_config(path)


POD = {"kind": "kubernetes", "namespace": "llm", "pod": "vllm-0"}


def test_a_grace_period_is_whole_seconds_sent_with_evict_or_delete(tmp_path: Path) -> None:
    """grace_period: 10 parses for evict and delete; absent, the pod's own applies (None)."""
    for mode in ("evict", "delete"):
        config = load_with_action(tmp_path, {**POD, "mode": mode, "grace_period": 10})
        assert config.targets[0].action == KubernetesAction(
            mode=mode, namespace="llm", pod="vllm-0", grace_period=10
        )
    assert load_with_action(tmp_path, POD).targets[0].action.grace_period is None


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ({**POD, "grace_period": 0}, "0 would force the deletion"),
        ({**POD, "grace_period": -5}, "expected an integer >= 1, got -5"),
        ({**POD, "grace_period": "30s"}, "expected an integer >= 1, got '30s'"),
        (
            {**POD, "mode": "rollout_restart", "grace_period": 30},
            "applies to mode evict or delete",
        ),
    ],
)
def test_a_grace_period_that_cannot_bound_the_kill_is_refused(
    tmp_path: Path, action: dict[str, Any], message: str
) -> None:
    """A forced deletion (0), a negative or non-integer period, or one a rollout restart would
    ignore: refused at load, naming the file and the field."""
    with pytest.raises(ConfigError) as raised:
        load_with_action(tmp_path, action)
    text = str(raised.value)
    assert "restarter.yml" in text
    assert "targets[0].action.grace_period" in text
    assert message in text


def pod(grace: int | None) -> PodFacts:
    return PodFacts("llm", "vllm-0", {}, None, (), termination_grace_period=grace)


@pytest.mark.parametrize(
    ("grace_period", "pod_grace", "stated"),
    [
        (None, 45, "45 s (terminationGracePeriodSeconds)"),
        (None, None, "30 s (terminationGracePeriodSeconds)"),
        (10, 45, "10 s (grace_period)"),
    ],
)
def test_the_pod_stop_bound_is_the_actions_grace_period_else_the_pods(
    grace_period: int | None, pod_grace: int | None, stated: str
) -> None:
    """The action's grace_period wins; else the pod's own; else the API's default of 30 s."""
    assert stop_bound(grace_period, pod(pod_grace)) == (
        f"SIGTERM, then the kubelet's SIGKILL after {stated}"
    )


def event(action: str, name: str = "vllm-a", **attributes: str) -> dict[str, Any]:
    return {
        "Type": "container",
        "Action": action,
        "Actor": {"ID": "4f2c" * 16, "Attributes": {"name": name, **attributes}},
        "time": 1_796_000_030,
        "timeNano": 1_796_000_030_250_000_000,
    }


@pytest.mark.parametrize(
    ("sent", "killed"),
    [
        (event("kill", signal="9"), True),  # Docker: one kill event per signal it sends
        (event("kill", signal="SIGKILL"), True),
        (event("kill", signal="15"), False),  # the SIGTERM that comes first
        (event("die", exitCode="137"), True),  # 128 + 9
        (event("died", containerExitCode="137"), True),  # as podman's events name it
        (event("die", exitCode="143"), False),  # ended by SIGTERM
        (event("die", exitCode="0"), False),
        (event("kill", name="other", signal="9"), False),  # another container
        ({**event("kill", signal="9"), "Type": "network"}, False),
        ({"Type": "container", "Action": "kill"}, False),
        ("not an event", False),
    ],
)
def test_which_engine_events_mean_it_had_to_kill(sent: object, killed: bool) -> None:
    """Only a SIGKILL of the named container (a kill with signal 9, or an exit code of 137)."""
    assert (docker_kill_time(sent, "vllm-a") is not None) is killed


def test_a_kill_time_is_the_events_own() -> None:
    """timeNano when the event has it, else its whole-second time."""
    sent = event("die", exitCode="137")
    assert docker_kill_time(sent, "vllm-a") == pytest.approx(1_796_000_030.25)
    del sent["timeNano"]
    assert docker_kill_time(sent, "vllm-a") == 1_796_000_030.0


def test_a_container_named_by_its_id_is_matched_by_id() -> None:
    """A container given by its full or short (12+) id matches the event's Actor.ID."""
    sent = event("kill", name="vllm-a", signal="9")
    assert docker_kill_time(sent, "4f2c" * 16) is not None
    assert docker_kill_time(sent, "4f2c4f2c4f2c") is not None
    assert docker_kill_time(sent, "4f2c") is None  # too short to be an id


@pytest.mark.parametrize(
    ("kills", "said"),
    [
        ([1030.2], True),  # t=30 after the restart began at 1000.0
        ([1029.0], True),  # a whole-second event time, a second early
        ([1000.1], False),  # at once: the image's stop signal is SIGKILL, not a grace run out
        ([990.0], False),  # before this restart
        ([], False),
    ],
)
def test_a_kill_counts_only_once_the_grace_has_run_out(kills: list[float], said: bool) -> None:
    """The detail says "ignored SIGTERM" only for a SIGKILL at (or after) the end of t."""
    assert killed_after_the_grace(kills, 1000.0, 30) is said


def test_the_docker_detail_states_t_and_says_when_it_killed() -> None:
    """The bound (t) always; the kill marker only when the engine had to kill."""
    assert docker_detail("vllm-a", 30, False) == "docker restarted vllm-a (t=30)"
    assert docker_detail("vllm-a", 30, True) == (
        "docker restarted vllm-a (t=30): it ignored SIGTERM: SIGKILL after 30 s"
    )
    assert not killed_after_the_grace([1000.0], 1000.0, 0)  # t=0: SIGKILL at once, by design


SHOWN = "TimeoutStopUSec=30s\nKillMode=control-group\nSendSIGKILL=yes\n"
KILLED = (
    "Stopping vLLM server gpu1...\nvllm@gpu1.service: State 'stop-sigterm' timed out. Killing.\n"
)


@pytest.mark.parametrize(
    ("show", "journal", "said"),
    [
        (SHOWN, "", "; its stop: SIGTERM to the control-group, SIGKILL after 30s"),
        (SHOWN, KILLED, ": it ignored SIGTERM: SIGKILL after 30s"),
        (
            "TimeoutStopUSec=1min 30s\nKillMode=mixed\nSendSIGKILL=yes",
            "",
            ("; its stop: SIGTERM to the mixed, SIGKILL after 1min 30s"),
        ),
        (SHOWN.replace("=yes", "=no"), "", "; its stop: SIGTERM, never SIGKILL (SendSIGKILL=no)"),
        (
            SHOWN.replace("30s", "infinity"),
            "",
            "; its stop: SIGTERM, never SIGKILL (TimeoutStopSec=infinity)",
        ),
        (
            SHOWN.replace("control-group", "process"),
            "",
            "; its stop: SIGTERM to the process, SIGKILL after 30s "
            "(KillMode=process leaves the unit's other processes running)",
        ),
        ("", "", ""),  # systemctl show gave nothing (no systemd here, or no right to ask)
        ("", KILLED, ": it ignored SIGTERM: SIGKILL after TimeoutStopSec"),
    ],
)
def test_the_systemd_detail_states_the_units_bound_or_the_kill(
    show: str, journal: str, said: str
) -> None:
    """The unit's journal line about a timed-out stop is the kill; else the bound from
    `systemctl show`, with what makes it no bound (SendSIGKILL=no, infinity) named."""
    assert systemd_detail("systemctl exited 0", show, journal) == "systemctl exited 0" + said
