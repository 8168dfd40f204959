"""Pods in and out of users' rotation through the API: the readiness gate condition or the label
`stallwatch.io/routable` (`kubernetes.quarantine_mode`); what to write is core/kube_routing.py's.

A sync over the pods of the restarter's namespaces keeps every opted-in pod's mark right: True
once its containers are ready (a readiness gate blocks by default: without the restarter a new
opted-in pod stays NotReady), False while its target is out of rotation. Each write is read back
after `readback_delay`, and a `Ready` that disagrees with the gate is logged and counted.
Only the replica that acts (the Lease holder) writes.
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

SYNC_INTERVAL_SECONDS = 5.0
# The kubelet acts on a gate change of a settled pod in tens of milliseconds.
READBACK_DELAY_SECONDS = 2.0
_MAX_READBACKS = 100

# The API calls each mode makes beyond the restart actions' (apiGroup, resource, verb), as an
# RBAC rule names them: deploy/kubernetes/restarter/rbac-<mode>.yaml grants exactly these (a
# unit test compares the two).
CALLS_BY_MODE: dict[QuarantineMode, frozenset[tuple[str, str, str]]] = {
    "readiness_gate": frozenset({("", "pods/status", "patch"), ("", "services", "list")}),
    "label": frozenset(
        {("", "pods", "patch"), ("apps", "replicasets", "get"), ("apps", "statefulsets", "get")}
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
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self.settled()

    async def settled(self) -> None:
        """Wait for every read-back under way."""
        while self._readbacks:
            await asyncio.gather(*set(self._readbacks), return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self.sync_interval)
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
    async def set(self, pods: Iterable[PodFacts], wanted: Routable) -> int:
        """Write `wanted` on each opted-in pod of a target (read just now); how many were
        written."""
        async with self._lock:
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
