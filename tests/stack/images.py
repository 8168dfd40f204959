"""The stack's images, built without a registry and cached in podman's storage by content hash.

- a Debian base made with debootstrap from the mirror in this machine's apt sources, with a
  virtual environment at /usr/local so `python` and `pip` are where python:3.11-slim has them;
- stallwatch from the project's Dockerfile on that base, from wheels built on the host and
  served to the build on loopback (`--build-arg PIP_NO_INDEX=1 PIP_FIND_LINKS=...`);
- Prometheus and Alertmanager from Debian's packages on the same base.

Each image's tag is a hash of what it is made from, so a second run reuses it. A cached
stallwatch image keeps the dependency versions of the run that built it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from .apt_mirror import debian_mirror, os_codename
from .podman import Podman

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
REPOSITORY = "localhost/stallwatch-test"
BASE_PACKAGES = ("python3", "python3-venv", "ca-certificates", "wget")
# Bump when the recipe below changes in a way the hash cannot see.
BASE_RECIPE = "1: minbase, venv at /usr/local, apt lists removed"
# Bump when the stallwatch image's build command changes.
STALLWATCH_RECIPE = "2: docker format, OCI version and revision labels"
IMAGE_ENV = ("PATH=/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8")
CONTEXT_FILES = ("Dockerfile", ".dockerignore", "pyproject.toml", "README.md")


@dataclass(frozen=True)
class Built:
    """One image: its reference, whether this run built it, how long that took, its size."""

    reference: str
    built: bool
    seconds: float
    size_bytes: int


@dataclass(frozen=True)
class StackImages:
    base: Built
    stallwatch: Built
    prometheus: Built
    alertmanager: Built

    def all(self) -> dict[str, Built]:
        return {
            "debian-base": self.base,
            "stallwatch": self.stallwatch,
            "prometheus": self.prometheus,
            "alertmanager": self.alertmanager,
        }


def _digest(*parts: bytes) -> str:
    hasher = hashlib.sha256()
    for part in parts:
        hasher.update(hashlib.sha256(part).digest())
    return hasher.hexdigest()[:16]


def _context_digest() -> bytes:
    """Everything the Dockerfile can copy: the files it names and stallwatch/'s sources."""
    parts = [name.encode() + b"\0" + (REPO / name).read_bytes() for name in CONTEXT_FILES]
    for path in sorted((REPO / "stallwatch").rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            relative = path.relative_to(REPO).as_posix().encode()
            parts.append(relative + b"\0" + path.read_bytes())
    return b"".join(hashlib.sha256(part).digest() for part in parts)


def _size(podman: Podman, reference: str) -> int:
    return int(podman.run("image", "inspect", "--format", "{{.Size}}", reference).strip())


def _image_id(podman: Podman, reference: str) -> str:
    return podman.run("image", "inspect", "--format", "{{.Id}}", reference).strip()


def _drop_other_tags(podman: Podman, name: str, keep: str) -> None:
    """Remove this image's tags from earlier runs so the cache holds one of each."""
    listing = podman.run("images", "--format", "{{.Repository}}:{{.Tag}}", f"{REPOSITORY}/{name}")
    for reference in listing.split():
        if reference != keep:
            podman.run("rmi", reference, check=False)


def _cached(podman: Podman, name: str, tag: str, build: functools.partial[None]) -> Built:
    reference = f"{REPOSITORY}/{name}:{tag}"
    if podman.image_exists(reference):
        return Built(reference, False, 0.0, _size(podman, reference))
    started = time.monotonic()
    build(reference)
    seconds = time.monotonic() - started
    _drop_other_tags(podman, name, reference)
    return Built(reference, True, seconds, _size(podman, reference))


def _run(argv: list[str]) -> None:
    """Run `argv`; on failure, raise with the end of what it printed."""
    result = subprocess.run(argv, capture_output=True, text=True)
    if result.returncode != 0:
        output = (result.stderr + result.stdout)[-2000:]
        raise RuntimeError(f"{' '.join(argv)} exited {result.returncode}:\n{output}")


def _build_base(podman: Podman, suite: str, mirror: str, reference: str) -> None:
    with tempfile.TemporaryDirectory(prefix="sw-rootfs-") as scratch:
        rootfs, cache = Path(scratch) / "rootfs", Path(scratch) / "debs"
        cache.mkdir()
        _run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(BASE_PACKAGES)}",
                f"--cache-dir={cache}",
                suite,
                str(rootfs),
                mirror,
            ]
        )
        # Where python:3.11-slim has them: `python` and `pip` first on PATH, and a pip that
        # installs into /usr/local instead of refusing Debian's externally managed Python.
        _run(["chroot", str(rootfs), "python3", "-m", "venv", "/usr/local"])
        for leftover in ("var/lib/apt/lists", "var/cache/apt"):
            for path in (rootfs / leftover).glob("*"):
                if path.is_file():
                    path.unlink()
                elif path.is_dir() and path.name != "partial":
                    shutil.rmtree(path)
        tar = subprocess.Popen(["tar", "-C", str(rootfs), "-c", "."], stdout=subprocess.PIPE)
        changes = [arg for env in IMAGE_ENV for arg in ("--change", f"ENV={env}")]
        podman_import = subprocess.run(
            ["podman", "import", *changes, "-", reference],
            stdin=tar.stdout,
            env=podman.environment,
            capture_output=True,
        )
        tar.wait()
        if podman_import.returncode != 0 or tar.returncode != 0:
            raise RuntimeError(f"podman import failed: {podman_import.stderr.decode()[-1000:]}")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


