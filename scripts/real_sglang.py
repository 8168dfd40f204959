#!/usr/bin/env python3
"""A real SGLang server (the stock wheel, on the CPU) beside the project, with a tiny model.

    python3 scripts/real_sglang.py setup            # build .venv-sglang and the model (idempotent)
    python3 scripts/real_sglang.py status           # is the environment complete? (exit 0 if so)
    python3 scripts/real_sglang.py serve --port P [extra sglang args...]

SGLang's CPU path needs its compiled CPU kernel package (`sgl_kernel`), which PyPI does not
carry. A small pure-torch stand-in written here takes its place, in a folder of its own that is
put on the server's PYTHONPATH only. With it SGLang finds no AMX kernels and runs every layer's
plain torch path: its scheduler, metrics and HTTP behaviour are its own, only slower.

sglang is installed without its dependencies (they pin CUDA-only packages): torch and
torchvision at the versions it pins, then the runtime packages a text model needs on the CPU.
The model is the real vLLM tier's (scripts/real_vllm.py make-model). Only the standard library
is used at the top level, so the system python3 can run this script.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SCRIPTS_DIR = str(Path(__file__).resolve().parent)
if SCRIPTS_DIR not in sys.path:  # loaded by file path, as the tests do, rather than run
    sys.path.insert(0, SCRIPTS_DIR)
import real_vllm  # noqa: E402
from script_support import REPO_ROOT, RealEnvironment, run_step  # noqa: E402

VENV_DIR = REPO_ROOT / ".venv-sglang"
VENV_PYTHON = VENV_DIR / "bin" / "python"
MODEL_DIR = VENV_DIR / "tiny-llama"
STAND_IN_DIR = VENV_DIR / "cpu-kernel-stand-in"
STAND_IN_INIT = STAND_IN_DIR / "sgl_kernel" / "__init__.py"
MODEL_MAKER = Path(real_vllm.__file__).resolve()
LOCK_FILE = REPO_ROOT / ".cache" / "real-sglang-setup.lock"

SGLANG_VERSION = "0.5.23"
# What sglang 0.5.23 pins. The CUDA build runs on the CPU; PyPI's torchvision fails beside the
# CPU build of torch, and sglang imports torchvision at start.
TORCH_VERSION = "2.14.1"
TORCHVISION_VERSION = "0.29.1"
# sglang's runtime requirements that a text model on the CPU uses, without the CUDA-only ones
# (flashinfer, flash-attn, sglang-kernel, deep-gemm, tilelang, ...). dill and IPython are
# imported by sglang but not declared.
RUNTIME_REQUIREMENTS = (
    "aiohttp",
    "anthropic>=0.20.0",
    "apache-tvm-ffi==0.1.11",
    "blobfile==3.0.0",
    "build",
    "compressed-tensors==0.18.0",
    "distro",
    "easydict",
    "einops",
    "fastapi",
    "gguf",
    "interegular",
    "llguidance>=1.7.6,<2.0.0",
    "msgspec",
    "ninja",
    "numba==0.65.1",
    "numpy",
    "nvidia-ml-py",
    "openai==2.8.0",
    "openai-harmony==0.0.4",
    "orjson",
    "outlines==0.1.11",
    "packaging",
    "partial_json_parser",
    "pillow",
    "prometheus-client>=0.20.0",
    "psutil",
    "py-spy",
    "pybase64",
    "pydantic",
    "python-dateutil<3",
    "python-multipart",
    "pyzmq>=25.1.2",
    "regex",
    "requests",
    "scipy",
    "sentencepiece==0.2.1",
    "setproctitle",
    "soundfile==0.13.1",
    "tiktoken",
    "tokenizers==0.23.2",
    "tqdm",
    "transformers==5.19.0",
    "uvicorn>=0.51",
    "uvloop",
    "watchfiles",
    "xgrammar==0.2.7",
    "xxhash",
    "zstandard",
    "triton==3.8.0",
    "IPython",
    "dill",
)
# Bump when the stand-in changes, so an old one is written again.
STAND_IN_RECIPE = "sgl-kernel-stand-in-v1"

SERVED_MODEL_NAME = real_vllm.SERVED_MODEL_NAME
FIRST_WORD_ID = real_vllm.FIRST_WORD_ID
VOCAB_SIZE = real_vllm.VOCAB_SIZE

EXPECTED_STAMP = {
    "torch": TORCH_VERSION,
    "torchvision": TORCHVISION_VERSION,
    "sglang": SGLANG_VERSION,
    "cpu-kernel": STAND_IN_RECIPE,
    "model": real_vllm.MODEL_RECIPE,
}

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SERVER_ENV = {
    **OFFLINE_ENV,
    "SGLANG_USE_CPU_ENGINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

ENVIRONMENT = RealEnvironment(
    title="real SGLang environment",
    venv_dir=VENV_DIR,
    venv_python=VENV_PYTHON,
    lock_file=LOCK_FILE,
    expected_stamp=EXPECTED_STAMP,
    setup_command="make real-sglang",
)

# The one kernel a plain LLM calls (on every prefill), in torch, and the names that sglang's CPU
# modules import at start but call only for speculative decoding or KV moves.
STAND_IN_SOURCE = '''"""A pure-torch stand-in for SGLang's CPU kernels: what a plain LLM calls."""

