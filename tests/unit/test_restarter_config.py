"""Restarter config: defaults, and errors that name the file and the field."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stallwatch.common.config import ConfigError, parse_duration
from stallwatch.common.config_files import load_restarter_config as load_config
from stallwatch.common.restart_limits import CooldownAuto
from stallwatch.common.restarter_config import (
    Breaker,
    CommandAction,
    DockerAction,
    HttpAction,
    MassStall,
    SystemdAction,
)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "restarter.yml"
TESTDATA = REPO / "tests" / "testdata" / "config"
GAP_WHY = (
    "(vLLM updates its counters once per engine step, and a loaded server's step can take most "
    "of a second: reads closer together can show no progress on a healthy server)"
)
# tests/testdata/config/restarter-invalid-NAME.yml -> the exact message after "FILE: ";
# {here} is the directory of the test data.
INVALID: dict[str, str] = {
    "action-kind": (
        "targets[0].action.kind: expected one of command, docker, systemd, http, kubernetes, "
        "got 'ssh'"
    ),
    "action-timeout-zero": "targets[0].action_timeout: must be longer than zero, got 0s",
    "argv-string": "targets[0].action.argv: expected a list of strings, got 'restart-vllm --now'",
    "budget-window-negative": (
        "targets[0].budget.window: expected a duration like 15s, 10m or 1h, got '-1h'"
    ),
    "budget-zero": "targets[0].budget.max_restarts: expected an integer >= 1, got 0",
    "confirm-gap-short": f"confirm.gap: must be at least 1s {GAP_WHY}, got 500ms",
    "confirm-gap-zero": f"confirm.gap: must be at least 1s {GAP_WHY}, got 0s",
    "confirm-timeout-zero": "confirm.timeout: must be longer than zero, got 0s",
    "cooldown-nan": "targets[0].cooldown: expected a duration like 15s, 10m or 1h, got nan",
    "cooldown-words": (
        "targets[0].cooldown: expected a duration like 15s, 10m or 1h, got '10 minutes'"
    ),
    "docker-stop-timeout": (
        "targets[0].action.stop_timeout: must be shorter than the target's action_timeout"
    ),
    "duplicate-key": "dry_run: line 4: duplicate key (first on line 3)",
    "duplicate-target": "targets[1].name: duplicate target name 'gpu1'",
    "fleet-window-inf": "fleet_window.window: expected a duration like 15s, 10m or 1h, got inf",
    "http-action-url": (
        "targets[0].action.url: expected an http:// or https:// URL with a host, "
        "got 'http://:9000/restart'"
    ),
    "journal-directory": "journal: {here} is a directory, not a journal file",
    "journal-parent-file": "journal: {here}/valid-restarter-full.yml is a file, not a directory",
    "mass-stall-percent": (
        "mass_stall.max_percent: expected a percentage from 1 to 100 (100: never)"
    ),
    "cooldown-auto-alone": "targets[0].cooldown_auto: only goes with cooldown: auto",
    "cooldown-auto-factor": (
        "targets[0].cooldown_auto.factor: expected a number from 1 to 100, got 0.5"
    ),
    "cooldown-auto-max": "targets[0].cooldown_auto.max: must not be shorter than floor",
    "listen": "listen: expected host:port, e.g. 127.0.0.1:9732, got 'localhost'",
    "metrics-url-ipv6": (
        "targets[0].metrics_url: not a valid URL (Invalid IPv6 URL): 'http://[::1/metrics'"
    ),
    "metrics-url-no-scheme": (
        "targets[0].metrics_url: expected an http:// or https:// URL with a host, "
        "got 'gpu1:8000/metrics'"
    ),
    "metrics-url-port": (
        "targets[0].metrics_url: the port must be a number from 1 to 65535, "
        "got 'http://127.0.0.1:99999/metrics'"
    ),
    "no-targets": "targets: expected a non-empty list",
    "no-token": "token_file: is required (or set insecure_no_auth: true)",
    "null-key": "confirm: line 4: key null is not a string (quote it if it is meant as one)",
    "tls-garbage": "tls_cert_file: {here}/garbage.crt holds no PEM certificate",
    "tls-half": "tls_cert_file: tls_cert_file and tls_key_file go together",
    "token-missing": "token_file: file not found: absent.token",
    "unknown-key": (
        "colour: unknown key (known keys: breaker, confirm, dry_run, fleet_window, "
        "insecure_no_auth, journal, kubernetes, listen, mass_stall, max_body_bytes, "
        "max_hold, max_in_flight, quarantine, restart_after, restart_alerts, rules, targets, "
        "tls_cert_file, tls_key_file, token_file)"
    ),
    "unknown-target-key": (
        "targets[0].cooldwn: unknown key (known keys: action, action_timeout, budget, cooldown, "
        "cooldown_auto, metrics_path, metrics_url, name, pool, restart_after, url)"
    ),
}


def write_config(tmp_path: Path, document: dict[str, Any]) -> Path:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    path = tmp_path / "restarter.yml"
    path.write_text(yaml.safe_dump(document))
    return path


def test_every_invalid_file_has_its_expected_message() -> None:
    """The table and the files agree: no bad config goes untested, no case lacks its file."""
    files = {p.name for p in TESTDATA.glob("restarter-invalid-*.yml")}
    assert files == {f"restarter-invalid-{name}.yml" for name in INVALID}


@pytest.mark.parametrize(("name", "message"), INVALID.items(), ids=list(INVALID))
def test_invalid_config_is_refused_with_its_exact_message(name: str, message: str) -> None:
    """Each bad file is refused with one line: the file, the field path and what was wrong."""
    path = TESTDATA / f"restarter-invalid-{name}.yml"
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    expected = message.replace("{here}", str(TESTDATA))
    assert str(raised.value) == f"{path}: {expected}"


@pytest.mark.parametrize("path", sorted(TESTDATA.glob("valid-restarter-*.yml")), ids=str)
def test_valid_files_load(path: Path) -> None:
    """Every valid-restarter-*.yml loads."""
    assert load_config(path).targets


def minimal(**changes: Any) -> dict[str, Any]:
    document: dict[str, Any] = {
        "token_file": "token",
        "journal": "journal.sqlite",
        "targets": [
            {
                "name": "gpu1",
                "metrics_url": "http://127.0.0.1:8000/metrics",
                "action": {"kind": "command", "argv": ["true"]},
            }
        ],
    }
    document.update(changes)
    return document


def test_defaults(tmp_path: Path) -> None:
    """A minimal config gets the documented defaults, and paths resolve next to the file."""
    config = load_config(write_config(tmp_path, minimal()))
    assert config.listen == "127.0.0.1:9733"
    assert config.token == "s3cret"
    assert config.restart_alerts == ("LLMServerStuck", "LLMServerUnresponsive", "LLMServerHung")
    assert config.confirm.idle_confirms == ("LLMServerUnresponsive",)
    assert config.confirm.hung_confirms == ("LLMServerHung",)
    assert config.journal == str(tmp_path / "journal.sqlite")
    assert config.confirm.gap == 5.0
    assert config.max_in_flight == 1
    assert (config.fleet_window.max_targets, config.fleet_window.window) == (2, 900.0)
    target = config.targets[0]
    assert (target.cooldown, target.action_timeout) == (600.0, 120.0)
    assert (target.budget.max_restarts, target.budget.window) == (3, 3600.0)
    assert target.action == CommandAction(argv=("true",))
    assert target.cooldown_auto is None
    assert config.mass_stall == MassStall(max_percent=50, min_stalled=3, window=4500.0)
    assert config.breaker == Breaker(on_mass_stall=True, failed_actions=3)


def test_cooldown_auto_parses_with_its_defaults_and_overrides(tmp_path: Path) -> None:
    """`cooldown: auto` keeps its floor in `cooldown`; `cooldown_auto` overrides its settings."""
    document = minimal()
    document["targets"][0]["cooldown"] = "auto"
    target = load_config(write_config(tmp_path, document)).targets[0]
    assert target.cooldown_auto == CooldownAuto(floor=600.0, factor=3.0, max=7200.0)
    assert target.cooldown == 600.0
    document["targets"][0]["cooldown_auto"] = {"floor": "2m", "factor": 2, "max": "1h"}
    target = load_config(write_config(tmp_path, document)).targets[0]
    assert target.cooldown_auto == CooldownAuto(floor=120.0, factor=2.0, max=3600.0)
    assert target.cooldown == 120.0


def test_every_action_kind_parses(tmp_path: Path) -> None:
    """The four action kinds parse into their dataclasses."""
    (tmp_path / "supervisor.token").write_text("t")
    (tmp_path / "supervisor.token").chmod(0o600)
    targets = [
        {
            "name": "a",
            "metrics_url": "http://h:1/metrics",
            "action": {"kind": "command", "argv": ["true", "y"]},
        },
        {
            "name": "b",
            "metrics_url": "http://h:2/metrics",
            "action": {"kind": "docker", "container": "vllm-b", "stop_timeout": "20s"},
        },
        {
            "name": "c",
            "metrics_url": "http://h:3/metrics",
            "action": {"kind": "systemd", "unit": "vllm.service"},
        },
        {
            "name": "d",
            "metrics_url": "https://h:4/metrics",
            "action": {
                "kind": "http",
                "url": "http://sup/restart",
                "bearer_token_file": "supervisor.token",
            },
        },
    ]
    config = load_config(write_config(tmp_path, minimal(targets=targets)))
    actions = [target.action for target in config.targets]
    assert actions[0] == CommandAction(argv=("true", "y"))
    assert actions[1] == DockerAction(container="vllm-b", stop_timeout=20.0)
    assert actions[2] == SystemdAction(unit="vllm.service")
    assert actions[3] == HttpAction(
        url="http://sup/restart", bearer_token_file=str(tmp_path / "supervisor.token")
    )


def test_insecure_mode_needs_no_token(tmp_path: Path) -> None:
    """`insecure_no_auth: true` is the only way to run without a token."""
    document = {k: v for k, v in minimal().items() if k != "token_file"}
    config = load_config(write_config(tmp_path, {**document, "insecure_no_auth": True}))
    assert config.token is None
    assert config.insecure_no_auth


def test_empty_token_file_is_refused(tmp_path: Path) -> None:
    """An empty token file would make every request authentic; it is an error."""
    path = write_config(tmp_path, minimal())
    (tmp_path / "token").write_text("\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == f"{path}: token_file: token is empty"


def test_not_yaml(tmp_path: Path) -> None:
    """A file that is not YAML is refused with its name."""
    path = tmp_path / "restarter.yml"
    path.write_text("targets: [\n")
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value).startswith(f"{path}: not valid YAML: line 2")


def test_example_config_is_valid(tmp_path: Path) -> None:
    """examples/restarter.yml loads (with its token file and action scripts present)."""
    shutil.copytree(EXAMPLE.parent / "actions", tmp_path / "actions")
    example = yaml.safe_load(EXAMPLE.read_text())
    example["token_file"] = "token"
    example["targets"] = [
        {**t, "action": {**t["action"], "bearer_token_file": "token"}}
        if t["action"].get("bearer_token_file")
        else t
        for t in example["targets"]
    ]
    config = load_config(write_config(tmp_path, example))
    assert {t.action.kind for t in config.targets} == {"command", "docker", "systemd", "http"}


@pytest.mark.parametrize(
    ("mode", "allowed"),
    [(0o600, True), (0o400, True), (0o640, True), (0o644, False), (0o660, False), (0o606, False)],
)
def test_token_file_mode(tmp_path: Path, mode: int, allowed: bool) -> None:
    """A token every user may read, or its group may write, is refused with its mode."""
    path = write_config(tmp_path, minimal())
    (tmp_path / "token").chmod(mode)
    if allowed:
        assert load_config(path).token == "s3cret"
        return
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == (
        f"{path}: token_file: token has mode {mode:04o}: a secret must not be readable by every "
        "user nor writable by its group (chmod 600, or 640 to share it with a group)"
    )


def test_http_action_token_file_mode_is_checked(tmp_path: Path) -> None:
    """The bearer token of an http action is a secret too: a world-readable one is refused."""
    (tmp_path / "supervisor.token").write_text("t")
    (tmp_path / "supervisor.token").chmod(0o644)
    action = {
        "kind": "http",
        "url": "http://127.0.0.1:9/r",
        "bearer_token_file": "supervisor.token",
    }
    document = minimal(targets=[{**minimal()["targets"][0], "action": action}])
    with pytest.raises(ConfigError, match=r"targets\[0\]\.action\.bearer_token_file: .* 0644"):
        load_config(write_config(tmp_path, document))


@pytest.mark.parametrize(("gap", "allowed"), [("999ms", False), ("1s", True), ("1m", True)])
def test_confirm_gap_bound(tmp_path: Path, gap: str, allowed: bool) -> None:
    """A confirmation gap of 1 s or more is accepted; anything shorter is refused."""
    path = write_config(tmp_path, minimal(confirm={"gap": gap}))
    if allowed:
        assert load_config(path).confirm.gap >= 1.0
    else:
        with pytest.raises(ConfigError, match=r"confirm\.gap: must be at least 1s"):
            load_config(path)


def test_durations_that_may_be_zero(tmp_path: Path) -> None:
    """A zero cooldown (none) and a zero docker stop timeout (kill at once) mean something."""
    target = {
        **minimal()["targets"][0],
        "cooldown": "0s",
        "action": {"kind": "docker", "container": "c", "stop_timeout": "0s"},
    }
    config = load_config(write_config(tmp_path, minimal(targets=[target])))
    assert config.targets[0].cooldown == 0.0
    assert config.targets[0].action == DockerAction(container="c", stop_timeout=0.0)


def test_journal_under_a_missing_directory_is_accepted(tmp_path: Path) -> None:
    """A journal whose directory does not exist yet is fine: the journal creates it."""
    config = load_config(write_config(tmp_path, minimal(journal="state/deep/journal.sqlite")))
    assert config.journal == str(tmp_path / "state" / "deep" / "journal.sqlite")


def test_journal_under_a_file_is_refused(tmp_path: Path) -> None:
    """A regular file where the journal's directory should be is named in the error."""
    (tmp_path / "state").write_text("not a directory")
    path = write_config(tmp_path, minimal(journal="state/journal.sqlite"))
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == f"{path}: journal: {tmp_path / 'state'} is a file, not a directory"


