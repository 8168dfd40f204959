"""Podman as a Docker engine for the stack tier: packages, its config, its Docker API socket.

Debian's podman needs three things before docker-compose can drive it here: default ulimits
below what the machine allows, runc instead of crun, and the dnsname CNI plugin so services
resolve each other by name. The config lives in a temporary CONTAINERS_CONF, never in /etc.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEBIAN_PACKAGES = (
    "podman",
    "runc",
    "golang-github-containernetworking-plugin-dnsname",
    "docker-compose",
    "debootstrap",
)
COMMANDS = ("podman", "runc", "docker-compose", "debootstrap")
DNSNAME_PLUGIN = Path("/usr/lib/cni/dnsname")
CONTAINERS_CONF = """\
[containers]
# podman's defaults exceed what this kind of machine allows: every container would fail to start.
default_ulimits = ["nofile=1024:1024", "nproc=1024:1024"]
[engine]
# crun refuses cgroups in hybrid mode here.
runtime = "runc"
# The tests count restarts in the event log. podman 4.3 drops older events when the shared log
# passes 1 MB (image builds on a fresh machine get it there), so the tier keeps its own, unrotated.
events_logger = "file"
events_logfile_path = "{events_log}"
events_logfile_max_size = "0"
"""


# How long `podman events` may take to read the event log (see `Podman.container_events`).
EVENTS_READ_SECONDS = 5.0


class PodmanUnavailable(Exception):
    """Podman cannot be used here; the message says why (a skip reason)."""


def missing_parts() -> list[str]:
    missing = [command for command in COMMANDS if shutil.which(command) is None]
    if not DNSNAME_PLUGIN.exists():
        missing.append(str(DNSNAME_PLUGIN))
    return missing


def ensure_installed() -> None:
    """Install the Debian packages the tier needs if any part is missing (root only)."""
    missing = missing_parts()
    if not missing:
        return
    if os.geteuid() != 0:
        raise PodmanUnavailable(
            f"missing {', '.join(missing)} and not root to install them: "
            f"apt-get install --no-install-recommends {' '.join(DEBIAN_PACKAGES)}"
        )
    policy = Path("/usr/sbin/policy-rc.d")
    if not policy.exists():  # no service may start from a package's postinst
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *DEBIAN_PACKAGES],
    ):
        result = subprocess.run(argv, env=environment, capture_output=True, text=True)
        if result.returncode != 0:
            raise PodmanUnavailable(
                f"cannot install {' '.join(DEBIAN_PACKAGES)}: {' '.join(argv)} exited "
                f"{result.returncode}: {(result.stderr or result.stdout)[-500:]}"
            )
    still = missing_parts()
    if still:
        raise PodmanUnavailable(f"still missing after apt-get install: {', '.join(still)}")


@dataclass(frozen=True)
class Podman:
    """A podman configured for this machine, serving the Docker API on `socket`."""

    workdir: Path
    conf: Path
    socket: Path

    @property
    def environment(self) -> dict[str, str]:
        return {**os.environ, "CONTAINERS_CONF": str(self.conf)}

    @property
    def docker_host(self) -> str:
        return f"unix://{self.socket}"

    def run(self, *args: str, check: bool = True, timeout: float = 600) -> str:
        """`podman ARGS` with this config; its stdout, or an error with its stderr."""
        result = subprocess.run(
            ["podman", *args],
            env=self.environment,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        if check and result.returncode != 0:
            raise RuntimeError(
                f"podman {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
            )
        return result.stdout

    def container_events(self, container: str, since: float) -> list[str]:
        """The statuses of `container`'s events since `since` (Unix time), in order.

        podman 4.3 reads the event log only while `--until` is ahead: an `--until` already
        past when it starts reading gives no event at all (checked by hand: "until now" lists
        none, "until now + 2 s" lists them). Started late (the stack tier runs at a lower CPU
        priority beside other tiers), a read until "now + 1 s" once gave none. It reads until
        EVENTS_READ_SECONDS from now, and once more if that read gave nothing.
        """
        statuses: list[str] = []
        for _ in range(2):
            statuses = self.run(
                "events", "--since", str(int(since)),
                "--until", str(int(time.time() + EVENTS_READ_SECONDS)),
                "--filter", f"container={container}", "--format", "{{.Status}}",
            ).split()  # fmt: skip
            if statuses:
                break
        return statuses

    def inspect(self, name: str) -> dict[str, Any] | None:
        output = self.run("container", "inspect", name, check=False)
        documents = json.loads(output) if output.strip() else []
        return documents[0] if documents else None

    def image_exists(self, reference: str) -> bool:
        result = subprocess.run(
            ["podman", "image", "exists", reference], env=self.environment, capture_output=True
        )
        return result.returncode == 0


@contextlib.contextmanager
def podman_service() -> Iterator[Podman]:
    """`podman system service` on a socket in a temporary directory; stopped and removed after."""
    if os.geteuid() != 0:
        raise PodmanUnavailable("the stack tier needs root (rootful podman, debootstrap, apt-get)")
    ensure_installed()
    workdir = Path(tempfile.mkdtemp(prefix="sw-stack-"))
    conf = workdir / "containers.conf"
    conf.write_text(CONTAINERS_CONF.format(events_log=workdir / "events.log"))
    podman = Podman(workdir, conf, workdir / "podman.sock")
    log = (workdir / "podman-service.log").open("wb")
    process = subprocess.Popen(
        ["podman", "system", "service", "--time=0", podman.docker_host],
        env=podman.environment,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not podman.socket.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "podman system service did not open its socket:\n"
                    + (workdir / "podman-service.log").read_text(errors="replace")[-2000:]
                )
            time.sleep(0.1)
        # Like Docker's socket (root:docker 0660): the restarter reaches it through group 0.
        podman.socket.chmod(0o660)
        yield podman
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(workdir, ignore_errors=True)
