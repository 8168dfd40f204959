"""The exporters the peer benchmark measures side by side (`PEERS`), each started as its own
process on a free loopback port: `stallwatch exporter` (uvloop, two workers, asyncio's loop),
Debian's blackbox_exporter (a whole-body read and a body regex) and the bare aiohttp exporter
(asyncio's loop and uvloop); how each is scraped and how its answer says the read succeeded."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import REPO, listening_child, stop_child
from benchmarks.probe_mode import exporter_process, free_port, stallwatch_params

BLACKBOX = "prometheus-blackbox-exporter"
# The series the regex module looks for in the body (a gauge of the vLLM payload).
BODY_REGEX = r"vllm:num_requests_running\{[^}]*\} [0-9.eE+-]+"
# `stallwatch exporter --workers` of the second stallwatch row: one per core of these machines.
WORKERS = 2

StartExporter = Callable[[Path], AbstractContextManager[tuple[subprocess.Popen[str], str]]]


def blackbox_config() -> dict[str, object]:
    """blackbox_exporter's modules: a whole-body read, and the same with a body regex."""
    http = {"preferred_ip_protocol": "ip4", "ip_protocol_fallback": False}
    return {
        "modules": {
            "http_2xx": {"prober": "http", "timeout": "5s", "http": http},
            "vllm_regex": {
                "prober": "http",
                "timeout": "5s",
                "http": http | {"fail_if_body_not_matches_regexp": [BODY_REGEX]},
            },
        }
    }


def wait_ready(process: subprocess.Popen[str], url: str, seconds: float = 15.0) -> None:
    """Wait until `url` answers 200; fail if the process exits or the time runs out."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{process.args!r} exited with {process.returncode}")
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError),
            urllib.request.urlopen(url, timeout=1) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer within {seconds:g} s")


@contextlib.contextmanager
def blackbox_process(workdir: Path) -> Iterator[tuple[subprocess.Popen[str], str]]:
    """blackbox_exporter with `blackbox_config()` on a free loopback port; yields it and its
    base URL, and stops it."""
    binary = shutil.which(BLACKBOX)
    assert binary is not None
    config = workdir / "blackbox.yml"
    config.write_text(json.dumps(blackbox_config()))
    address = f"127.0.0.1:{free_port()}"
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--web.listen-address={address}"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_ready(process, f"http://{address}/-/healthy")
        yield process, f"http://{address}"
    finally:
        stop_child(process)


def bare_process(workdir: Path) -> AbstractContextManager[tuple[subprocess.Popen[str], str]]:
    """`benchmarks.bare_exporter` as a child process; yields it and its base URL."""
    del workdir
    argv = [sys.executable, "-m", "benchmarks.bare_exporter"]
    return listening_child(argv, "the bare exporter", cwd=REPO)


def bare_uvloop_process(
    workdir: Path,
) -> AbstractContextManager[tuple[subprocess.Popen[str], str]]:
    """`benchmarks.bare_exporter` on uvloop."""
    del workdir
    argv = [sys.executable, "-m", "benchmarks.bare_exporter", "--event-loop=uvloop"]
    return listening_child(argv, "the bare exporter on uvloop", cwd=REPO)


def stallwatch_start(workdir: Path) -> AbstractContextManager[tuple[subprocess.Popen[str], str]]:
    return exporter_process(workdir)


def stallwatch_asyncio_start(
    workdir: Path,
) -> AbstractContextManager[tuple[subprocess.Popen[str], str]]:
    return exporter_process(workdir, arguments=("--event-loop=asyncio",))


def stallwatch_workers_start(
    workdir: Path,
) -> AbstractContextManager[tuple[subprocess.Popen[str], str]]:
    return exporter_process(workdir, workers=WORKERS)


def body_says(pattern: bytes) -> Callable[[bytes], bool]:
    """A check that a `/probe` answer has a line matching `pattern` (the read succeeded)."""
    compiled = re.compile(pattern, re.MULTILINE)
    return lambda body: compiled.search(body) is not None


def blackbox_params(module: str) -> Callable[[int], dict[str, str]]:
    return lambda port: {"target": f"http://127.0.0.1:{port}/metrics", "module": module}


def bare_params(port: int) -> dict[str, str]:
    return {"target": f"127.0.0.1:{port}"}


@dataclass(frozen=True)
class Peer:
    """One exporter as the scrape plan meets it."""

    name: str
    start: StartExporter
    params: Callable[[int], dict[str, str]]
    succeeded: Callable[[bytes], bool]
    # The exporter's own counter of reads on its /metrics; None: every scrape that
    # succeeded is one read (blackbox_exporter reads the server at every /probe).
    reads_counter: str | None


STALLWATCH_UP = body_says(rb"^stallwatch_target_up(\{[^}]*\})? 1(\.0)?$")
PEERS = (
    Peer(
        "stallwatch",
        stallwatch_start,
        stallwatch_params,
        STALLWATCH_UP,
        "stallwatch_probe_reads_total",
    ),
    Peer(
        f"stallwatch, {WORKERS} workers",
        stallwatch_workers_start,
        stallwatch_params,
        STALLWATCH_UP,
        "stallwatch_probe_reads_total",
    ),
    Peer(
        "stallwatch, asyncio loop",
        stallwatch_asyncio_start,
        stallwatch_params,
        STALLWATCH_UP,
        "stallwatch_probe_reads_total",
    ),
    Peer(
        "blackbox http_2xx",
        blackbox_process,
        blackbox_params("http_2xx"),
        body_says(rb"^probe_success 1$"),
        None,
    ),
    Peer(
        "blackbox regex",
        blackbox_process,
        blackbox_params("vllm_regex"),
        body_says(rb"^probe_success 1$"),
        None,
    ),
    Peer(
        "bare aiohttp",
        bare_process,
        bare_params,
        body_says(rb"^bare_probe_success 1$"),
        "bare_reads_total",
    ),
    Peer(
        "bare aiohttp, uvloop",
        bare_uvloop_process,
        bare_params,
        body_says(rb"^bare_probe_success 1$"),
        "bare_reads_total",
    ),
)
