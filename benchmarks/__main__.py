"""`python -m benchmarks [--quick] [--only NAME ...] [--json FILE]`: run and print the tables."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from collections.abc import Callable

from benchmarks import (
    end_to_end,
    parsing,
    peer,
    probe_mode,
    quarantine,
    read_path,
    restart_window,
    restarter_bench,
    scale,
)
from benchmarks.common import Section

BENCHMARKS: dict[str, Callable[..., Section]] = {
    "parsing": parsing.run,
    "scale": scale.run,
    "e2e": end_to_end.run,
    "restarter": restarter_bench.run,
    "probe": probe_mode.run,
    "readpath": read_path.run,
    "window": restart_window.run,
    "quarantine": quarantine.run,
    "peer": peer.run,
}
# The benchmarks that can run the code at another git ref beside this tree's (`--baseline`).
COMPARED = frozenset({"probe", "readpath"})


def machine() -> str:
    return (
        f"{os.cpu_count()} CPU cores ({platform.processor() or platform.machine()}), "
        f"Python {platform.python_version()}, {platform.system()} {platform.release()}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes, for the smoke test")
    parser.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), help="run only these")
    parser.add_argument("--json", metavar="FILE", help="also write the raw figures as JSON")
    parser.add_argument(
        "--baseline",
        metavar="REF",
        help=f"also run {', '.join(sorted(COMPARED))} with the code at this git ref, side by side",
    )
    args = parser.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    results: dict[str, object] = {"machine": machine(), "quick": args.quick}
    print(f"# stallwatch benchmarks{' (quick)' if args.quick else ''}\n\nMachine: {machine()}\n")
    for name in names:
        started = time.perf_counter()
        if name in COMPARED:
            section = BENCHMARKS[name](args.quick, baseline=args.baseline)
        else:
            section = BENCHMARKS[name](args.quick)
        print(section.markdown())
        print(f"_({name}: {time.perf_counter() - started:.0f} s)_\n", flush=True)
        results[name] = section.figures
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(results, out, indent=2, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
