"""Engine profiles, one module per engine, and the registry the reader and the exporter use."""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from stallwatch.core.engines import llamacpp, lmdeploy, ollama, sglang, tgi, triton, trtllm, vllm
from stallwatch.core.engines.profile import Endpoint, EngineProfile, Series

# Engines whose /metrics stallwatch reads, in the order `kind: auto` prefers on a tie.
PROFILES: Mapping[str, EngineProfile] = MappingProxyType(
    {
        profile.kind: profile
        for profile in (
            vllm.PROFILE,
            sglang.PROFILE,
            tgi.PROFILE,
            llamacpp.PROFILE,
            lmdeploy.PROFILE,
            trtllm.PROFILE,
            triton.PROFILE,
        )
    }
)
# Documented for its endpoints; it has no metrics, so no payload is ever read as Ollama.
OLLAMA: EngineProfile = ollama.PROFILE
ENGINE_KINDS: tuple[str, ...] = tuple(PROFILES)
AUTO = "auto"
PROXY = "proxy"
# Every value of a target's `kind`; `auto` is the default.
TARGET_KINDS: tuple[str, ...] = (AUTO, *ENGINE_KINDS, PROXY)
DEFAULT_METRICS_PATH = "/metrics"


def profile_for(kind: str) -> EngineProfile:
    """The profile of an engine kind; a KeyError names the kinds there are."""
    try:
        return PROFILES[kind]
    except KeyError:
        raise KeyError(f"unknown engine {kind!r}; expected one of {', '.join(PROFILES)}") from None


def default_metrics_path(kind: str) -> str:
    """Where a target of `kind` publishes its metrics unless the config says otherwise."""
    profile = PROFILES.get(kind)
    return profile.metrics_path if profile is not None else DEFAULT_METRICS_PATH


__all__ = [
    "AUTO",
    "ENGINE_KINDS",
    "OLLAMA",
    "PROFILES",
    "PROXY",
    "TARGET_KINDS",
    "Endpoint",
    "EngineProfile",
    "Series",
    "default_metrics_path",
    "profile_for",
]
