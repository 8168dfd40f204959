"""docker-compose.yml, the Dockerfile, deploy/ and the Deploy page (docs/deploy.md) agree.

The compose file is checked by Debian's docker-compose 1.29 (`config` needs no Docker engine),
and every structural assertion reads its normalised output (anchors merged, variables
interpolated), which is what `docker-compose up` would use.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from stallwatch.common.config_files import load_exporter_config, load_restarter_config
from stallwatch.common.restarter_config import DockerAction

REPO = Path(__file__).resolve().parents[2]
COMPOSE_FILE = REPO / "docker-compose.yml"
SERVICES = ("simulator", "vllm", "exporter", "restarter", "prometheus", "alertmanager", "grafana")
CONTAINER_PORTS = {
    "simulator": 8000,
    "vllm": 8000,
    "exporter": 9732,
    "restarter": 9733,
    "prometheus": 9090,
    "alertmanager": 9093,
    "grafana": 3000,
}
HEALTH_PATHS = {
    "simulator": "/health",
    "vllm": "/health",
    "exporter": "/-/healthy",
    "restarter": "/-/healthy",
    "prometheus": "/-/healthy",
    "alertmanager": "/-/healthy",
    "grafana": "/api/health",
}
# Endpoints that take a request slot of a model server: a healthcheck must never call them.
COMPLETION_ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/completions", "/generate")
RESTART_POLICIES = ("always", "unless-stopped", "on-failure")
TOKEN_MOUNT = "/etc/stallwatch/restarter-token"
TOKEN_SOURCE = REPO / "deploy" / "secrets" / "restarter-token"
VARIANTS = ("sim", "vllm")
# The environment variables the compose file reads; cleared so the host's values cannot leak in.
COMPOSE_VARIABLES = (
    "COMPOSE_PROFILES",
    "STALLWATCH_TARGETS",
    "STALLWATCH_VERSION",
    "VLLM_IMAGE",
    "VLLM_MODEL",
    "VLLM_SERVED_MODEL_NAME",
    "HF_TOKEN",
    "DOCKER_GID",
    "STALLWATCH_TOKEN_GID",
    "GRAFANA_ADMIN_USER",
    "GRAFANA_ADMIN_PASSWORD",
)


def docker_compose() -> str:
    binary = shutil.which("docker-compose")
    if binary is None:
        pytest.fail(
            "docker-compose is not on PATH; `make test` installs Debian's docker-compose package "
            "(apt-get install --no-install-recommends docker-compose)"
        )
    return binary


def run_compose(
    compose_file: Path, args: list[str], env_file: Path, **variables: str
) -> subprocess.CompletedProcess[str]:
    """`docker-compose -f FILE --env-file EMPTY ARGS` with only `variables` set for the file."""
    env = {key: value for key, value in os.environ.items() if key not in COMPOSE_VARIABLES}
    env.update(variables)
    return subprocess.run(
        [docker_compose(), "-f", str(compose_file), "--env-file", str(env_file), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=compose_file.parent,
        timeout=60,
        check=False,
    )


@pytest.fixture(scope="module")
def empty_env_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An empty --env-file, so a developer's own .env cannot change what is tested."""
    path = tmp_path_factory.mktemp("compose") / "empty.env"
    path.write_text("")
    return path


@pytest.fixture(scope="module")
def normalised(empty_env_file: Path) -> dict[str, dict[str, Any]]:
    """`docker-compose config` output per STALLWATCH_TARGETS variant (with the gpu profile)."""
    documents = {}
    for variant in VARIANTS:
        result = run_compose(
            COMPOSE_FILE,
            ["config"],
            empty_env_file,
            COMPOSE_PROFILES="gpu",
            STALLWATCH_TARGETS=variant,
        )
        assert result.returncode == 0, result.stderr
        documents[variant] = yaml.safe_load(result.stdout)
    return documents


