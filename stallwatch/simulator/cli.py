"""`stallwatch sim`: run the vLLM simulator, its load generator, or a least-connection proxy."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import sys
from typing import Any

from stallwatch.common.cli import (
    EXIT_USAGE,
    add_logging_arguments,
    duration_or_seconds,
    setup_logging,
)
from stallwatch.simulator.config import SimConfig
from stallwatch.simulator.engines import ENGINES
from stallwatch.simulator.load import DEFAULT_USER_AGENT, run_load
from stallwatch.simulator.proxy import running_proxy
from stallwatch.simulator.server import SimServer


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defaults = SimConfig()
    parser = subparsers.add_parser(
        "sim",
        help="run a simulated vLLM 0.32 (or other engine's) server with fault injection, "
        "a load generator or a proxy",
        description=(
            "Serve a simulated vLLM 0.32 (V1 engine) OpenAI-compatible API: /metrics in the real "
            "format, /health, /v1/models, /version, /v1/completions, /v1/chat/completions, "
            "/sleep, /wake_up, plus POST /sim/fault and GET /sim/stats for tests. With --engine, "
            "the families and endpoints of SGLang, TGI, llama.cpp, LMDeploy, trtllm-serve or "
            "Triton instead. The first line on stdout is 'listening on http://HOST:PORT'."
        ),
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument(
        "--port", type=int, default=8000, help="port to bind; 0 picks a free one (default 8000)"
    )
    parser.add_argument(
        "--model", default=defaults.model, help="served model name (default %(default)s)"
    )
    parser.add_argument(
        "--max-num-seqs",
        type=int,
        default=defaults.max_num_seqs,
        help="requests running at once per engine; the rest wait (default %(default)s)",
    )
    parser.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=defaults.max_num_batched_tokens,
        help="tokens per engine step: prompt chunk size of chunked prefill (default %(default)s)",
    )
    parser.add_argument(
        "--tokens-per-second",
        type=float,
        default=defaults.tokens_per_second,
        help="aggregate decode speed per engine, shared by running requests (default %(default)s)",
    )
    parser.add_argument(
        "--prefill-tokens-per-second",
        type=float,
        default=defaults.prefill_tokens_per_second,
        help="prompt processing speed per engine (default %(default)s)",
    )
    parser.add_argument(
        "--max-model-len",
        type=int,
        default=defaults.max_model_len,
        help="prompt + max_tokens limit per request (default %(default)s)",
    )
    parser.add_argument(
        "--kv-cache-tokens",
        type=int,
        default=defaults.kv_cache_tokens,
        help="KV-cache size in tokens; when full, requests are preempted (default %(default)s)",
    )
    parser.add_argument(
        "--api-server-count",
        type=int,
        default=1,
        help="> 1 serves /metrics like prometheus multiprocess mode: no process_/python_ "
        "series, no _created samples, gauges without samples until the first request",
    )
    parser.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="number of engines, one `engine` label value each; requests go round-robin",
    )
    parser.add_argument(
        "--no-metrics",
        action="store_true",
        help="publish no vllm: metric families (only process_/python_ ones)",
    )
    parser.add_argument(
        "--seed", type=int, default=0, help="seed for generated text (default %(default)s)"
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default=defaults.engine,
        help="which server to look like: its /metrics families, health and other endpoints "
        "(default %(default)s)",
    )
    parser.add_argument(
        "--initial-decodes",
        type=int,
        default=0,
        help="start the engine's per-step counter here (e.g. 12000000: llama.cpp then prints "
        "n_decode_total with 6 significant digits, as a long-running server does)",
    )
    parser.add_argument(
        "--sleep-idle-seconds",
        type=_idle_sleep,
        default=defaults.sleep_idle_seconds,
        metavar="DURATION",
        help="llama.cpp: sleep after this long idle, a duration (30s) or seconds (30); "
        "< 0: never (default %(default)s)",
    )
    parser.add_argument(
        "--enable-fault-tolerance",
        action="store_true",
        help="vLLM: serve /fault_tolerance/status; the engine_fault fault holds the engine "
        "faulted instead of killing it",
    )
    add_logging_arguments(parser, log_help="log level (default: warning)", default_level="warning")
    parser.set_defaults(handler=_serve_command)

    commands = parser.add_subparsers(dest="sim_command", metavar="SIM_COMMAND")
    load = commands.add_parser(
        "load",
        help="keep N completions in flight against a server for a while",
        description="Batch-job style load: N /v1/completions requests with ignore_eos in flight "
        "for DURATION (60s, 10m, or a number of seconds); prints a summary (sent, ok, failed "
        "by status).",
    )
    load.add_argument("url", help="base URL of the server, e.g. http://127.0.0.1:8000")
    load.add_argument("--concurrency", type=int, default=4, help="requests in flight (default 4)")
    load.add_argument(
        "--prompt-tokens", type=int, default=32, help="prompt length in tokens (default 32)"
    )
    load.add_argument("--max-tokens", type=int, default=256, help="max_tokens (default 256)")
    load.add_argument(
        "--duration",
        type=duration_or_seconds,
        default=10.0,
        metavar="DURATION",
        help="how long to keep the load: a duration (60s, 10m) or seconds (60) (default 10s)",
    )
    load.add_argument("--model", default="tiny", help="model name (default tiny)")
    load.add_argument(
        "--user-agent", default=DEFAULT_USER_AGENT, help="User-Agent header (default %(default)s)"
    )
    load.add_argument("--wait", action="store_true", help="wait for requests in flight at the end")
    load.set_defaults(handler=_load_command)

    proxy = commands.add_parser(
        "proxy",
        help="least-connection proxy in front of several backends",
        description="Forward every path to the backend with the fewest requests in flight, "
        "streaming responses through. Prints 'listening on URL' first.",
    )
    proxy.add_argument(
        "--backend", action="append", required=True, help="backend base URL (repeat the flag)"
    )
    proxy.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    proxy.add_argument("--port", type=int, default=8080, help="port; 0 picks one (default 8080)")
    proxy.set_defaults(handler=_proxy_command)


def config_from_args(args: argparse.Namespace) -> SimConfig:
    """Build and validate a SimConfig from parsed `stallwatch sim` arguments."""
    positive_ints = {
        "--max-num-seqs": args.max_num_seqs,
        "--max-num-batched-tokens": args.max_num_batched_tokens,
        "--max-model-len": args.max_model_len,
        "--kv-cache-tokens": args.kv_cache_tokens,
        "--api-server-count": args.api_server_count,
        "--data-parallel-size": args.data_parallel_size,
    }
    for flag, value in positive_ints.items():
        if value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.initial_decodes < 0:
        raise ValueError(f"--initial-decodes must be >= 0, got {args.initial_decodes}")
    for flag, speed in {
        "--tokens-per-second": args.tokens_per_second,
        "--prefill-tokens-per-second": args.prefill_tokens_per_second,
    }.items():
        if speed <= 0:
            raise ValueError(f"{flag} must be > 0, got {speed}")
    return SimConfig(
        model=args.model,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        tokens_per_second=args.tokens_per_second,
        prefill_tokens_per_second=args.prefill_tokens_per_second,
        max_model_len=args.max_model_len,
        kv_cache_tokens=args.kv_cache_tokens,
        api_server_count=args.api_server_count,
        data_parallel_size=args.data_parallel_size,
        metrics_enabled=not args.no_metrics,
        seed=args.seed,
        engine=args.engine,
        initial_decodes=args.initial_decodes,
        sleep_idle_seconds=args.sleep_idle_seconds,
        fault_tolerance=args.enable_fault_tolerance,
    )


async def _wait_for_signal_or(event: asyncio.Event) -> bool:
    """Wait for SIGINT/SIGTERM or `event`; return True when the event fired."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    waiters: list[asyncio.Task[Any]] = [
        asyncio.create_task(stop.wait()),
        asyncio.create_task(event.wait()),
    ]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for task in waiters:
        task.cancel()
    return event.is_set()