@contextlib.contextmanager
def _served_on_loopback(directory: Path) -> Iterator[str]:
    """A directory listing on 127.0.0.1 (pip's --find-links reads its links)."""
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_QuietHandler, directory=str(directory))
    )
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def _build_stallwatch(podman: Podman, base: str, reference: str) -> None:
    with tempfile.TemporaryDirectory(prefix="sw-wheels-") as wheels:
        # The build backend too: the build stage makes stallwatch's own wheel with no index.
        build_system = tomllib.loads((REPO / "pyproject.toml").read_text())["build-system"]
        _run([sys.executable, "-m", "pip", "wheel", "-q", "-w", wheels, str(REPO),
              *build_system["requires"]])  # fmt: skip
        for own in Path(wheels).glob("stallwatch-*.whl"):
            own.unlink()  # the build makes this one itself, from the context
        with _served_on_loopback(Path(wheels)) as url:
            # Docker's format keeps the HEALTHCHECK (OCI's has no field for it).
            podman.run(
                "build", "--quiet", "--network", "host", "--format", "docker",
                "--build-arg", f"BASE_IMAGE={base}",
                "--build-arg", f"VERSION={package_version()}",
                "--build-arg", f"REVISION={revision()}",
                "--build-arg", "PIP_NO_INDEX=1",
                "--build-arg", f"PIP_FIND_LINKS={url}",
                "--tag", reference,
                str(REPO),
            )  # fmt: skip
    podman.run("image", "prune", "--force", check=False)  # the untagged build stage


def package_version() -> str:
    return str(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"])


def revision() -> str:
    """The commit the image is built from (a cached image keeps the one that built it)."""
    result = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    return result.stdout.strip() if result.returncode == 0 else "unknown"


def _build_from_packages(podman: Podman, base: str, containerfile: Path, reference: str) -> None:
    podman.run(
        "build", "--quiet", "--network", "host",
        "--build-arg", f"BASE_IMAGE={base}",
        "--file", str(containerfile),
        "--tag", reference,
        str(HERE / "images"),
    )  # fmt: skip


def build_images(podman: Podman) -> StackImages:
    """Every image the stack needs, built now or taken from an earlier run's cache."""
    suite = os_codename()
    mirror = debian_mirror(suite) if suite else None
    if suite is None or mirror is None:
        raise RuntimeError("no Debian mirror for this release in the apt sources (/etc/apt)")
    base_tag = _digest(suite.encode(), mirror.encode(), ",".join(BASE_PACKAGES).encode(),
                       BASE_RECIPE.encode())  # fmt: skip
    base = _cached(podman, "debian-base", base_tag,
                   functools.partial(_build_base, podman, suite, mirror))  # fmt: skip
    base_id = _image_id(podman, base.reference).encode()
    stallwatch = _cached(
        podman,
        "stallwatch",
        _digest(base_id, _context_digest(), STALLWATCH_RECIPE.encode()),
        functools.partial(_build_stallwatch, podman, base.reference),
    )
    built = {}
    for name in ("prometheus", "alertmanager"):
        containerfile = HERE / "images" / f"{name}.Containerfile"
        built[name] = _cached(
            podman,
            name,
            _digest(base_id, containerfile.read_bytes()),
            functools.partial(_build_from_packages, podman, base.reference, containerfile),
        )
    return StackImages(base, stallwatch, built["prometheus"], built["alertmanager"])
