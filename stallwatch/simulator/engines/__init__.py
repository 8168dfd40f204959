"""The engines the simulator can look like, besides vLLM (which `simulator.server` renders itself).

Each module keeps one engine's families, endpoints and traps; `make_flavour` picks one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from stallwatch.simulator.engines.base import Flavour
from stallwatch.simulator.engines.llamacpp import LlamaCppFlavour
from stallwatch.simulator.engines.lmdeploy import LmdeployFlavour
from stallwatch.simulator.engines.sglang import SglangFlavour
from stallwatch.simulator.engines.tgi import TgiFlavour
from stallwatch.simulator.engines.trtllm import TritonFlavour, TrtllmFlavour

if TYPE_CHECKING:
    from stallwatch.simulator.host import FlavourHost

FLAVOURS: dict[str, type[Flavour]] = {
    flavour.name: flavour
    for flavour in (
        SglangFlavour,
        TgiFlavour,
        LlamaCppFlavour,
        LmdeployFlavour,
        TrtllmFlavour,
        TritonFlavour,
    )
}
ENGINES = ("vllm", *FLAVOURS)
# Engine profiles the simulator does not play, each with why (none today: every profile has a
# flavour; a test holds the profiles, the flavours and this list together).
WITHOUT_A_FLAVOUR: dict[str, str] = {}

__all__ = ["ENGINES", "FLAVOURS", "WITHOUT_A_FLAVOUR", "Flavour", "make_flavour"]


def make_flavour(engine: str, server: FlavourHost) -> Flavour | None:
    """The flavour of `engine`, or None for vLLM (the server's own rendering); ValueError names
    an engine the simulator cannot play."""
    if engine == "vllm":
        return None
    if engine not in FLAVOURS:
        raise ValueError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    return FLAVOURS[engine](server)