def services(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = document["services"]
    return result


@dataclass(frozen=True)
class Mount:
    source: str
    target: str
    mode: str

    @property
    def is_named_volume(self) -> bool:
        return not self.source.startswith("/")


def mounts(service: dict[str, Any]) -> list[Mount]:
    result = []
    for entry in service.get("volumes", []):
        source, target, *mode = entry.split(":")
        result.append(Mount(source, target, mode[0] if mode else "rw"))
    return result


def mount_at(service: dict[str, Any], target: str) -> Mount:
    for mount in mounts(service):
        if mount.target == target:
            return mount
    raise AssertionError(f"nothing mounted at {target}: {service.get('volumes')}")


def published(service: dict[str, Any]) -> list[tuple[str, int, int]]:
    """(host address, host port, container port) of every published port."""
    result = []
    for entry in service.get("ports", []):
        address, host, container = entry.removesuffix("/tcp").split(":")
        result.append((address, int(host), int(container)))
    return result


def healthcheck_text(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    return " ".join(test) if isinstance(test, list) else str(test)


# --- docker-compose itself --------------------------------------------------------------------


def test_docker_compose_accepts_the_file_with_the_default_profile(empty_env_file: Path) -> None:
    """`docker-compose config -q` (1.29) accepts docker-compose.yml as a user runs it."""
    result = run_compose(COMPOSE_FILE, ["config", "-q"], empty_env_file)
    assert result.returncode == 0, result.stderr


def test_docker_compose_accepts_the_file_with_the_gpu_profile(empty_env_file: Path) -> None:
    """`COMPOSE_PROFILES=gpu STALLWATCH_TARGETS=vllm docker-compose config -q` succeeds."""
    result = run_compose(
        COMPOSE_FILE,
        ["config", "-q"],
        empty_env_file,
        COMPOSE_PROFILES="gpu",
        STALLWATCH_TARGETS="vllm",
    )
    assert result.returncode == 0, result.stderr


def test_docker_compose_rejects_an_unknown_key(empty_env_file: Path, tmp_path: Path) -> None:
    """The validation is real: the same file with one misspelt key is refused."""
    broken = tmp_path / "docker-compose.yml"
    text = COMPOSE_FILE.read_text()
    assert "    healthcheck:\n" in text
    broken.write_text(text.replace("    healthcheck:\n", "    healthchek:\n", 1))
    result = run_compose(broken, ["config", "-q"], empty_env_file)
    assert result.returncode != 0
    assert "healthchek" in result.stderr


# --- services, health, restart ----------------------------------------------------------------


def test_the_stack_has_exactly_the_expected_services(normalised: dict[str, Any]) -> None:
    """simulator, vllm, exporter, restarter, prometheus, alertmanager and grafana, no more."""
    assert sorted(services(normalised["sim"])) == sorted(SERVICES)


def test_every_service_has_a_healthcheck_on_its_cheap_endpoint(normalised: dict[str, Any]) -> None:
    """Each healthcheck calls the service's own health endpoint on its own container port."""
    for name, service in services(normalised["sim"]).items():
        assert "healthcheck" in service, f"{name} has no healthcheck"
        text = healthcheck_text(service)
        expected = f"127.0.0.1:{CONTAINER_PORTS[name]}{HEALTH_PATHS[name]}"
        assert expected in text, f"{name}: {text!r} does not check {expected}"


def test_healthcheck_arguments_hold_no_whitespace(normalised: dict[str, Any]) -> None:
    """A CMD healthcheck's arguments have no spaces: podman's Docker API splits them at spaces."""
    for name, service in services(normalised["vllm"]).items():
        test = service["healthcheck"]["test"]
        if test[0] == "CMD":
            spaced = [argument for argument in test[1:] if re.search(r"\s", argument)]
            assert not spaced, f"{name}'s healthcheck would be split by podman: {spaced}"


def test_no_healthcheck_sends_a_completion(normalised: dict[str, Any]) -> None:
    """A healthcheck must not load what it guards: no completion endpoint anywhere, vllm first."""
    vllm = healthcheck_text(services(normalised["vllm"])["vllm"])
    assert "/health" in vllm or "/v1/models" in vllm
    for name, service in services(normalised["vllm"]).items():
        text = healthcheck_text(service)
        for endpoint in COMPLETION_ENDPOINTS:
            assert endpoint not in text, f"{name}'s healthcheck calls {endpoint}"


def test_every_service_has_a_restart_policy(normalised: dict[str, Any]) -> None:
    """Every container comes back when its process exits."""
    for name, service in services(normalised["sim"]).items():
        assert service.get("restart") in RESTART_POLICIES, f"{name}: {service.get('restart')}"


def test_the_vllm_service_restarts_only_when_its_process_exits(normalised: dict[str, Any]) -> None:
    """vllm: `unless-stopped`, no deploy.restart_policy; the restarter is what restarts it."""
    vllm = services(normalised["vllm"])["vllm"]
    assert vllm["restart"] == "unless-stopped"
    assert "restart_policy" not in vllm.get("deploy", {})
    assert not any("autoheal" in key for key in vllm.get("labels", {}))


# --- the model servers ------------------------------------------------------------------------


def test_vllm_is_the_official_image_on_a_gpu_in_the_gpu_profile(normalised: dict[str, Any]) -> None:
    """vllm: vllm/vllm-openai, profile gpu, an nvidia device reservation, a served model name."""
    vllm = services(normalised["vllm"])["vllm"]
    assert vllm["image"].startswith("vllm/vllm-openai:")
    assert vllm["profiles"] == ["gpu"]
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    assert isinstance(device.get("count", 1), int) or device.get("count") == "all"
    command = vllm["command"]
    assert command[command.index("--served-model-name") + 1]
    assert command[command.index("--port") + 1] == "8000"


def test_the_vllm_model_comes_from_vllm_model(empty_env_file: Path) -> None:
    """Setting VLLM_MODEL changes the model vllm serves; without it there is a default."""
    result = run_compose(
        COMPOSE_FILE,
        ["config"],
        empty_env_file,
        COMPOSE_PROFILES="gpu",
        VLLM_MODEL="example-org/example-model",
    )
    assert result.returncode == 0, result.stderr
    command = yaml.safe_load(result.stdout)["services"]["vllm"]["command"]
    assert command[command.index("--model") + 1] == "example-org/example-model"


def test_the_simulator_runs_in_the_default_profile(normalised: dict[str, Any]) -> None:
    """The simulator has no profile and runs `stallwatch sim --host 0.0.0.0 --port 8000`."""
    simulator = services(normalised["sim"])["simulator"]
    assert "profiles" not in simulator
    assert simulator["command"] == ["sim", "--host", "0.0.0.0", "--port", "8000"]


def test_every_other_service_runs_without_a_profile(normalised: dict[str, Any]) -> None:
    """Only vllm needs a GPU; everything else starts with a plain `docker-compose up`."""
    for name, service in services(normalised["sim"]).items():
        if name != "vllm":
            assert "profiles" not in service, name


# --- ports ------------------------------------------------------------------------------------


def test_each_service_publishes_its_port_on_loopback_without_clashes(
    normalised: dict[str, Any],
) -> None:
    """Container ports as documented, host ports distinct, all bound to 127.0.0.1."""
    host_ports: list[int] = []
    for name, service in services(normalised["sim"]).items():
        ports = published(service)
        assert [container for _, _, container in ports] == [CONTAINER_PORTS[name]], name
        for address, host, _ in ports:
            assert address == "127.0.0.1", f"{name} publishes on {address}"
            host_ports.append(host)
    assert len(host_ports) == len(set(host_ports)), host_ports


def test_prometheus_and_alertmanager_reach_the_services_by_name(
    normalised: dict[str, Any],
) -> None:
    """prometheus.yml and alertmanager.yml use the compose service names and container ports."""
    stack = services(normalised["sim"])
    prometheus = yaml.safe_load((REPO / "prometheus" / "prometheus.yml").read_text())
    addresses = [
        address
        for job in prometheus["scrape_configs"]
        for static in job["static_configs"]
        for address in static["targets"]
    ]
    addresses += prometheus["alerting"]["alertmanagers"][0]["static_configs"][0]["targets"]
    alertmanager = yaml.safe_load((REPO / "alertmanager" / "alertmanager.yml").read_text())
    webhooks = [
        webhook["url"]
        for receiver in alertmanager["receivers"]
        for webhook in receiver.get("webhook_configs", [])
    ]
    addresses += [re.sub(r"^https?://([^/]+).*$", r"\1", url) for url in webhooks]
    for address in addresses:
        host, port = address.rsplit(":", 1)
        if host == "localhost":
            continue
        assert host in stack, f"{address}: no service {host}"
        assert int(port) == CONTAINER_PORTS[host], address


# --- volumes and mounts -----------------------------------------------------------------------


def test_state_lives_in_named_volumes(normalised: dict[str, Any]) -> None:
    """Prometheus data, Alertmanager data and the restarter's journal survive a re-creation."""
    stack = services(normalised["sim"])
    volumes = normalised["sim"]["volumes"]
    for service, target in (
        ("prometheus", "/prometheus"),
        ("alertmanager", "/alertmanager"),
        ("restarter", "/var/lib/stallwatch"),
        ("grafana", "/var/lib/grafana"),
    ):
        mount = mount_at(stack[service], target)
        assert mount.is_named_volume, f"{service}:{target} is a bind mount"
        assert mount.source in volumes


def test_the_project_configs_are_mounted_read_only(normalised: dict[str, Any]) -> None:
    """Prometheus, Alertmanager and Grafana read the repository's own files, read-only."""
    stack = services(normalised["sim"])
    for service, target, source in (
        ("prometheus", "/etc/prometheus", REPO / "prometheus"),
        ("alertmanager", "/etc/alertmanager/alertmanager.yml", REPO / "alertmanager"),
        ("grafana", "/etc/grafana/provisioning", REPO / "grafana" / "provisioning"),
        ("grafana", "/etc/grafana/dashboards", REPO / "grafana" / "dashboards"),
    ):
        mount = mount_at(stack[service], target)
        assert mount.mode == "ro", f"{service}:{target}"
        assert Path(mount.source).resolve().is_relative_to(source.resolve()), mount


def test_every_bind_mount_source_exists_except_the_token(normalised: dict[str, Any]) -> None:
    """Docker would create a missing source as an empty directory; only the token is the user's."""
    for variant, document in normalised.items():
        for name, service in services(document).items():
            for mount in mounts(service):
                if mount.is_named_volume or not mount.source.startswith(str(REPO)):
                    continue
                if Path(mount.source) == TOKEN_SOURCE:
                    continue
                assert Path(mount.source).exists(), f"{variant} {name}: {mount.source}"


def test_the_token_is_shared_read_only_and_never_committed(normalised: dict[str, Any]) -> None:
    """Alertmanager and the restarter mount the same token file where their configs expect it."""
    stack = services(normalised["sim"])
    alertmanager = yaml.safe_load((REPO / "alertmanager" / "alertmanager.yml").read_text())
    credentials = {
        webhook["http_config"]["authorization"]["credentials_file"]
        for receiver in alertmanager["receivers"]
        for webhook in receiver.get("webhook_configs", [])
    }
    assert credentials == {TOKEN_MOUNT}
    for service in ("alertmanager", "restarter"):
        mount = mount_at(stack[service], TOKEN_MOUNT)
        assert Path(mount.source) == TOKEN_SOURCE
        assert mount.mode == "ro"
    ignored = (TOKEN_SOURCE.parent / ".gitignore").read_text().split()
    assert TOKEN_SOURCE.name in ignored


def test_the_restarter_can_reach_the_docker_socket(normalised: dict[str, Any]) -> None:
    """The socket is mounted into the restarter, and no other service gets it."""
    for name, service in services(normalised["sim"]).items():
        sockets = [m for m in mounts(service) if m.source == "/var/run/docker.sock"]
        if name == "restarter":
            assert [m.target for m in sockets] == ["/var/run/docker.sock"]
            assert service.get("group_add"), "the non-root restarter needs the socket's group"
        else:
            assert not sockets, f"{name} mounts the Docker socket"


def test_grafana_provisioning_points_at_the_mounted_dashboards(normalised: dict[str, Any]) -> None:
    """The dashboard provider's path is where compose mounts grafana/dashboards."""
    provider = yaml.safe_load(
        (REPO / "grafana" / "provisioning" / "dashboards" / "stallwatch.yml").read_text()
    )
    (entry,) = provider["providers"]
    mount = mount_at(services(normalised["sim"])["grafana"], entry["options"]["path"])
    assert Path(mount.source) == REPO / "grafana" / "dashboards"
    datasource = yaml.safe_load(
        (REPO / "grafana" / "provisioning" / "datasources" / "prometheus.yml").read_text()
    )
    (source,) = datasource["datasources"]
    assert source["uid"] == "prometheus"
    assert source["url"] == f"http://prometheus:{CONTAINER_PORTS['prometheus']}"


# --- deploy/ configs --------------------------------------------------------------------------


def config_source(service: dict[str, Any], target: str) -> Path:
    return Path(mount_at(service, target).source)


@pytest.mark.parametrize("variant", VARIANTS)
def test_deploy_configs_load_and_agree_with_the_stack(
    normalised: dict[str, Any], variant: str, tmp_path: Path
) -> None:
    """Each variant's exporter and restarter configs load and name the same reachable targets."""
    stack = services(normalised[variant])
    exporter_file = config_source(stack["exporter"], "/etc/stallwatch/exporter.yml")
    restarter_file = config_source(stack["restarter"], "/etc/stallwatch/restarter.yml")
    assert exporter_file == REPO / "deploy" / f"exporter-{variant}.yml"
    assert restarter_file == REPO / "deploy" / f"restarter-{variant}.yml"

    exporter = load_exporter_config(exporter_file)
    assert (exporter.listen_host, exporter.listen_port) == ("0.0.0.0", CONTAINER_PORTS["exporter"])
    # The restarter reads its token relative to its config, as in the container.
    etc = tmp_path / "etc-stallwatch"
    etc.mkdir()
    shutil.copy(restarter_file, etc / "restarter.yml")
    (etc / Path(TOKEN_MOUNT).name).write_text("0123456789abcdef\n")
    (etc / Path(TOKEN_MOUNT).name).chmod(0o640)  # as deploy/secrets/README.md says
    restarter = load_restarter_config(etc / "restarter.yml")
    assert restarter.listen == f"0.0.0.0:{CONTAINER_PORTS['restarter']}"
    journal_mount = mount_at(stack["restarter"], "/var/lib/stallwatch")
    assert Path(restarter.journal).parent == Path(journal_mount.target)

    assert [t.name for t in exporter.targets] == [t.name for t in restarter.targets]
    container_names = {service.get("container_name"): name for name, service in stack.items()}
    for watched, restarted in zip(exporter.targets, restarter.targets, strict=True):
        host, port = watched.url.removeprefix("http://").split(":")
        assert host in stack, watched.url
        assert int(port) == CONTAINER_PORTS[host], watched.url
        assert restarted.metrics_url == watched.metrics_url
        assert isinstance(restarted.action, DockerAction)
        assert container_names.get(restarted.action.container) == host
        assert mount_at(stack["restarter"], restarted.action.socket)


# --- Dockerfile -------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    text = (REPO / "Dockerfile").read_text().replace("\\\n", " ")
    result = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, rest = stripped.partition(" ")
            result.append((keyword.upper(), rest.strip()))
    return result


def test_the_image_is_slim_non_root_and_runs_stallwatch(normalised: dict[str, Any]) -> None:
    """python:3.11-slim, a non-root USER, entrypoint `stallwatch`, the OCI labels, and a
    HEALTHCHECK asking a component's own /-/healthy."""
    instructions = dockerfile_instructions()
    # The base is a build argument (the stack tier builds on a local Debian base); users get
    # python:3.11-slim unless they pass --build-arg BASE_IMAGE=...
    assert instructions[0] == ("ARG", "BASE_IMAGE=python:3.11-slim")
    bases = [rest.split()[0] for keyword, rest in instructions if keyword == "FROM"]
    assert bases
    assert all(base == "${BASE_IMAGE}" for base in bases)
    users = [rest for keyword, rest in instructions if keyword == "USER"]
    assert users
    assert users[-1].split(":")[0] not in ("root", "0")
    assert ("ENTRYPOINT", '["stallwatch"]') in instructions
    labels = " ".join(rest for keyword, rest in instructions if keyword == "LABEL")
    for label in ("version", "revision", "source", "licenses"):
        assert f"org.opencontainers.image.{label}=" in labels
    (check,) = [rest for keyword, rest in instructions if keyword == "HEALTHCHECK"]
    assert "STALLWATCH_HEALTHCHECK_URL" in check
    assert "STALLWATCH_HEALTHCHECK_URL=http://127.0.0.1:9732/-/healthy" in " ".join(
        rest for keyword, rest in instructions if keyword == "ENV"
    )
    for name in ("simulator", "exporter", "restarter"):
        service = services(normalised["sim"])[name]
        assert service["build"]["context"] == str(REPO)
        assert service["image"].startswith("stallwatch:")


def test_the_build_context_holds_everything_the_dockerfile_copies() -> None:
    """Every COPY source exists and is let through by the allow-list .dockerignore."""
    allowed = {
        line.removeprefix("!").rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    }
    copies = [
        rest.split()
        for keyword, rest in dockerfile_instructions()
        if keyword == "COPY" and "--from" not in rest
    ]
    assert copies
    for *sources, _destination in copies:
        for source in sources:
            assert (REPO / source).exists(), source
            assert source.rstrip("/") in allowed, f"{source} is excluded by .dockerignore"
    packages = set(re.findall(r'"(\w+)\*"', (REPO / "pyproject.toml").read_text()))
    assert packages <= allowed, f"packages missing from the image: {packages - allowed}"


# --- the Deploy page, docs/deploy.md ----------------------------------------------------------


def deploy_doc_section() -> str:
    text = (REPO / "docs" / "deploy.md").read_text()
    start = text.index("<!-- section: deploy -->") + len("<!-- section: deploy -->")
    end = text.find("<!-- section:", start)
    return text[start : end if end != -1 else len(text)]


@dataclass(frozen=True)
class DocumentedService:
    name: str
    host_port: int | None
    container_port: int | None
    volumes: tuple[str, ...]


def documented_services(section: str) -> list[DocumentedService]:
    """The rows of the section's service table: | `name` | HOST → CONTAINER | `volume` | ... |"""
    rows = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([a-z-]+)`", cells[0]) if line.startswith("|") else None
        if match is None or len(cells) < 3:
            continue
        ports = re.fullmatch(r"(\d+) → (\d+)", cells[1])
        rows.append(
            DocumentedService(
                name=match.group(1),
                host_port=int(ports.group(1)) if ports else None,
                container_port=int(ports.group(2)) if ports else None,
                volumes=tuple(re.findall(r"`([a-z-]+)`", cells[2])),
            )
        )
    return rows


def test_the_deploy_doc_has_a_deploy_section() -> None:
    """docs/deploy.md's Deploy section is written, with its service table."""
    section = deploy_doc_section()
    assert section.strip(), "the deploy section of docs/deploy.md is empty"
    assert documented_services(section), "no service table in the deploy section of docs/deploy.md"


def test_the_deploy_doc_documents_what_the_compose_file_has(normalised: dict[str, Any]) -> None:
    """Every service, port and volume in the deploy page's table exists in compose, and back."""
    stack = services(normalised["sim"])
    documented = documented_services(deploy_doc_section())
    assert sorted(row.name for row in documented) == sorted(stack)
    for row in documented:
        service = stack[row.name]
        assert row.host_port is not None, f"{row.name}: no port in docs/deploy.md"
        assert (row.host_port, row.container_port) in [(h, c) for _, h, c in published(service)]
        named = {mount.source for mount in mounts(service) if mount.is_named_volume}
        assert set(row.volumes) == named, f"{row.name}: docs {row.volumes}, compose {named}"
    documented_volumes = {volume for row in documented for volume in row.volumes}
    assert documented_volumes == set(normalised["sim"]["volumes"])


def test_the_deploy_doc_names_only_files_that_exist() -> None:
    """Paths the Deploy section mentions (deploy/..., grafana/, Dockerfile) are in the repo."""
    section = deploy_doc_section()
    paths = set(re.findall(r"`((?:deploy|grafana|prometheus|alertmanager|tests)/[^`*]*)`", section))
    paths |= {"Dockerfile", "docker-compose.yml"}
    for path in paths:
        if (REPO / path) == TOKEN_SOURCE:
            continue
        assert (REPO / path).exists(), path