def test_valid_tls_pair_loads_and_a_mismatched_one_is_named(tmp_path: Path) -> None:
    """A real certificate and key load; a key of another certificate is refused, naming both."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("openssl is not installed")
    for name in ("a", "b"):
        subprocess.run(
            [openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
             "-subj", f"/CN={name}", "-keyout", str(tmp_path / f"{name}.key"),
             "-out", str(tmp_path / f"{name}.crt")],
            check=True, capture_output=True,
        )  # fmt: skip
    good = minimal(tls_cert_file="a.crt", tls_key_file="a.key")
    assert load_config(write_config(tmp_path, good)).tls_cert_file == str(tmp_path / "a.crt")
    path = write_config(tmp_path, minimal(tls_cert_file="a.crt", tls_key_file="b.key"))
    with pytest.raises(ConfigError) as raised:
        load_config(path)
    assert str(raised.value) == (
        f"{path}: tls_key_file: {tmp_path / 'b.key'} and {tmp_path / 'a.crt'} are not a usable "
        "pair (KEY_VALUES_MISMATCH)"
    )


def test_the_quarantine_summary_names_a_target_alone_in_its_pool(tmp_path: Path) -> None:
    """A target alone in its pool is said never to leave rotation; a pool of two is listed; a
    quarantine switched off says only that."""
    action = {"kind": "command", "argv": ["true"]}
    targets = [
        {"name": name, "url": f"http://127.0.0.1:{port}", "action": action, "pool": pool}
        for name, port, pool in (("a1", 8001, "llama"), ("a2", 8002, "llama"), ("b1", 8003, "qwen"))
    ]
    config = load_config(write_config(tmp_path, minimal(targets=targets)))
    assert config.quarantine_summary() == [
        "quarantine: on, at most 50 % of a pool out of rotation at once",
        "pool llama: a1, a2",
        "pool qwen: b1 alone, never taken out of rotation (give its replicas the same pool:)",
    ]
    off = load_config(write_config(tmp_path, minimal(quarantine={"enabled": False})))
    assert off.quarantine_summary() == ["quarantine: off"]


@pytest.mark.parametrize(
    "relative", ["examples/restarter.yml", "deploy/restarter-sim.yml", "deploy/restarter-vllm.yml"]
)
def test_shipped_confirmations_end_within_the_webhook_timeout(relative: str) -> None:
    """Each shipped restarter config keeps `confirm.gap + 2 x confirm.timeout` under the 10 s
    its docs promise for Alertmanager's webhook (the worst case: both reads time out)."""
    confirm = yaml.safe_load((REPO / relative).read_text())["confirm"]
    gap, timeout = parse_duration(confirm["gap"]), parse_duration(confirm["timeout"])
    assert gap + 2 * timeout < 10.0, confirm
