"""Pod and namespace labels that are no Kubernetes name are refused before any API call.

`.` and `..` as a pod name would be normalised away in the API path (`…/pods/.` is the
namespace's pod list, `…/pods/..` the Namespace object); the restarter refuses them, and every
other name that is not a DNS-1123 subdomain (pods) or label (namespaces), as `invalid_pod_name`,
answers 200, and still acts on the legitimate alert delivered beside them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stallwatch.simulator.testing import running_simulator
from tests.support.kube_fake import make_pod
from tests.support.kube_restarter import (
    SERVER_LABELS,
    Clock,
    fake_kube,
    pod_alert,
    restarter_app,
    results,
    send,
    sim_port,
    write_config,
)
from tests.support.restarter import settle

BAD_PODS = [".", "..", "vllm-0/eviction", "VLLM-0", "-vllm", "vllm-", "a..b", "x" * 254, "%2e%2e"]


async def test_dot_pod_names_are_refused_and_the_legitimate_alert_still_acts(
    tmp_path: Path,
) -> None:
    """`.` and `..` beside a hung pod's alert in one notification: both refused as
    invalid_pod_name, the answer is 200, and the hung pod is evicted."""
    async with running_simulator() as sim, fake_kube() as fake:
        sim.apply_fault("freeze")
        fake.add_pod(make_pod("llm", "vllm-0", labels=SERVER_LABELS, port=sim_port(sim)))
        config = write_config(tmp_path, fake)
        async with restarter_app(config, Clock()) as (client, restarter):
            decisions = await send(
                client,
                pod_alert(".", fingerprint="f00d0000000000b1"),
                pod_alert("..", fingerprint="f00d0000000000b2"),
                pod_alert("vllm-0"),
            )
            await settle(restarter)
            assert [(d["decision"], d["reason"]) for d in decisions] == [
                ("skip", "invalid_pod_name"),
                ("skip", "invalid_pod_name"),
                ("restart", "confirmed"),
            ]
            assert fake.evicted == [("llm", "vllm-0")]
            assert results(restarter) == [("llm/vllm-0", "success")]
            skips = {e.fingerprint: e.reason for e in restarter.journal.recent(20)}
            assert skips["f00d0000000000b1"] == "invalid_pod_name"
            assert skips["f00d0000000000b2"] == "invalid_pod_name"
            metrics = await (await client.get("/metrics")).text()
    assert 'reason="invalid_pod_name"' in metrics


BAD_NAMES = [("llm", pod) for pod in BAD_PODS] + [
    ("..", "vllm-0"),
    ("llm/pods", "vllm-0"),
    ("LLM", "vllm-0"),
    ("l" * 64, "vllm-0"),
]


@pytest.mark.parametrize(("namespace", "pod"), BAD_NAMES)
async def test_names_that_are_no_kubernetes_name_are_refused(
    tmp_path: Path, namespace: str, pod: str
) -> None:
    """A pod label that is no DNS-1123 subdomain, or a namespace label that is no DNS-1123
    label, is refused as invalid_pod_name, journaled with why, and reaches no API (the
    routing sync, which lists pods, is off)."""
    async with fake_kube() as fake:
        config = write_config(tmp_path, fake, quarantine_mode="off")
        async with restarter_app(config, Clock()) as (client, restarter):
            decisions = await send(client, pod_alert(pod, namespace=namespace))
            [entry] = restarter.journal.recent(5)
    assert [(d["decision"], d["reason"]) for d in decisions] == [("skip", "invalid_pod_name")]
    assert "DNS-1123" in entry.detail
    assert ("namespace" if namespace != "llm" else "pod") in entry.detail
    assert fake.calls == []


@pytest.mark.parametrize("pod", ["vllm-0", "vllm.a-1", "0", "x" * 253])
async def test_valid_pod_names_are_read_from_the_api(tmp_path: Path, pod: str) -> None:
    """Valid names (dots, digits first, 253 characters) are asked of the API as before."""
    async with fake_kube() as fake:
        config = write_config(tmp_path, fake, quarantine_mode="off")
        async with restarter_app(config, Clock()) as (client, _):
            decisions = await send(client, pod_alert(pod))
    assert [(d["decision"], d["reason"]) for d in decisions] == [("skip", "pod_not_found")]
    assert fake.calls == [("", "pods", "get")]
