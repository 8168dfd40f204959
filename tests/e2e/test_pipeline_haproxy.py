"""The whole chain to a real router: simulator -> exporter -> Prometheus -> Alertmanager ->
restarter -> HAProxy's agent-check. A server that hangs under load leaves HAProxy's rotation
on its alert, gets no user request while out, and returns once it moves again, unrestarted.

The stack is the restart pipeline's own (Alertmanager calls the real restarter on the port
Prometheus scrapes); HAProxy (Debian's package) runs in front of both simulated servers with
its agent-check on the restarter's `quarantine.agent_listen` (tests/support/quarantine_chain.py,
which the quarantine benchmark runs too).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.alerting_stack import running_stack
from tests.support.quarantine_chain import SHIPPED, freeze_through_haproxy
from tests.support.restarter_pipeline import REPO, RestarterStack

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def haproxy_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RestarterStack]:
    """Prometheus and Alertmanager whose restart alerts go to the real restarter's port."""
    with running_stack(RestarterStack(tmp_path_factory.mktemp("haproxy-stack"), REPO)) as stack:
        yield stack


@pytest.mark.long_wait
async def test_a_70_s_freeze_at_the_shipped_defaults_leaves_rotation_and_returns_unrestarted(
    haproxy_stack: RestarterStack, tmp_path: Path
) -> None:
    """At the shipped exporter, confirmation and look timings (Prometheus and Alertmanager at the
    harness' 1 s), a server frozen for 70 s with work in flight leaves HAProxy's rotation while
    frozen through the whole chain, gets no user request while out (the other server serves
    them), comes back once it moves, users reach it again, and it is never restarted."""
    run = await freeze_through_haproxy(haproxy_stack, tmp_path, SHIPPED, freeze_seconds=70.0)
    print(
        f"freeze -> out of rotation {run.freeze_to_out:.1f} s; moving again -> back "
        f"{run.end_to_back:.1f} s; users' requests to the frozen server: "
        f"{run.to_frozen_before_out} before it left, {run.to_frozen_while_out} while out"
    )
    assert run.routing[0] == ("quarantined", "stalled")
    assert run.routing[-1][0] == "released"
    assert run.to_frozen_while_out == 0
    assert run.to_others_while_out > 0
    assert run.reached_after_back
    assert not run.restarted
