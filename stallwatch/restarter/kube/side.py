"""The restarter's Kubernetes side: turning alerts into pod targets by the allow-rules,
the Lease, and an Event on the pod for every restart and refusal.

The service calls it at a few points (`resolve`, `history_restarts`, `on_decision`,
`on_outcome`); everything it decides about a pod comes from the rule and the API object.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace

from stallwatch.common.kubernetes_config import KubernetesAction
from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.core.alert_plan import RoutingChange
from stallwatch.core.alerts import TARGET_LABEL, Alert, Notification
from stallwatch.core.kube_names import INVALID_POD_NAME, invalid_pod_names
from stallwatch.core.pod_rules import (
    PodFacts,
    PodName,
    Refusal,
    metrics_url,
    rule_for_pod,
    rules_for_alert,
    target_name,
)
from stallwatch.core.policy import Decision, PastRestart, lookback_seconds
from stallwatch.restarter.kube.action import PodRestarter
from stallwatch.restarter.kube.api import ApiException, KubeApi
from stallwatch.restarter.kube.lease import LeaseKeeper

log = logging.getLogger("stallwatch.restarter")

# A pod target not seen in an alert for this long (beyond the policy's look-back) is forgotten.
FORGET_AFTER_SECONDS = 3600.0
# Event reasons as `kubectl describe pod` shows them.
EVENT_RESTARTING = "StallwatchRestarting"
EVENT_REFUSED = "StallwatchRestartRefused"
EVENT_RESULT = "StallwatchRestart"
_MAX_EVENT_TASKS = 100
# Alertmanager re-sends a firing alert, and each delivery refused for the same reason says
# nothing new: one refusal Event per pod and reason in this interval.
REFUSAL_EVENT_INTERVAL_SECONDS = 600.0


class KubeSide:
    def __init__(
        self,
        api: KubeApi,
        config: RestarterConfig,
        *,
        clock: Callable[[], float],
        own_restarts: Callable[[float], tuple[PastRestart, ...]],
        on_event: Callable[[str], None] | None = None,
    ) -> None:
        self.api = api
        self.config = config
        self.clock = clock
        settings = config.kubernetes
        assert settings is not None
        self.settings = settings
        self.lease: LeaseKeeper | None = None
        if settings.lease is not None:
            self.lease = LeaseKeeper(
                api,
                settings.lease,
                clock=clock,
                own_restarts=own_restarts,
                lookback=lambda: self.lookback,
            )
        self.actor = PodRestarter(api, fence=self.lease.fence if self.lease else None, clock=clock)
        # Pod targets resolved by the rules: name -> (target, last seen).
        self.pod_targets: dict[str, tuple[Target, float]] = {}
        self.on_event = on_event
        self._events: set[asyncio.Task[None]] = set()
        # (pod, refusal reason) -> when its last Event was posted.
        self._refusals_posted: dict[tuple[tuple[str, str], str], float] = {}
        # (namespace, pod) -> (its uid as last read, when): the uid an Event names.
        self._uids: dict[tuple[str, str], tuple[str, float]] = {}

    @classmethod
    async def connect(
        cls,
        config: RestarterConfig,
        *,
        clock: Callable[[], float],
        own_restarts: Callable[[float], tuple[PastRestart, ...]],
        on_event: Callable[[str], None] | None = None,
    ) -> KubeSide:
        assert config.kubernetes is not None
        api = await KubeApi.connect(config.kubernetes)
        return cls(api, config, clock=clock, own_restarts=own_restarts, on_event=on_event)

    async def start(self) -> None:
        if self.lease is not None:
            await self.lease.step()
            self.lease.start()

    async def stop(self) -> None:
        if self.lease is not None:
            await self.lease.stop()
        if self._events:
            await asyncio.gather(*set(self._events), return_exceptions=True)
        await self.api.close()

    @property
    def acting(self) -> bool:
        """Whether this replica may act (always, without a Lease)."""
        return self.lease is None or self.lease.holding

    @property
    def lookback(self) -> float:
        spans = [lookback_seconds(self.config)]
        for rule in self.config.rules:
            spans += [rule.cooldown, rule.budget.window, rule.action_timeout]
        return max(spans)

    # --- targets from the rules -------------------------------------------------------------
    def pool_members(self, target: Target) -> tuple[str, ...]:
        """The targets of `target`'s pool (the pods of one workload), itself included."""
        return (target.name,)

    async def on_routing(self, change: RoutingChange, target: Target) -> None:
        """A pod target left or came back into users' rotation."""
        del change, target

    def effective(self, config: RestarterConfig) -> RestarterConfig:
        """`config` with the pod targets the rules resolved (fixed targets win a name clash)."""
        self.config = config
        now = self.clock()
        forget = now - max(FORGET_AFTER_SECONDS, self.lookback)
        for name in [n for n, (_, seen) in self.pod_targets.items() if seen < forget]:
            del self.pod_targets[name]
        for pod in [p for p, (_, seen) in self._uids.items() if seen < forget]:
            del self._uids[pod]
        fixed = {target.name for target in config.targets}
        pods = tuple(t for n, (t, _) in self.pod_targets.items() if n not in fixed)
        return replace(config, targets=config.targets + pods)

    def wants(self, alert: Alert, config: RestarterConfig) -> bool:
        return (
            bool(config.rules)
            and alert.status == "firing"
            and alert.alertname in config.restart_alerts
            and (alert.target is None or config.target(alert.target) is None)
        )

    async def resolve_notification(
        self, notification: Notification
    ) -> tuple[Notification, dict[tuple[str, str], Decision]]:
        """The notification with its pod alerts renamed to their targets, and the refusals
        (by fingerprint and startsAt) of those no rule allows."""
        config = self.config
        wanted = [i for i, alert in enumerate(notification.alerts) if self.wants(alert, config)]
        if not wanted:
            return notification, {}
        found = await asyncio.gather(
            *(_named_validly(self.resolve, config, notification.alerts[i]) for i in wanted)
        )
        alerts = list(notification.alerts)
        refusals: dict[tuple[str, str], Decision] = {}
        for index, (alert, target) in zip(wanted, found, strict=True):
            alerts[index] = alert
            if isinstance(target, Decision):
                refusals[(alert.fingerprint, alert.starts_at)] = target
        return replace(notification, alerts=tuple(alerts)), refusals

    async def resolve(self, alert: Alert) -> tuple[Alert, Target | Decision]:
        """The alert renamed to its pod target, and the target (or why it is refused)."""
        names = rules_for_alert(self.config.rules, alert.labels)
        if isinstance(names, Refusal):
            return alert, Decision("skip", names.reason, names.detail)
        first = names[0]
        alert = _renamed(alert, f"{first.namespace}/{first.pod}")
        try:
            found = await self._pod_target(names)
        except ApiException as error:
            detail = f"reading pod {first.pod}: the API answered {error.status}"
            return alert, Decision("skip", "kubernetes_error", detail)
        if isinstance(found, Refusal):
            return alert, Decision("skip", found.reason, found.detail)
        self.pod_targets[found.name] = (found, self.clock())
        return _renamed(alert, found.name), found

    async def _pod_target(self, names: tuple[PodName, ...]) -> Target | Refusal:
        pods: dict[tuple[str, str], PodFacts | None] = {}
        for named in names:  # each pod read once, however many rules name it
            key = (named.namespace, named.pod)
            if key not in pods:
                pods[key] = await self.api.pod(*key)
                facts = pods[key]
                if facts is not None and facts.uid:
                    self._uids[key] = (facts.uid, self.clock())
        chosen = rule_for_pod(names, pods)
        if isinstance(chosen, Refusal):
            return chosen
        named, pod = chosen
        url = metrics_url(named.rule, pod)
        if isinstance(url, Refusal):
            return url
        rule = named.rule
        return Target(
            name=target_name(pod),
            metrics_url=url,
            action=replace(rule.action, namespace=pod.namespace, pod=pod.name),
            cooldown=rule.cooldown,
            budget=rule.budget,
            action_timeout=rule.action_timeout,
            restart_after=rule.restart_after,
        )

    # --- history ----------------------------------------------------------------------------
    def shared_restarts(self) -> tuple[PastRestart, ...]:
        """The restarts the Lease holds (earlier holders' too); none without a Lease."""
        return () if self.lease is None else self.lease.shared

    # --- events -----------------------------------------------------------------------------
    def on_decision(self, alert: Alert, decision: Decision, target: Target | None) -> None:
        pod = _pod_of(target)
        if pod is None or not self.settings.events:
            return
        if decision.restarts:
            self._refusals_posted = {
                key: at for key, at in self._refusals_posted.items() if key[0] != pod
            }
            message = f"restarting ({decision.reason}): {decision.detail}"
            self._post(pod, EVENT_RESTARTING, message, warning=True)
        elif self._refusal_is_new(pod, decision.reason):
            message = f"restart refused ({decision.reason}): {decision.detail}"
            self._post(pod, EVENT_REFUSED, message, warning=False, action="RefuseRestart")
        else:
            self._counted("repeated")

    def _refusal_is_new(self, pod: tuple[str, str], reason: str) -> bool:
        """True (and remembered) unless the same refusal of this pod was posted lately."""
        now = self.clock()
        recent = {
            key: at
            for key, at in self._refusals_posted.items()
            if now - at < REFUSAL_EVENT_INTERVAL_SECONDS
        }
        if (pod, reason) in recent:
            self._refusals_posted = recent
            return False
        self._refusals_posted = {**recent, (pod, reason): now}
        return True

    def on_outcome(self, target: Target, result: str, detail: str) -> None:
        pod = _pod_of(target)
        if pod is None or not self.settings.events:
            return
        reason = EVENT_RESULT + "".join(part.title() for part in result.split("_"))
        self._post(pod, reason, f"{result}: {detail}", warning=result != "success")

    def _post(
        self,
        pod: tuple[str, str],
        reason: str,
        message: str,
        *,
        warning: bool,
        action: str = "Restart",
    ) -> None:
        if len(self._events) >= _MAX_EVENT_TASKS:
            self._counted("dropped")
            return
        # The uid now: a later read could find the pod that replaced this one.
        known = self._uids.get(pod)
        uid = known[0] if known else None
        task = asyncio.create_task(self._send(pod, reason, message, warning, action, uid))
        self._events.add(task)
        task.add_done_callback(self._events.discard)

    async def _send(
        self,
        pod: tuple[str, str],
        reason: str,
        message: str,
        warning: bool,
        action: str,
        uid: str | None,
    ) -> None:
        at = self.clock()
        try:
            if uid is None:  # a fixed target's pod, not read by a rule: read it now
                facts = await self.api.pod(*pod)
                uid = facts.uid if facts is not None else ""
            await self.api.event(
                pod, reason, message, warning=warning, at=at, uid=uid, action=action
            )
        except ApiException as error:
            log.warning("event %s on pod %s/%s not created: %s", reason, *pod, error.status)
            self._counted("failed")
            return
        self._counted("created")

    def _counted(self, result: str) -> None:
        if self.on_event is not None:
            self.on_event(result)

    async def flush_events(self) -> None:
        while self._events:
            await asyncio.gather(*set(self._events), return_exceptions=True)


def _renamed(alert: Alert, name: str) -> Alert:
    return replace(alert, labels={**alert.labels, TARGET_LABEL: name})


def _pod_of(target: Target | None) -> tuple[str, str] | None:
    if target is None or not isinstance(target.action, KubernetesAction):
        return None
    return target.action.namespace, target.action.pod


async def _named_validly(
    resolve: Callable[[Alert], Awaitable[tuple[Alert, Target | Decision]]],
    config: RestarterConfig,
    alert: Alert,
) -> tuple[Alert, Target | Decision]:
    """`resolve(alert)`, unless the pod or namespace it names is no Kubernetes name: then it is
    refused (`invalid_pod_name`) before any API call, and the alerts beside it still count."""
    problem = invalid_pod_names(config.rules, alert.labels)
    if problem is not None:
        return alert, Decision("skip", INVALID_POD_NAME, problem)
    return await resolve(alert)
