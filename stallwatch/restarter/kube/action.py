"""The `kubernetes` restart action: evict the pod, delete it, or restart its owner.

A pod of a LeaderWorkerSet group is never restarted alone: the group's leader is evicted or
deleted, and LeaderWorkerSet recreates the whole group (its workers belong to the leader).
An eviction that a PodDisruptionBudget forbids (429) is the result `pdb_blocked`: not retried;
except for a pod stallwatch itself took out of rotation. That pod is not Ready, so its budget
counts it unhealthy and, under the default `unhealthyPodEvictionPolicy: IfHealthyBudget`, refuses
its eviction whenever the application is already at its minimum (a single replica always): it is
deleted instead, and the result's detail says so.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Literal

from stallwatch.common.kubernetes_config import KubernetesAction
from stallwatch.core.pod_rules import PodFacts, group_of
from stallwatch.restarter.kube.api import ApiException, KubeApi

KubeResult = Literal["success", "failure", "pdb_blocked"]
# Asks the Lease holder's fence before anything changes: True when this replica still holds
# the Lease and the restart is written into it.
Fence = Callable[[], Awaitable[bool]]
# Whether stallwatch took this pod (as read just now) out of rotation.
Quarantined = Callable[[PodFacts], bool]


# The API server's terminationGracePeriodSeconds when a pod's spec gives none.
DEFAULT_POD_GRACE_SECONDS = 30


def stop_bound(grace_period: int | None, pod: PodFacts) -> str:
    """How the kubelet stops the pod's containers, and within what bound: the action's
    `grace_period` if set (sent with the eviction or delete), else the pod's own."""
    if grace_period is not None:
        return f"SIGTERM, then the kubelet's SIGKILL after {grace_period} s (grace_period)"
    grace = pod.termination_grace_period
    if grace is None:
        grace = DEFAULT_POD_GRACE_SECONDS
    return f"SIGTERM, then the kubelet's SIGKILL after {grace} s (terminationGracePeriodSeconds)"


def _api_error(error: ApiException) -> str:
    said = _api_message(error)
    answer = f"the API answered {error.status} {error.reason or ''}".rstrip()
    return f"{answer}: {said}" if said else answer


def _status(error: ApiException) -> dict[str, object]:
    """The Status object the API sent with an error (empty when the body is not one)."""
    try:
        body = json.loads(error.body or "")
    except (TypeError, ValueError):
        return {}
    return body if isinstance(body, dict) and body.get("kind") == "Status" else {}


def _api_message(error: ApiException) -> str:
    message = _status(error).get("message")
    return message if isinstance(message, str) else ""


def budget_cause(error: ApiException) -> str:
    """Why the API refused an eviction, in its own words: the cause it gives for the
    PodDisruptionBudget ("needs 2 healthy pods and has 2 currently", "is still being
    processed by the server"), or "" if it gave none."""
    details = _status(error).get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    for cause in causes if isinstance(causes, list) else []:
        if isinstance(cause, dict) and cause.get("reason") == "DisruptionBudget":
            message = cause.get("message")
            if isinstance(message, str):
                return message
    return ""


class PodRestarter:
    """Runs kubernetes actions against one API."""

    def __init__(
        self,
        api: KubeApi,
        *,
        fence: Fence | None = None,
        clock: Callable[[], float] = time.time,
        quarantined: Quarantined | None = None,
    ) -> None:
        self.api = api
        self.fence = fence
        self.clock = clock
        self.quarantined = quarantined

    async def restart(self, action: KubernetesAction) -> tuple[KubeResult, str]:
        try:
            return await self._restart(action)
        except ApiException as error:
            return "failure", f"{action.namespace}/{action.pod}: {_api_error(error)}"

    async def _restart(self, action: KubernetesAction) -> tuple[KubeResult, str]:
        pod = await self.api.pod(action.namespace, action.pod)
        if pod is None:
            return "failure", f"pod {action.namespace}/{action.pod} no longer exists"
        group = group_of(pod.labels)
        victim = pod
        if group is not None:
            if action.mode == "rollout_restart":
                return "failure", (
                    f"pod {pod.name} is in LeaderWorkerSet {group.set_name} group "
                    f"{group.group_index}: a rollout restart would restart every group; "
                    "use mode evict or delete (the group restarts through its leader)"
                )
            leaders = await self.api.pods(pod.namespace, group.leader_selector)
            if len(leaders) != 1:
                return "failure", (
                    f"LeaderWorkerSet {group.set_name} group {group.group_index}: found "
                    f"{len(leaders)} leader pods, expected 1; the group is left alone"
                )
            victim = leaders[0]
        if self.fence is not None and not await self.fence():
            return "failure", "this replica no longer holds the Lease: another one acts"
        return await self._act(action, pod, victim, group is not None)

    async def _act(
        self, action: KubernetesAction, pod: PodFacts, victim: PodFacts, in_group: bool
    ) -> tuple[KubeResult, str]:
        what = f"pod {victim.namespace}/{victim.name}"
        if in_group:
            what += f" (leader of the group of {pod.name}: the group is recreated)"
        if action.mode == "evict":
            try:
                await self.api.evict(victim.namespace, victim.name, action.grace_period)
            except ApiException as error:
                if error.status == 429:
                    cause = budget_cause(error)
                    because = f" ({cause})" if cause else ""
                    if self._out_of_rotation(pod, victim):
                        await self.api.delete(victim.namespace, victim.name, action.grace_period)
                        return "success", (
                            f"deleted {what} after the PodDisruptionBudget refused the eviction "
                            f"of a pod stallwatch had taken out of rotation{because}: "
                            f"{stop_bound(action.grace_period, victim)}"
                        )
                    return "pdb_blocked", (
                        f"eviction of {what} refused: a PodDisruptionBudget allows no "
                        f"disruption now{because}; left alone, not retried"
                    )
                raise
            return "success", f"evicted {what}: {stop_bound(action.grace_period, victim)}"
        if action.mode == "delete":
            await self.api.delete(victim.namespace, victim.name, action.grace_period)
            return "success", f"deleted {what}: {stop_bound(action.grace_period, victim)}"
        workload = await self.api.workload_of(pod)
        if workload is None:
            return "failure", (
                f"pod {pod.namespace}/{pod.name} is run by no Deployment or StatefulSet: "
                "nothing to rollout-restart"
            )
        kind, name = workload
        await self.api.rollout_restart(pod.namespace, kind, name, self.clock())
        return "success", (
            f"rollout restart of {kind} {pod.namespace}/{name} (for {pod.name}): "
            f"{stop_bound(None, pod)}"
        )

    def _out_of_rotation(self, pod: PodFacts, victim: PodFacts) -> bool:
        """Whether stallwatch took the pod (or the group's leader) out of rotation."""
        if self.quarantined is None:
            return False
        return self.quarantined(pod) or self.quarantined(victim)