async def _serve(config: SimConfig, host: str, port: int) -> int:
    server = SimServer(config)
    url = await server.start(host, port)
    print(f"listening on {url}", flush=True)
    crashed = await _wait_for_signal_or(server.crashed)
    await server.stop()
    if crashed:
        print("engine core died; API server exiting", file=sys.stderr, flush=True)
        return 1
    return 0


def _serve_command(args: argparse.Namespace) -> int:
    setup_logging(args.log_level, args.log_format)
    try:
        config = config_from_args(args)
    except ValueError as error:
        print(f"stallwatch sim: {error}", file=sys.stderr)
        return EXIT_USAGE
    return asyncio.run(_serve(config, args.host, args.port))


def _idle_sleep(text: str) -> float:
    """`--sleep-idle-seconds`: a duration or seconds, or a negative number (never sleeps)."""
    if text.startswith("-"):
        try:
            return float(text)
        except ValueError:
            pass
    return duration_or_seconds(text)


def _load_command(args: argparse.Namespace) -> int:
    try:
        summary = asyncio.run(
            run_load(
                args.url,
                concurrency=args.concurrency,
                prompt_tokens=args.prompt_tokens,
                max_tokens=args.max_tokens,
                duration=args.duration,
                model=args.model,
                user_agent=args.user_agent,
                wait_for_in_flight=args.wait,
            )
        )
    except ValueError as error:
        print(f"stallwatch sim load: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(summary.format(), flush=True)
    return 0 if summary.failed == 0 else 1


async def _proxy(backends: list[str], host: str, port: int) -> int:
    async with running_proxy(backends, host, port) as (url, _proxy_state):
        print(f"listening on {url}", flush=True)
        await _wait_for_signal_or(asyncio.Event())
    return 0


def _proxy_command(args: argparse.Namespace) -> int:
    return asyncio.run(_proxy(args.backend, args.host, args.port))


def main(argv: list[str] | None = None) -> int:
    """`python -m stallwatch.simulator ARGS`: `stallwatch sim ARGS` without the other components."""
    parser = argparse.ArgumentParser(prog="stallwatch")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["sim", *(sys.argv[1:] if argv is None else argv)])
    code: int = args.handler(args)
    return code
