"""What the scripts in this directory share: writing or checking a generated manifest, and the
stamp, lock and status of a real server's separate environment.

The scripts import this module by name, with their own directory on sys.path. Only the standard
library is imported at the top: real_vllm.py and real_llamacpp.py run under the system python3
and inside their own environments, neither of which need have PyYAML.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


# --- generated manifests (gen_k8s_*.py) -------------------------------------------------------
def block_yaml(document: Any, width: int) -> str:
    """`document` as YAML in key order, with multi-line strings (PromQL, JSON) as `|` blocks."""
    import yaml  # not at the top: see the module docstring

    class BlockDumper(yaml.SafeDumper):
        pass

    def represent_str(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
        style = "|" if "\n" in value else None
        return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)

    BlockDumper.add_representer(str, represent_str)
    return yaml.dump(document, Dumper=BlockDumper, sort_keys=False, width=width)


def write_or_check(
    argv: Sequence[str] | None,
    generator: Path,
    generator_doc: str,
    *,
    manifest: Path,
    render: Callable[[], str],
) -> int:
    """The `main` of a generator: writes `render()` to `manifest`, or with `--check` exits 1
    when they differ. Its --help shows the first line of `generator_doc`."""
    parser = argparse.ArgumentParser(description=generator_doc.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the manifest is stale")
    args = parser.parse_args(argv)
    wanted = render()
    if args.check:
        current = manifest.read_text(encoding="utf-8") if manifest.exists() else ""
        if current != wanted:
            print(f"{manifest.relative_to(REPO_ROOT)} is out of date: run {generator.name}")
            return 1
        return 0
    manifest.write_text(wanted, encoding="utf-8")
    return 0


# --- real server environments (real_*.py) -----------------------------------------------------
def run_step(title: str, command: Sequence[str], env: dict[str, str] | None = None) -> float:
    """Runs one setup step, saying what and how long; the seconds it took."""
    print(f"==> {title}: {' '.join(command)}", flush=True)
    started = time.monotonic()
    subprocess.run(command, check=True, env=env)
    took = time.monotonic() - started
    print(f"==> {title}: done in {took:.1f} s", flush=True)
    return took


@dataclass(frozen=True)
class RealEnvironment:
    """A real server's separate virtual environment: its setup stamp and lock, and its status."""

    title: str  # as messages name it, e.g. "real vLLM environment"
    venv_dir: Path
    venv_python: Path
    lock_file: Path
    expected_stamp: Mapping[str, str]
    setup_command: str  # what to run when the environment is incomplete

    @property
    def stamp_file(self) -> Path:
        return self.venv_dir / ".stallwatch-setup.json"

    def read_stamp(self) -> dict[str, str] | None:
        """What the last complete setup recorded; None when there is no readable record."""
        try:
            loaded = json.loads(self.stamp_file.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return loaded if isinstance(loaded, dict) else None

    def write_stamp(self) -> None:
        text = json.dumps(self.expected_stamp, indent=2) + "\n"
        self.stamp_file.write_text(text, encoding="utf-8")

    def missing_parts(self, server_parts: Sequence[str]) -> list[str]:
        """What is missing: the virtual environment, `server_parts` (the server's own missing
        parts), then the stamp. Empty when the environment is complete."""
        missing = []
        if not self.venv_python.exists():
            missing.append(f"{self.venv_python.relative_to(REPO_ROOT)} (the virtual environment)")
        missing.extend(server_parts)
        stamp = self.read_stamp()
        expected = self.expected_stamp
        if stamp is None or any(stamp.get(key) != value for key, value in expected.items()):
            missing.append(f"{self.stamp_file.relative_to(REPO_ROOT)} with {expected}")
        return missing

    @contextlib.contextmanager
    def setup_lock(self) -> Iterator[None]:
        """Serialises setups: two test runs on one machine must not build the same venv at once."""
        self.lock_file.parent.mkdir(parents=True, exist_ok=True)
        with self.lock_file.open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def report_already_complete(self) -> None:
        print(f"{self.title} is complete: {self.venv_dir.name} {self.read_stamp()}")

    def report_status(self, missing: Sequence[str]) -> int:
        """Says whether the environment is complete, or what it misses: 0 if complete, else 1."""
        if missing:
            print(f"{self.title} is incomplete; missing:")
            for part in missing:
                print(f"  - {part}")
            print(f"run: {self.setup_command}")
            return 1
        print(f"{self.title} is complete: {self.venv_dir} {self.read_stamp()}")
        return 0

    def exec_server(
        self, missing: Sequence[str], command: list[str], environment: dict[str, str]
    ) -> int:
        """Replaces this process with the server `command`; 2 when the environment is incomplete."""
        if missing:
            print(
                f"the {self.title} is incomplete, run `{self.setup_command}`; missing: "
                + "; ".join(missing),
                file=sys.stderr,
            )
            return 2
        # exec: the server keeps this process id, so whoever started us can signal it directly.
        os.execve(command[0], command, environment)
