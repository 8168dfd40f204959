"""The restarter's own metrics (names fixed by the project's shared contract)."""

from __future__ import annotations

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from stallwatch import __version__
from stallwatch.common.kubernetes_config import KubernetesAction
from stallwatch.common.restarter_config import RestarterConfig
from stallwatch.core.kube_routing import ROUTING_RESULTS

RESULTS = ("success", "failure", "timeout")
# The result of an eviction a PodDisruptionBudget refused (kubernetes actions only).
PDB_BLOCKED = "pdb_blocked"
# Alerts whose target is not configured are counted under this label value, so a hostile
# (but authenticated) sender cannot create series at will.
UNCONFIGURED_TARGET = ""


class RestarterMetrics:
    def __init__(self, config: RestarterConfig) -> None:
        # No `_created` series (a process-wide switch of prometheus_client, set when the first
        # restarter is built, never at import).
        prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=True)
        self.restarts = Counter(
            "stallwatch_restarter_restarts",
            "Restart actions run, by result.",
            ["target", "result"],
            registry=self.registry,
        )
        self.skips = Counter(
            "stallwatch_restarter_skips",
            "Firing restart alerts not acted on, by reason.",
            ["target", "reason"],
            registry=self.registry,
        )
        self.resolved = Counter(
            "stallwatch_restarter_resolved",
            "Resolved alerts journaled (never acted on).",
            ["target"],
            registry=self.registry,
        )
        self.webhook_requests = Counter(
            "stallwatch_restarter_webhook_requests",
            "Webhook requests answered, by HTTP status code.",
            ["code"],
            registry=self.registry,
        )
        self.journal_errors = Counter(
            "stallwatch_restarter_journal_errors",
            "Journal writes that failed after an action ran (its result was not journaled).",
            registry=self.registry,
        )
        self.action_duration = Histogram(
            "stallwatch_restarter_action_duration_seconds",
            "Duration of restart actions.",
            ["target"],
            buckets=(0.1, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600),
            registry=self.registry,
        )
        self.budget_exhausted = Gauge(
            "stallwatch_restarter_budget_exhausted",
            "1 when the target has used its whole restart budget in the current window.",
            ["target"],
            registry=self.registry,
        )
        self.last_restart = Gauge(
            "stallwatch_restarter_last_restart_timestamp_seconds",
            "Unix time of the target's latest restart decision.",
            ["target"],
            registry=self.registry,
        )
        self.kube_events = Counter(
            "stallwatch_restarter_kubernetes_events",
            "Kubernetes Events about restarts and refusals, by result "
            "(created, failed, dropped, repeated: a refusal already posted lately).",
            ["result"],
            registry=self.registry,
        )
        self.kube_routing = Counter(
            "stallwatch_restarter_kubernetes_routing",
            "Writes of the stallwatch.io/routable gate condition or label on pods, and what the "
            "restarter found, by result (gate_written, label_written, write_failed, sync_failed, "
            "ready_diverged: Ready read back disagrees with the gate, publish_not_ready_service: "
            "a Service that keeps pods out of rotation listed, label_conflict).",
            ["result"],
            registry=self.registry,
        )
        if config.kubernetes is not None:
            for result in ROUTING_RESULTS:
                self.kube_routing.labels(result=result)
        self.lease_holder = Gauge(
            "stallwatch_restarter_lease_holder",
            "1 while this replica holds the Lease and acts; 0 while it stands by.",
            ["lease"],
            registry=self.registry,
        )
        self.breaker_open = Gauge(
            "stallwatch_restarter_breaker_open",
            "1 while the latched breaker is open (no restarts until an operator resumes).",
            registry=self.registry,
        )
        self.paused = Gauge(
            "stallwatch_restarter_paused",
            "1 while restarts are paused for maintenance.",
            registry=self.registry,
        )
        self.stalled_targets = Gauge(
            "stallwatch_restarter_stalled_targets",
            "Targets with a firing restart alert the restarter has seen and not seen resolved.",
            registry=self.registry,
        )
        self.held_alerts = Gauge(
            "stallwatch_restarter_held_alerts",
            "Restart alerts waiting to be judged again: refused by the pause or the open "
            "breaker, or waiting for their restart window's or their hold's end.",
            registry=self.registry,
        )
        self.load_seconds = Gauge(
            "stallwatch_restarter_model_load_seconds",
            "The target's last measured time from a restart to its first read with engine "
            "metrics (cooldown: auto).",
            ["target"],
            registry=self.registry,
        )
        self.restart_after = Gauge(
            "stallwatch_restarter_restart_after_seconds",
            "The target's restart window: how long the restarter must itself see no progress "
            "before it restarts it.",
            ["target"],
            registry=self.registry,
        )
        self.restart_windows = Gauge(
            "stallwatch_restarter_restart_windows",
            "Confirmed stalls waiting out their restart window now.",
            registry=self.registry,
        )
        self.recovered_in_window = Counter(
            "stallwatch_restarter_recovered_in_window",
            "Confirmed stalls that recovered (or whose alert resolved) before their restart "
            "window ended: restarts that would have been false under a shorter window.",
            ["target"],
            registry=self.registry,
        )
        self.longest_recovered = Gauge(
            "stallwatch_restarter_longest_recovered_stall_seconds",
            "The longest stall, since this restarter started, that recovered inside its "
            "restart window, from the first confirmation to the recovery.",
            ["target"],
            registry=self.registry,
        )
        self.hold_expiry = Gauge(
            "stallwatch_restarter_hold_expiry_timestamp_seconds",
            "Unix time the target's hold ends (no series: not held). While held, no restart "
            "alert of the target is acted on.",
            ["target"],
            registry=self.registry,
        )
        self.routable = Gauge(
            "stallwatch_restarter_routable",
            "1 while the target is in users' rotation, 0 while the restarter has taken it out "
            "(a confirmed stall, or a restart it has not yet shown it recovered from).",
            ["target"],
            registry=self.registry,
        )
        self.routing = Gauge(
            "stallwatch_restarter_routing",
            "The routing verdict as a state set: 1 for the current reason (in_rotation, "
            "stalled, hung, restarting), 0 for the others.",
            ["target", "reason"],
            registry=self.registry,
        )
        self.quarantine_seconds = Gauge(
            "stallwatch_restarter_quarantine_seconds",
            "How long the target has been out of rotation so far (0 while in rotation).",
            ["target"],
            registry=self.registry,
        )
        self.quarantines = Counter(
            "stallwatch_restarter_quarantines",
            "Times the target was taken out of rotation, by why (stalled, hung).",
            ["target", "reason"],
            registry=self.registry,
        )
        self.releases = Counter(
            "stallwatch_restarter_releases",
            "Times the target came back into rotation, by why (progress, test_request_passed, "
            "recovered_in_window, expired, target_removed, disabled).",
            ["target", "reason"],
            registry=self.registry,
        )
        self.quarantine_refusals = Counter(
            "stallwatch_restarter_quarantine_refusals",
            "Confirmed stalls not taken out of rotation, by the guard that refused "
            "(last_in_pool, pool_share).",
            ["target", "reason"],
            registry=self.registry,
        )
        build_info = Gauge(
            "stallwatch_restarter_build_info",
            "The restarter's version.",
            ["version"],
            registry=self.registry,
        )
        build_info.labels(version=__version__).set(1)
        self.add_targets(config)

    def add_targets(self, config: RestarterConfig) -> None:
        """Series for every target of `config`, at zero, so rates work from the first restart."""
        for target in config.targets:
            kubernetes = isinstance(target.action, KubernetesAction)
            for result in (*RESULTS, PDB_BLOCKED) if kubernetes else RESULTS:
                self.restarts.labels(target=target.name, result=result)
            self.budget_exhausted.labels(target=target.name)
            self.restart_after.labels(target=target.name).set(target.restart_after)
            self.recovered_in_window.labels(target=target.name)
            self.routable.labels(target=target.name).set(1)
            self.quarantine_seconds.labels(target=target.name)

    def keep_only(self, targets: set[str]) -> int:
        """Remove every per-target series of a target not in `targets` (one that left the
        config on a reload, a pod that is gone); how many series went. The unconfigured
        target's series (`target=""`) stay."""
        kept = targets | {UNCONFIGURED_TARGET}
        removed = 0
        for family in self._per_target():
            names = family._labelnames
            gone = {
                tuple(sample.labels[name] for name in names)
                for metric in family.collect()
                for sample in metric.samples
                if all(name in sample.labels for name in names)
                and sample.labels["target"] not in kept
            }
            for values in gone:
                family.remove(*values)
                removed += 1
        return removed

    def _per_target(self) -> list[Counter | Gauge | Histogram]:
        return [
            family
            for family in vars(self).values()
            if isinstance(family, Counter | Gauge | Histogram) and "target" in family._labelnames
        ]

    def exposition(self) -> bytes:
        return prometheus_client.generate_latest(self.registry)
