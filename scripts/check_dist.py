"""Check the built wheel from a clean virtual environment, as a user installs it.

    python scripts/check_dist.py dist/stallwatch-X.Y.Z-py3-none-any.whl

Makes a new virtual environment in a temporary directory, installs the wheel there (its
dependencies from the package index pip is configured with), and checks, from outside the
checkout: `stallwatch --version` prints pyproject's version; `stallwatch exporter --help`
works; a simulator and an exporter started from the install answer one `/probe` on loopback
with the simulated server's state. Everything it starts is stopped, and the directory removed.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import tomllib
import urllib.request
import venv
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEADLINE = 60.0


def fail(message: str) -> None:
    raise SystemExit(f"check_dist: {message}")


def run(*args: str, cwd: Path) -> str:
    result = subprocess.run(args, capture_output=True, text=True, cwd=cwd, timeout=600)
    if result.returncode != 0:
        fail(f"{' '.join(args)}: exit {result.returncode}\n{result.stdout}\n{result.stderr}")
    return result.stdout


def start(*args: str, cwd: Path) -> tuple[subprocess.Popen[str], str]:
    """Start a component that prints 'listening on URL' first; its process and URL."""
    process = subprocess.Popen(
        args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True
    )
    assert process.stdout is not None
    line = process.stdout.readline().strip()
    if not line.startswith("listening on "):
        process.kill()
        process.wait()
        fail(f"{' '.join(args)} printed {line!r}, not 'listening on URL'")
    return process, line.removeprefix("listening on ")


def stop(process: subprocess.Popen[str]) -> None:
    process.terminate()
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not argv[0].endswith(".whl"):
        fail("usage: check_dist.py PATH.whl")
    wheel = Path(argv[0]).resolve()
    if not wheel.is_file():
        fail(f"{wheel}: no such file")
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    with tempfile.TemporaryDirectory(prefix="stallwatch-dist-") as tmp:
        work = Path(tmp)
        venv.EnvBuilder(with_pip=True).create(work / "venv")
        bin_dir = work / "venv" / "bin"
        run(str(bin_dir / "python"), "-m", "pip", "install", "--quiet", str(wheel), cwd=work)
        stallwatch = str(bin_dir / "stallwatch")
        said = run(stallwatch, "--version", cwd=work).strip()
        if said != f"stallwatch {version}":
            fail(f"stallwatch --version said {said!r}, expected 'stallwatch {version}'")
        if "--config" not in run(stallwatch, "exporter", "--help", cwd=work):
            fail("stallwatch exporter --help does not mention --config")
        config = work / "exporter.yml"
        config.write_text(
            "listen: 127.0.0.1:0\nmodules:\n  vllm: {kind: vllm, allow: [127.0.0.1], timeout: 5s}\n"
        )
        sim, sim_url = start(stallwatch, "sim", "--host", "127.0.0.1", "--port", "0", cwd=work)
        try:
            exporter, url = start(stallwatch, "exporter", "--config", str(config), cwd=work)
            try:
                probe = f"{url}/probe?module=vllm&target={sim_url}"
                with urllib.request.urlopen(probe, timeout=DEADLINE) as answer:
                    body = answer.read().decode()
            finally:
                stop(exporter)
        finally:
            stop(sim)
        if 'stallwatch_target_up{target="' not in body or "stallwatch_target_state{" not in body:
            fail(f"/probe answered without the target's series:\n{body[:2000]}")
    print(f"check_dist: {wheel.name} installs; --version, exporter --help and /probe work")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
