"""Where the restarter runs: the plain platform (fixed targets, one replica) or Kubernetes (pod
targets from the allow-rules, a Lease, Events, pod readiness). The restarter always has one, so
no part of it asks which: each question is the platform's to answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.core.alert_plan import RoutingChange
from stallwatch.core.alerts import Alert, Notification
from stallwatch.core.policy import Decision, PastRestart

if TYPE_CHECKING:
    from stallwatch.restarter.kube.action import PodRestarter


class Platform(Protocol):
    """What the restarter asks of where it runs."""

    @property
    def acting(self) -> bool:
        """Whether this replica decides and acts (the Lease holder; always, with one replica)."""
        ...

    @property
    def actor(self) -> PodRestarter | None:
        """The pod actions' runner (None: no pod targets)."""
        ...

    @property
    def adds_targets(self) -> bool:
        """Whether alerts bring targets the config does not list (pods by the allow-rules)."""
        ...

    @property
    def config(self) -> RestarterConfig:
        """The config as loaded, before the platform added its targets."""
        ...

    def effective(self, config: RestarterConfig) -> RestarterConfig:
        """`config` with the targets the platform adds (the pods the allow-rules resolved)."""
        ...

    def pool_members(self, target: Target) -> tuple[str, ...]:
        """The targets of `target`'s pool, itself included."""
        ...

    async def resolve_notification(
        self, notification: Notification
    ) -> tuple[Notification, Mapping[tuple[str, str], Decision]]:
        """The notification with its alerts named as the platform's targets, and the alerts it
        refused (by fingerprint and startsAt)."""
        ...

    def shared_restarts(self) -> tuple[PastRestart, ...]:
        """Restarts another replica decided, which count as this one's."""
        ...

    def on_decision(self, alert: Alert, decision: Decision, target: Target | None) -> None: ...

    def on_outcome(self, target: Target, result: str, detail: str) -> None: ...

    async def on_routing(self, change: RoutingChange, target: Target) -> None: ...

    async def start(self) -> None: ...

    async def stop(self) -> None: ...


class PlainPlatform:
    """Fixed targets and one restarter: it acts, its pools are the configured ones, and nothing
    listens to its decisions but the journal."""

    def __init__(self, config: Callable[[], RestarterConfig]) -> None:
        self._config = config

    @property
    def acting(self) -> bool:
        return True

    @property
    def actor(self) -> PodRestarter | None:
        return None

    @property
    def adds_targets(self) -> bool:
        return False

    @property
    def config(self) -> RestarterConfig:
        return self._config()

    def effective(self, config: RestarterConfig) -> RestarterConfig:
        return config

    def pool_members(self, target: Target) -> tuple[str, ...]:
        return tuple(t.name for t in self._config().targets if t.pool == target.pool)

    async def resolve_notification(
        self, notification: Notification
    ) -> tuple[Notification, Mapping[tuple[str, str], Decision]]:
        return notification, {}

    def shared_restarts(self) -> tuple[PastRestart, ...]:
        return ()

    def on_decision(self, alert: Alert, decision: Decision, target: Target | None) -> None:
        del alert, decision, target

    def on_outcome(self, target: Target, result: str, detail: str) -> None:
        del target, result, detail

    async def on_routing(self, change: RoutingChange, target: Target) -> None:
        del change, target

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None
