"""What the scripts in this directory share: writing or checking a generated manifest.

The scripts import this module by name, with their own directory on sys.path. Only the standard
library is imported at the top: only the generators need PyYAML.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
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
