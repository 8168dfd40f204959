"""The `stallwatch` command: one entry point, one subcommand per component.

Each component owns its subcommand in a `cli` module with a `register(subparsers)` function
that adds its parser and sets `handler` to a function taking the parsed arguments and
returning the process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from stallwatch import __version__
from stallwatch.common.cli import UsageErrorParser

# Order is the order shown in --help.
SUBCOMMAND_MODULES: tuple[str, ...] = (
    "stallwatch.exporter.cli",
    "stallwatch.exporter.check_cli",
    "stallwatch.restarter.cli",
    "stallwatch.simulator.cli",
    "stallwatch.demo.cli",
    "stallwatch.replay.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = UsageErrorParser(
        prog="stallwatch",
        description=(
            "Keep LLM model servers up without using what the health check guards: "
            "read each server's own counters, send a test request only to an idle server, "
            "restart only a server that is shown to be stuck."
        ),
    )
    parser.add_argument("--version", action="version", version=f"stallwatch {__version__}")
    subparsers = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=UsageErrorParser
    )
    for module_name in SUBCOMMAND_MODULES:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as error:
            if not _is_module_or_parent(error.name, module_name):
                raise
            continue  # a component that is not part of this build (the demo, from an install)
        module.register(subparsers)
    return parser


def _is_module_or_parent(missing: str | None, module_name: str) -> bool:
    return missing is not None and (module_name == missing or module_name.startswith(missing + "."))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
