"""docker-compose.yml brought up on podman: a copy of the project's deploy files plus an override.

The compose file, deploy/, prometheus/ and alertmanager/ are copied unchanged into a temporary
project directory, so the bearer token the stack needs is written there and never into the
repository. The override only names the images built here and mounts podman's socket where
the restarter expects Docker's; Grafana (no Debian package, no image here) is not started.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .images import StackImages
from .podman import Podman

REPO = Path(__file__).resolve().parents[2]
PROJECT_FILES = ("docker-compose.yml", "deploy", "prometheus", "alertmanager")
PROJECT = "stallwatch-stack-test"
# Everything but grafana (and vllm, which is in the `gpu` profile only).
SERVICES = ("simulator", "exporter", "restarter", "prometheus", "alertmanager")
STALLWATCH_SERVICES = ("simulator", "exporter", "restarter")


def override(images: StackImages, socket: Path) -> dict[str, Any]:
    """The only differences from the users' stack: local images and podman's socket."""
    services: dict[str, Any] = {
        name: {"image": images.stallwatch.reference} for name in STALLWATCH_SERVICES
    }
    services["restarter"]["volumes"] = [f"{socket}:/var/run/docker.sock"]
    services["prometheus"] = {"image": images.prometheus.reference}
    services["alertmanager"] = {"image": images.alertmanager.reference}
    return {"services": services}


# The group the token file is read through (Debian's `nogroup`).
TOKEN_GID = 65534


@dataclass(frozen=True)
class ComposeProject:
    """One copy of the deploy files, driven by docker-compose against podman's API."""

    directory: Path
    podman: Podman
    token: str

    @classmethod
    def create(cls, podman: Podman, images: StackImages) -> ComposeProject:
        directory = podman.workdir / "project"
        directory.mkdir()
        for name in PROJECT_FILES:
            source = REPO / name
            if source.is_dir():
                shutil.copytree(
                    source, directory / name, ignore=shutil.ignore_patterns("restarter-token")
                )
            else:
                shutil.copy2(source, directory / name)
        token = secrets.token_hex(32)
        token_file = directory / "deploy" / "secrets" / "restarter-token"
        token_file.write_text(token + "\n")
        # deploy/secrets/README.md: 0640, read by Alertmanager and the restarter through the
        # file's group (STALLWATCH_TOKEN_GID); the restarter refuses a token all may read.
        token_file.chmod(0o640)
        # Not group 0: podman's socket already brings group 0 (DOCKER_GID=0), and compose
        # refuses the same group twice in `group_add`.
        os.chown(token_file, -1, TOKEN_GID)
        (directory / "override.yml").write_text(
            yaml.safe_dump(override(images, podman.socket), sort_keys=False)
        )
        return cls(directory, podman, token)

    @property
    def token_file(self) -> Path:
        return self.directory / "deploy" / "secrets" / "restarter-token"

    def compose(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        environment = {
            **self.podman.environment,
            "DOCKER_HOST": self.podman.docker_host,
            "COMPOSE_PROJECT_NAME": PROJECT,
            # The group of podman's socket (root, mode 0660), as DOCKER_GID is for Docker's.
            "DOCKER_GID": "0",
            "STALLWATCH_TOKEN_GID": str(TOKEN_GID),
        }
        for variable in (
            "COMPOSE_PROFILES",
            "STALLWATCH_TARGETS",
            "STALLWATCH_VERSION",
            "COMPOSE_FILE",
        ):
            environment.pop(variable, None)
        result = subprocess.run(
            ["docker-compose", "-f", "docker-compose.yml", "-f", "override.yml", *args],
            cwd=self.directory,
            env=environment,
            capture_output=True,
            text=True,
            timeout=600,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"docker-compose {' '.join(args)} exited {result.returncode}:\n"
                + result.stderr[-3000:]
            )
        return result

    def up(self) -> None:
        self.compose("up", "-d", "--no-build", *SERVICES)

    def down(self) -> None:
        self.compose("down", "-v", "--remove-orphans", "--timeout", "5", check=False)

    def container_names(self) -> dict[str, str]:
        """Service name -> container name, of this project's containers."""
        listing = self.podman.run(
            "ps", "-a", "--format", "json",
            "--filter", f"label=com.docker.compose.project={PROJECT}",
        )  # fmt: skip
        names = {}
        for document in json.loads(listing or "[]"):
            service = (document.get("Labels") or {}).get("com.docker.compose.service")
            if service:
                names[service] = document["Names"][0]
        return names

    def leftovers(self) -> dict[str, list[str]]:
        """This project's containers, networks and volumes still in podman (by label or name)."""
        label = f"label=com.docker.compose.project={PROJECT}"

        def names(*args: str) -> set[str]:
            return set(self.podman.run(*args, "--format", "{{.Name}}").split())

        containers = set(
            self.podman.run("ps", "-a", "--filter", label, "--format", "{{.Names}}").split()
        )
        containers |= set(self.podman.run("ps", "-a", "--format", "{{.Names}}").split()) & {
            "stallwatch-simulator"
        }
        networks = {name for name in names("network", "ls") if name.startswith(PROJECT)}
        volumes = names("volume", "ls", "--filter", label)
        volumes |= {name for name in names("volume", "ls") if name.startswith(PROJECT)}
        return {
            "containers": sorted(containers),
            "networks": sorted(networks),
            "volumes": sorted(volumes),
        }

    def health(self, container: str) -> str:
        document = self.podman.inspect(container)
        if document is None:
            return "missing"
        state = document.get("State", {})
        health = state.get("Health") or state.get("Healthcheck") or {}
        return str(health.get("Status", "none"))

    def wait_healthy(self, containers: list[str], timeout: float) -> None:
        """Run each container's own healthcheck until all pass.

        Podman schedules healthchecks with systemd timers; on a machine without systemd
        nothing runs them, so the test runs the check docker-compose.yml defines itself.
        """
        deadline = time.monotonic() + timeout
        pending = list(containers)
        while pending:
            for container in list(pending):
                self.podman.run("healthcheck", "run", container, check=False, timeout=30)
                if self.health(container) == "healthy":
                    pending.remove(container)
            if pending and time.monotonic() > deadline:
                details = {c: self.health(c) for c in pending}
                logs = {c: self.podman.run("logs", "--tail", "20", c, check=False) for c in pending}
                raise AssertionError(f"not healthy after {timeout:g} s: {details}\n{logs}")
            if pending:
                time.sleep(1)
