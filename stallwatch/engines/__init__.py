"""Engine profiles, one module per engine, and the registry the reader and the exporter use."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from stallwatch.engines import llamacpp, lmdeploy, ollama, sglang, tgi, triton, trtllm, vllm
from stallwatch.engines.profile import Endpoint, EngineProfile, Series

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


def model_owners(document: object) -> tuple[str, ...] | None:
    """The `owned_by` strings of a `/v1/models` document's cards; None when it is no model
    list (an object with a `data` list)."""
    cards = document.get("data") if isinstance(document, dict) else None
    if not isinstance(cards, list):
        return None
    return tuple(
        owner
        for card in cards
        if isinstance(card, dict) and isinstance(owner := card.get("owned_by"), str)
    )


def identify(status: int | None, owners: Iterable[str]) -> str | None:
    """The engine a `GET /v1/models` answer names in its cards' `owned_by`; None when the
    answer names none of them (another status, no list, an owner no profile claims).

    `kind: auto` asks this before it reads any engine-specific path: every engine whose usual
    metrics path is unsafe names itself there (a unit test holds the profiles to it), so an
    answer that names no engine is safe to follow with the configured metrics path.
    """
    if status != 200:
        return None
    for owner in owners:
        for kind, profile in PROFILES.items():
            if owner in profile.owned_by:
                return kind
    return None


def auto_metrics_path(engine: str | None, configured: str) -> str:
    """Where `kind: auto` reads the metrics of a target identified as `engine`: the configured
    path, unless that engine's profile marks it unsafe (trtllm-serve's destructive `/metrics`),
    then the profile's own metrics path."""
    profile = PROFILES.get(engine or "")
    if profile is not None and configured in profile.unsafe_paths:
        return profile.metrics_path
    return configured


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
    "auto_metrics_path",
    "default_metrics_path",
    "identify",
    "model_owners",
    "profile_for",
]
