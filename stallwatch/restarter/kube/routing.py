"""Pods in and out of users' rotation through the API: the readiness gate condition or the label
`stallwatch.io/routable` (`kubernetes.quarantine_mode`); what to write is core/kube_routing.py's.

A watch of the pods of the restarter's namespaces, and a full sync at start and every 30 s, keep
every opted-in pod's mark right: True once its containers are ready (a readiness gate blocks by
default: without the restarter a new opted-in pod stays NotReady), False while its target is
out of rotation. Each write is read back after `readback_delay`, and a `Ready` that disagrees
with the gate is logged and counted. Only the replica that acts (the Lease holder) writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable

from stallwatch.common.kubernetes_config import QuarantineMode
from stallwatch.core.kube_routing import (
    ROUTABLE,
    LabelSelectorConflict,
    Routable,
    RoutingMode,
    RoutingResult,
    gate_condition,
    gate_patch,
    in_sync,
    label_patch,
    opted_in,
    ready_divergence,
    selector_conflict,
    selects,
)
from stallwatch.core.pod_rules import PodFacts, target_name
from stallwatch.restarter.kube.api import API_ERRORS, KubeApi, answer_of, rfc3339_time

__all__ = ["CALLS_BY_MODE", "LabelSelectorConflict", "PodRouting"]

log = logging.getLogger("stallwatch.restarter")

# The pods are watched (a new pod's gate is written as soon as its containers are ready); a
# full list, and the Services' check, every SYNC_INTERVAL_SECONDS catches what a watch missed.
SYNC_INTERVAL_SECONDS = 30.0
# Each watch ends after this long and starts anew (the API sends every pod again).
WATCH_SECONDS = 300.0
# After a watch broke (the API refused it or could not be reached), the next one waits this long.
WATCH_RETRY_SECONDS = 5.0
# The kubelet acts on a gate change of a settled pod in tens of milliseconds.
READBACK_DELAY_SECONDS = 2.0
_MAX_READBACKS = 100

# The API calls each mode makes beyond the restart actions' (apiGroup, resource, verb), as an
# RBAC rule names them: deploy/kubernetes/restarter/rbac-<mode>.yaml and the chart's
# ClusterRole grant exactly these (a unit test and a contract test compare them).
CALLS_BY_MODE: dict[QuarantineMode, frozenset[tuple[str, str, str]]] = {
    "readiness_gate": frozenset(
        {("", "pods", "watch"), ("", "pods/status", "patch"), ("", "services", "list")}
    ),
    "label": frozenset(
        {
            ("", "pods", "watch"),
            ("", "pods", "patch"),
            ("apps", "replicasets", "get"),
            ("apps", "statefulsets", "get"),
        }
    ),
    "off": frozenset(),
}


class PodRouting:
    """Writes stallwatch's verdict on opted-in pods, in one mode."""

    def __init__(
        self,
        api: KubeApi,
        mode: RoutingMode,
        *,
        clock: Callable[[], float],
        namespaces: Callable[[], Iterable[str]],
        out: Callable[[str], bool],
        acting: Callable[[], bool],
        on_count: Callable[[str], None] | None = None,
        sync_interval: float = SYNC_INTERVAL_SECONDS,
        readback_delay: float = READBACK_DELAY_SECONDS,
        watch_seconds: float = WATCH_SECONDS,
        watch_retry: float = WATCH_RETRY_SECONDS,
    ) -> None:
        self.api = api
        self.mode: RoutingMode = mode
        self.clock = clock
        self.namespaces = namespaces
        self.out = out
        self.acting = acting
        self.on_count = on_count
        self.sync_interval = sync_interval
        self.readback_delay = readback_delay
        self.watch_seconds = watch_seconds
        self.watch_retry = watch_retry
        # namespace -> the task watching its pods.
        self._watches: dict[str, asyncio.Task[None]] = {}
        # The pods of the restarter's namespaces as last listed: (namespace, name) -> facts.
        self.pods: dict[tuple[str, str], PodFacts] = {}
        self.divergences = 0
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._readbacks: set[asyncio.Task[None]] = set()
        self._warned_services: set[tuple[str, str]] = set()
        # label mode: (namespace, kind, name) of each owner checked -> why it conflicts, or "".
        self._owners: dict[tuple[str, str, str], str] = {}

    # --- life ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Sync once (label mode: first refuse to start on a selector conflict), then keep the
        pods in sync in the background."""
        if self.mode == "label":
            try:
                await self._list()
                conflicts = {why for why in [await self._conflict(p) for p in self._opted()] if why}
            except API_ERRORS as error:
                raise LabelSelectorConflict(
                    "quarantine_mode label: the pods' owners and their selectors could not be "
                    f"read ({answer_of(error)}; rbac-label.yaml grants what is needed)"
                ) from error
            if conflicts:
                raise LabelSelectorConflict(
                    "quarantine_mode label: " + "; ".join(sorted(conflicts))
                )
        await self.sync_or_log()
        self._follow_namespaces()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        tasks = [t for t in (self._task, *self._watches.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._watches.clear()
        await self.settled()

    def _follow_namespaces(self) -> None:
        """One watch per namespace of the restarter's (they change with a reload)."""
        wanted = set(self.namespaces())
        for namespace in set(self._watches) - wanted:
            self._watches.pop(namespace).cancel()
        for namespace in wanted - set(self._watches):
            self._watches[namespace] = asyncio.create_task(self._watch(namespace))

    async def _watch(self, namespace: str) -> None:
        """Follow the namespace's pods: each one reported (new, changed) gets its mark at once
        if it needs one; a broken watch starts again after `watch_retry`."""
        while True:
            try:
                async for kind, pod in self.api.watch_pods(namespace, self.watch_seconds):
                    await self._seen(kind, pod)
                continue
            except API_ERRORS as error:
                log.debug("pods of %s not watched: %s", namespace, answer_of(error))
            except Exception as error:  # a watch must outlive an answer it cannot read
                log.warning("pods of %s not watched: %s", namespace, error)
            await asyncio.sleep(self.watch_retry)

    async def _seen(self, kind: str, pod: PodFacts) -> None:
        key = (pod.namespace, pod.name)
        if kind == "DELETED":
            self.pods.pop(key, None)
            return
        self.pods[key] = pod
        if not self.acting() or in_sync(pod, self.out(target_name(pod)), self.mode) is None:
            return
        async with self._lock:  # the event may be older than a write since: read it again
            fresh = await self._fresh(pod)
            if fresh is None:
                return
            wanted = in_sync(fresh, self.out(target_name(fresh)), self.mode)
            if wanted is not None:
                await self._write(fresh, wanted)

    async def _fresh(self, pod: PodFacts) -> PodFacts | None:
        """The pod as it is now (None: gone, replaced, or not readable)."""
        try:
            again = await self.api.pod(pod.namespace, pod.name)
        except API_ERRORS as error:
            log.warning("pod %s/%s not read: %s", pod.namespace, pod.name, answer_of(error))
            return None
        return again if again is not None and again.uid == pod.uid else None

    async def settled(self) -> None:
        """Wait for every read-back under way."""
        while self._readbacks:
            await asyncio.gather(*set(self._readbacks), return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval)
            self._follow_namespaces()
            await self.sync_or_log()

    async def sync_or_log(self) -> None:
        """`sync`, logging and counting an API that refuses or cannot be reached."""
        try:
            await self.sync()
        except API_ERRORS as error:
            log.warning("routing sync: %s", answer_of(error))
            self._counted("sync_failed")

    # --- the sync --------------------------------------------------------------------------
    async def sync(self) -> int:
        """List the pods and write each opted-in one's mark where it is wrong; how many were
        written. Only the acting replica writes."""
        async with self._lock:
            await self._list()
            if not self.acting():
                return 0
            if self.mode == "readiness_gate":
                await self._check_services()
            written = 0
            for pod in self._opted():
                wanted = in_sync(pod, self.out(target_name(pod)), self.mode)
                if wanted is not None and await self._write(pod, wanted):
                    written += 1
            return written

    def _opted(self) -> list[PodFacts]:
        return [pod for pod in self.pods.values() if opted_in(pod, self.mode)]

    async def _list(self) -> None:
        listed: dict[tuple[str, str], PodFacts] = {}
        for namespace in sorted(set(self.namespaces())):
            for pod in await self.api.pods(namespace, ""):
                listed[(pod.namespace, pod.name)] = pod
        self.pods = listed

    async def _check_services(self) -> None:
        """Warn once per Service that lists not-Ready pods and selects an opted-in pod: it
        keeps a quarantined pod among its endpoints."""
        opted = self._opted()
        for namespace in sorted({pod.namespace for pod in opted}):
            for service in await self.api.services(namespace):
                key = (service.namespace, service.name)
                if not service.publish_not_ready or key in self._warned_services:
                    continue
                if any(
                    pod.namespace == namespace and selects(service.selector, pod.labels)
                    for pod in opted
                ):
                    self._warned_services.add(key)
                    log.warning(
                        "Service %s/%s sets publishNotReadyAddresses: true and selects pods "
                        "with the %s gate: it keeps them listed while they are out of rotation; "
                        "route users through a Service without it",
                        *key,
                        ROUTABLE,
                    )
                    self._counted("publish_not_ready_service")

    # --- one target ------------------------------------------------------------------------
    @property
    def lock(self) -> asyncio.Lock:
        """Held by every write: a routing change holds it from its record to its writes, so a
        sync or a watch event never writes between them."""
        return self._lock

    async def set(self, pods: Iterable[PodFacts], wanted: Routable) -> int:
        """Write `wanted` on each opted-in pod of a target, read just now under `lock` (the
        caller holds it); how many were written."""
        written = 0
        for pod in pods:
            if opted_in(pod, self.mode) and await self._write(pod, wanted):
                written += 1
        return written

    async def _write(self, pod: PodFacts, wanted: Routable) -> bool:
        if self.mode == "label":
            if await self._conflict(pod):
                return False
            patch = label_patch(pod, wanted)
        else:
            element = gate_condition(pod, wanted, rfc3339_time(self.clock()))
            patch = None if element is None else gate_patch(element)
        if patch is None:
            return False
        try:
            if self.mode == "label":
                await self.api.patch_labels(pod.namespace, pod.name, patch)
            else:
                await self.api.patch_status(pod.namespace, pod.name, patch)
        except API_ERRORS as error:
            log.warning(
                "pod %s/%s: %s not written: %s", pod.namespace, pod.name, ROUTABLE, answer_of(error)
            )
            self._counted("write_failed")
            return False
        log.info(
            "pod %s/%s: %s=%s (%s: %s)",
            pod.namespace,
            pod.name,
            ROUTABLE,
            "true" if wanted.routable else "false",
            wanted.reason,
            wanted.message,
        )
        self._counted("label_written" if self.mode == "label" else "gate_written")
        if self.mode == "readiness_gate" and len(self._readbacks) < _MAX_READBACKS:
            task = asyncio.create_task(self._read_back(pod, wanted.routable))
            self._readbacks.add(task)
            task.add_done_callback(self._readbacks.discard)
        return True

    async def _read_back(self, pod: PodFacts, routable: bool) -> None:
        """Read the pod again once the kubelet has had time, and report a `Ready` that
        disagrees with the gate."""
        await asyncio.sleep(self.readback_delay)
        try:
            again = await self.api.pod(pod.namespace, pod.name)
        except API_ERRORS as error:
            log.warning("pod %s/%s not read back: %s", pod.namespace, pod.name, answer_of(error))
            return
        if again is None or again.uid != pod.uid:
            return
        why = ready_divergence(again, routable, self.readback_delay)
        if why is not None:
            self.divergences += 1
            log.warning("%s", why)
            self._counted("ready_diverged")

    async def _conflict(self, pod: PodFacts) -> str:
        """label mode: why the pod's controller forbids flipping the label ("": it does not)."""
        if pod.owner is None:
            return ""
        kind, name = pod.owner
        key = (pod.namespace, kind, name)
        if key not in self._owners:
            selector = await self.api.owner_selector(pod.namespace, kind, name)
            why = None
            if selector is not None:
                where = f"{pod.namespace}/{name}"
                why = selector_conflict(
                    kind, where, selector.match_labels, selector.match_expressions
                )
            self._owners[key] = why or ""
            if why:
                log.error("label mode: pod %s/%s left alone: %s", pod.namespace, pod.name, why)
                self._counted("label_conflict")
        return self._owners[key]

    def _counted(self, result: RoutingResult) -> None:
        if self.on_count is not None:
            self.on_count(result)