import torch

__version__ = "0.0.0+stand-in"


def assign_req_to_token_pool_cpu(
    req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc, pool_len
):
    """For request r with range [start, end), writes the next end - start entries of
    out_cache_loc into req_to_token[r, start:end] (SGLang's assign_req_to_token_pool)."""
    position = 0
    for row, start, end in zip(
        req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()
    ):
        length = end - start
        req_to_token[row, start:end] = out_cache_loc[position : position + length].to(
            req_to_token.dtype
        )
        position += length


def _not_in_stand_in(name):
    def unsupported(*args, **kwargs):
        raise NotImplementedError(f"{name} is not in the CPU kernel stand-in")

    unsupported.__name__ = name
    return unsupported


for _name in (
    "copy_all_layer_kv_cache_cpu",
    "fill_accept_out_cache_loc_cpu",
    "fill_bonus_tokens_cpu",
    "assign_draft_cache_locs_contiguous_cpu",
    "assign_extend_cache_locs_cpu",
    "rotate_input_ids_cpu",
    "build_tree_kernel_efficient_cpu",
    "verify_tree_greedy_cpu",
):
    globals()[_name] = _not_in_stand_in(_name)
'''


def platform_supported() -> tuple[bool, str]:
    """(whether this recipe can run here, why not): the torch build and sglang wheel it pins
    are for CPython 3.11 on Linux x86_64 only."""
    machine = platform.machine()
    if sys.platform != "linux" or machine != "x86_64":
        return False, (
            f"this is {sys.platform} {machine}: the recipe (torch=={TORCH_VERSION}, "
            f"sglang=={SGLANG_VERSION}) runs on Linux x86_64 only"
        )
    if sys.version_info[:2] != (3, 11):
        return False, (
            f"this is Python {platform.python_version()}: the recipe's wheels are for CPython "
            "3.11; run the tests with a Python 3.11 virtual environment"
        )
    return True, ""


def server_command(port: int, extra_args: Sequence[str] = ()) -> list[str]:
    """The command line of a real SGLang server on 127.0.0.1:port (4 slots, 16-token chunks)."""
    return [
        str(VENV_PYTHON),
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(MODEL_DIR),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--attention-backend",
        "torch_native",
        "--dtype",
        "float32",
        "--enable-metrics",
        "--disable-overlap-schedule",
        "--max-running-requests",
        "4",
        "--chunked-prefill-size",
        "16",
        "--max-total-tokens",
        "131072",
        "--context-length",
        "32768",
        "--disable-radix-cache",
        *extra_args,
    ]


def server_environment(overrides: dict[str, str] | None = None) -> dict[str, str]:
    """The server's environment: the stand-in first on PYTHONPATH, offline, the CPU engine."""
    inherited = os.environ.get("PYTHONPATH")
    python_path = str(STAND_IN_DIR) + (os.pathsep + inherited if inherited else "")
    return {**os.environ, **SERVER_ENV, "PYTHONPATH": python_path, **(overrides or {})}


def missing_parts() -> list[str]:
    """What is missing from a complete environment; empty when it is complete."""
    server_parts = []
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (MODEL_DIR / name).exists():
            server_parts.append(f"{(MODEL_DIR / name).relative_to(REPO_ROOT)} (the tiny model)")
    if not STAND_IN_INIT.exists():
        server_parts.append(f"{STAND_IN_INIT.relative_to(REPO_ROOT)} (the CPU kernel stand-in)")
    if not any(VENV_DIR.glob("lib/python3*/site-packages/sglang/launch_server.py")):
        server_parts.append("sglang in the virtual environment")
    return ENVIRONMENT.missing_parts(server_parts)


def is_complete() -> bool:
    return not missing_parts()


def pip(*args: str) -> list[str]:
    return [str(VENV_PYTHON), "-m", "pip", "--disable-pip-version-check", "--quiet", *args]


def write_stand_in() -> None:
    partial = STAND_IN_INIT.with_name(STAND_IN_INIT.name + ".partial")
    partial.parent.mkdir(parents=True, exist_ok=True)
    partial.write_text(STAND_IN_SOURCE, encoding="utf-8")
    partial.rename(STAND_IN_INIT)


def setup() -> int:
    with ENVIRONMENT.setup_lock():
        if is_complete():
            ENVIRONMENT.report_already_complete()
            return 0
        total_started = time.monotonic()
        timings: dict[str, float] = {}
        if not VENV_PYTHON.exists():
            timings["venv"] = run_step("venv", [sys.executable, "-m", "venv", str(VENV_DIR)])
        timings["torch"] = run_step(
            "torch",
            pip(
                "install",
                "--progress-bar",
                "off",
                f"torch=={TORCH_VERSION}",
                f"torchvision=={TORCHVISION_VERSION}",
            ),
        )
        timings["runtime"] = run_step(
            "sglang's runtime packages",
            pip(
                "install",
                "--progress-bar",
                "off",
                *RUNTIME_REQUIREMENTS,
                f"torch=={TORCH_VERSION}",
                f"torchvision=={TORCHVISION_VERSION}",
            ),
        )
        timings["sglang"] = run_step(
            "sglang",
            pip("install", "--progress-bar", "off", "--no-deps", f"sglang=={SGLANG_VERSION}"),
        )
        write_stand_in()
        if MODEL_DIR.exists():
            shutil.rmtree(MODEL_DIR)
        timings["model"] = run_step(
            "tiny model",
            [
                str(VENV_PYTHON),
                str(Path(real_vllm.__file__).resolve()),
                "make-model",
                str(MODEL_DIR),
            ],
            env={**os.environ, **OFFLINE_ENV},
        )
        ENVIRONMENT.write_stamp()
        total = time.monotonic() - total_started
        summary = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.items())
        print(f"real SGLang environment ready in {total:.1f} s ({summary})", flush=True)
    return 0


def serve(port: int, extra_args: Sequence[str]) -> int:
    command = server_command(port, extra_args)
    return ENVIRONMENT.exec_server(missing_parts(), command, server_environment())


def status() -> int:
    return ENVIRONMENT.report_status(missing_parts())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="build .venv-sglang with SGLang and the tiny model")
    commands.add_parser("status", help="exit 0 if the environment is complete")
    serve_parser = commands.add_parser("serve", help="run a real SGLang server on 127.0.0.1")
    serve_parser.add_argument("--port", type=int, required=True)
    args, extra = parser.parse_known_args(argv)
    if args.command == "serve":
        return serve(args.port, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "setup":
        return setup()
    return status()


if __name__ == "__main__":
    sys.exit(main())
