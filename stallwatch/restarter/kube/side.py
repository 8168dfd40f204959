"""The restarter's Kubernetes side: turning alerts into pod targets by the allow-rules,
the Lease, and an Event on the pod for every restart and refusal.

It is the restarter's platform on Kubernetes (`restarter/platform.py`): the restarter asks it
what the plain platform answers alone (`resolve_notification`, `effective`, `shared_restarts`,
`pool_members`, `acting`) and tells it what happened (`on_decision`, `on_outcome`,
`on_routing`); everything it decides about a pod comes from the rule and the API object.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace

from stallwatch.common.kubernetes_config import KubernetesAction
from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.core.alert_plan import RoutingChange
from stallwatch.core.alerts import TARGET_LABEL, Alert, Notification
from stallwatch.core.kube_names import INVALID_POD_NAME, invalid_pod_names
from stallwatch.core.kube_routing import IN_ROTATION, Routable, camel, pool_of, taken_out
from stallwatch.core.kube_routing import pool_members as members_of_pool
from stallwatch.core.pod_rules import (
    PodFacts,
    PodName,
    Refusal,
    group_of,
    label_selector,
    metrics_url,
    rule_for_pod,
    rules_for_alert,
    target_name,
)
from stallwatch.core.policy import Decision, PastRestart, lookback_seconds
from stallwatch.restarter.kube.action import PodRestarter
from stallwatch.restarter.kube.api import API_ERRORS, ApiException, KubeApi, answer_of
from stallwatch.restarter.kube.lease import LeaseKeeper
from stallwatch.restarter.kube.routing import PodRouting

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
# The alerts of one pool that arrive together list its pods once.
POOL_LIST_FRESH_SECONDS = 1.0


class KubeSide:
    def __init__(
        self,
        api: KubeApi,
        config: RestarterConfig,
        *,
        clock: Callable[[], float],
        own_restarts: Callable[[float], tuple[PastRestart, ...]],
        on_event: Callable[[str], None] | None = None,
        on_routing_count: Callable[[str], None] | None = None,
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
        self.actor = PodRestarter(
            api,
            fence=self.lease.fence if self.lease else None,
            clock=clock,
            quarantined=self._taken_out,
        )
        # Targets this side took out of rotation (on_routing), and the restarter's own verdict
        # if it sets one (`routable`: target name -> in rotation); either keeps a pod out.
        self.out_of_rotation: set[str] = set()
        self.routable: Callable[[str], bool] | None = None
        self.routing: PodRouting | None = None
        if settings.quarantine_mode != "off":
            self.routing = PodRouting(
                api,
                settings.quarantine_mode,
                clock=clock,
                namespaces=self._namespaces,
                out=self._out,
                acting=lambda: self.acting,
                on_count=on_routing_count,
            )
        # Pod targets resolved by the rules: name -> (target, last seen).
        self.pod_targets: dict[str, tuple[Target, float]] = {}
        self.on_event = on_event
        self._events: set[asyncio.Task[None]] = set()
        # (pod, refusal reason) -> when its last Event was posted.
        self._refusals_posted: dict[tuple[tuple[str, str], str], float] = {}
        # (namespace, pod) -> (its uid as last read, when): the uid an Event names.
        self._uids: dict[tuple[str, str], tuple[str, float]] = {}
        # The pods listed around alerts' pods (their pools), by (namespace, name), and when
        # each pool was listed (monotonic seconds).
        self._listed: dict[tuple[str, str], PodFacts] = {}
        self._pool_listed_at: dict[str, float] = {}

    @classmethod
    async def connect(
        cls,
        config: RestarterConfig,
        *,
        clock: Callable[[], float],
        own_restarts: Callable[[float], tuple[PastRestart, ...]],
        on_event: Callable[[str], None] | None = None,
        on_routing_count: Callable[[str], None] | None = None,
    ) -> KubeSide:
        assert config.kubernetes is not None
        api = await KubeApi.connect(config.kubernetes)
        return cls(
            api,
            config,
            clock=clock,
            own_restarts=own_restarts,
            on_event=on_event,
            on_routing_count=on_routing_count,
        )

    async def start(self) -> None:
        """Take or follow the Lease, then start the routing sync (label mode: raises
        `LabelSelectorConflict` when a workload selects on the label)."""
        if self.lease is not None:
            await self.lease.step()
            self.lease.start()
        if self.routing is not None:
            try:
                await self.routing.start()
            except BaseException:
                if self.lease is not None:
                    await self.lease.stop()
                await self.api.close()
                raise

    async def stop(self) -> None:
        if self.routing is not None:
            await self.routing.stop()
        if self.lease is not None:
            await self.lease.stop()
        if self._events:
            await asyncio.gather(*set(self._events), return_exceptions=True)
        await self.api.close()

    @property
    def adds_targets(self) -> bool:
        """Alerts bring pod targets (the allow-rules resolve them)."""
        return True

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

    # --- out of rotation ---------------------------------------------------------------------
    def _namespaces(self) -> set[str]:
        """The namespaces whose pods the restarter may act on: its rules' and its fixed pod
        targets'."""
        names = {namespace for rule in self.config.rules for namespace in rule.namespaces}
        for target in self.config.targets:
            pod = _pod_of(target)
            if pod is not None and pod[0]:
                names.add(pod[0])
        return names

    def _out(self, name: str) -> bool:
        return name in self.out_of_rotation or (
            self.routable is not None and not self.routable(name)
        )

    def _taken_out(self, pod: PodFacts) -> bool:
        """Whether stallwatch took this pod (or the target it belongs to) out of rotation:
        its own record, or the mark on the pod as read (another replica may have written it)."""
        return self._out(target_name(pod)) or taken_out(pod)

    def pool_members(self, target: Target) -> tuple[str, ...]:
        """The targets of `target`'s pool, itself included. A pod target a rule resolved: the
        pods of its workload that serve (those that never alerted too) and those out of
        rotation, from the pods as last listed (on each alert and by the routing sync). A fixed
        target: the configured targets with its `pool`."""
        if target.name not in self.pod_targets:
            fixed = {t.name for t in self.config.targets if t.pool == target.pool}
            return tuple(sorted(fixed | {target.name}))
        pods: Iterable[PodFacts] = self.pods.values()
        out = {name for name in self.out_of_rotation if self._pool_of_name(name) == target.pool}
        return tuple(sorted(set(members_of_pool(pods, target.pool, out)) | {target.name}))

    def _pool_of_name(self, name: str) -> str | None:
        known = self.pod_targets.get(name)
        return known[0].pool if known else None

    @property
    def pods(self) -> dict[tuple[str, str], PodFacts]:
        """The pods as last listed: by the routing sync, and around each alert's pod."""
        if self.routing is not None:
            merged = dict(self._listed)
            merged.update(self.routing.pods)
            return merged
        return self._listed

    async def _list_pool(self, rule_selector: str, pod: PodFacts) -> None:
        """List the pods beside an alert's pod (its pool's members, that never alerted too);
        once for the alerts of one pool that arrive together."""
        pool = pool_of(pod)
        now = time.monotonic()
        if now - self._pool_listed_at.get(pool, -POOL_LIST_FRESH_SECONDS) < POOL_LIST_FRESH_SECONDS:
            return
        self._pool_listed_at[pool] = now
        try:
            listed = await self.api.pods(pod.namespace, rule_selector)
        except API_ERRORS as error:
            log.warning("pods of %s/%s not listed: %s", pod.namespace, pod.name, answer_of(error))
            return
        for key in [k for k, p in self._listed.items() if pool_of(p) == pool]:
            del self._listed[key]
        for other in listed:
            if pool_of(other) == pool:
                self._listed[(other.namespace, other.name)] = other

    async def on_routing(self, change: RoutingChange, target: Target) -> None:
        """A target left or returned to rotation: write it on its opted-in pods (the group's,
        for a LeaderWorkerSet group). A refused quarantine writes nothing."""
        if change.move == "refused":
            return
        out = change.move in ("quarantined", "restarting")
        if out:
            wanted = Routable(False, camel(change.reason), change.detail or change.reason)
        else:
            message = f"back in rotation ({change.reason}) after {change.out_for:.0f} s"
            wanted = Routable(True, IN_ROTATION, message)
        if self.routing is None:
            self._record_out(target.name, out)
            return
        async with self.routing.lock:  # no sync or watch event writes in between
            self._record_out(target.name, out)
            pod = _pod_of(target)
            if pod is None or not self.acting:
                return
            try:
                pods = await self._pods_of(*pod)
            except API_ERRORS as error:
                log.warning("pods of %s not read: %s", target.name, answer_of(error))
                return
            await self.routing.set(pods, wanted)

    def _record_out(self, name: str, out: bool) -> None:
        if out:
            self.out_of_rotation.add(name)
        else:
            self.out_of_rotation.discard(name)

    async def _pods_of(self, namespace: str, name: str) -> list[PodFacts]:
        """The pod, or every pod of its LeaderWorkerSet group, read now."""
        facts = await self.api.pod(namespace, name)
        if facts is None:
            return []
        group = group_of(facts.labels)
        if group is None:
            return [facts]
        selector = group.leader_selector.rsplit(",", 1)[0]  # the group, every worker index
        return await self.api.pods(namespace, selector)

    # --- targets from the rules -------------------------------------------------------------
    def effective(self, config: RestarterConfig) -> RestarterConfig:
        """`config` with the pod targets the rules resolved (fixed targets win a name clash)."""
        self.config = config
        now = self.clock()
        forget = now - max(FORGET_AFTER_SECONDS, self.lookback)
        for name in [n for n, (_, seen) in self.pod_targets.items() if seen < forget]:
            del self.pod_targets[name]
        for pod in [p for p, (_, seen) in self._uids.items() if seen < forget]:
            del self._uids[pod]
        pools = {target.pool for target, _ in self.pod_targets.values()}
        for key in [k for k, p in self._listed.items() if pool_of(p) not in pools]:
            del self._listed[key]
        self._pool_listed_at = {p: at for p, at in self._pool_listed_at.items() if p in pools}
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
        await self._list_pool(label_selector(rule.selector), pod)
        return Target(
            name=target_name(pod),
            metrics_url=url,
            action=replace(rule.action, namespace=pod.namespace, pod=pod.name),
            cooldown=rule.cooldown,
            budget=rule.budget,
            action_timeout=rule.action_timeout,
            restart_after=rule.restart_after,
            pool=pool_of(pod),
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
