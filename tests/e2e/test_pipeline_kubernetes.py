"""A hung pod through the whole chain: simulator (the pod's server) -> exporter -> Prometheus ->
Alertmanager -> the real restarter -> one eviction through a protocol-level Kubernetes API.

The exporter's target carries the pod's `namespace` and `pod` labels (as the Kubernetes scrape
job's relabeling gives them); the restarter's allow-rule reads the pod from the API, confirms
the stall at the pod's own IP and named port, and evicts it once through the real client
library. The stack is that of `test_pipeline_restarter.py`.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from types import MappingProxyType
from typing import Any

import aiohttp
import pytest

from stallwatch.core.classify import State
from tests.support.alerting_stack import poll
from tests.support.exporter import wait_for_state
from tests.support.kube_fake import make_pod
from tests.support.kube_restarter import SERVER_LABELS, fake_kube
from tests.support.pipeline import TIMEOUT, exporter_on_stack, restarter_process, target, unique
from tests.support.restarter_pipeline import (
    HTTP,
    RestarterStack,
    loaded,
    restarter_stack,
    rows,
    simulator,
)

pytestmark = pytest.mark.e2e

__all__ = ["restarter_stack"]  # the module-scoped stack fixture, used by name


async def test_a_hung_pod_is_evicted_once_through_the_whole_chain(
    restarter_stack: RestarterStack, tmp_path: Path
) -> None:
    """LLMServerStuck for a pod reaches the real restarter, which finds the pod by its labels in
    the API, confirms the stall at the pod's IP and port, and evicts it exactly once."""
    stack, pod = restarter_stack, unique("vllm")
    async with fake_kube() as fake:
        with simulator(tmp_path) as sim:
            fake.add_pod(make_pod("llm", pod, labels=SERVER_LABELS, port=sim.port))
            token_file = tmp_path / "restarter.token"
            token_file.write_text(stack.token + "\n")
            token_file.chmod(0o600)
            config: dict[str, Any] = {
                "listen": stack.restarter_address,
                "token_file": str(token_file),
                "journal": str(tmp_path / "journal.sqlite"),
                "confirm": {"gap": "1s", "timeout": "1s"},
                "restart_after": "0s",
                "kubernetes": {"kubeconfig": str(fake.kubeconfig(tmp_path))},
                "rules": [
                    {
                        "name": "vllm",
                        "namespaces": ["llm"],
                        "selector": SERVER_LABELS,
                        "metrics_port": "http",
                        "action": {"kind": "kubernetes", "mode": "evict"},
                        "cooldown": "10m",
                    }
                ],
            }
            # The labels the Kubernetes scrape job's relabeling puts on a pod's series.
            labels = MappingProxyType({"namespace": "llm", "pod": pod})
            server = dataclasses.replace(target(pod, sim.url), labels=labels)
            async with (
                aiohttp.ClientSession(timeout=HTTP) as session,
                restarter_process(
                    config,
                    tmp_path,
                    url=f"http://{stack.restarter_address}",
                    token=stack.token,
                    timeout=TIMEOUT,
                ) as restarter,
                exporter_on_stack(stack, server) as service,
                loaded(sim, session, concurrency=2),
            ):
                await stack.wait_for_query('up{job="stallwatch-restarter"} == 1', TIMEOUT)
                await wait_for_state(service, pod, State.BUSY, polls=2, timeout=TIMEOUT)
                hung_at = time.time()
                await sim.fault(session, "hang")

                async def evicted() -> list[dict[str, Any]] | None:
                    entries = await restarter.journal(session)
                    return entries if rows(entries, f"llm/{pod}", "action_result") else None

                entries = await poll(evicted, 60, f"an eviction of {pod}\n{restarter.log_tail()}")
                took = time.time() - hung_at
                # Later notifications of the same alert find no pod (it was evicted) or a
                # duplicate: never a second eviction.
                await stack.wait_for_query(
                    f'ALERTS{{alertname="LLMServerStuck",pod="{pod}",alertstate="firing"}}',
                    TIMEOUT,
                )
                entries = await restarter.journal(session)
    print(f"hang -> pod evicted: {took:.2f} s")

    (restart,) = rows(entries, f"llm/{pod}", "restart")
    (result,) = rows(entries, f"llm/{pod}", "action_result")
    assert restart["alertname"] == "LLMServerStuck"
    assert restart["reason"] == "confirmed"
    assert result["result"] == "success", result
    assert fake.evicted == [("llm", pod)]
