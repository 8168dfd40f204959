"""The restarter's `docker` action against a real Docker Engine API: podman's, on its socket.

Each test runs the restarter in-process with a target whose metrics read stalled (so the
confirmation passes) and whose action is `docker` on podman's socket, posts one alert and
reads the journal. The containers are small ones on the local Debian base, removed after.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.restarter import (
    alert,
    fake_vllm,
    payload,
    post_alerts,
    running_restarter,
    settle,
    target_entry,
    write_config,
)

from .images import StackImages
from .podman import Podman

# The container's own stop timeout: far longer than the action may take, so a restart that
# ignored the action's `t` would end as a timeout, not a success.
CONTAINER_STOP_TIMEOUT = 120
ACTION_TIMEOUT = "30s"


@pytest.fixture
def container(podman: Podman, images: StackImages) -> Iterator[str]:
    """A running container whose PID 1 (`sleep infinity`) ignores SIGTERM; removed after."""
    name = f"sw-action-{secrets.token_hex(4)}"
    podman.run(
        "run", "--detach", "--name", name, "--stop-timeout", str(CONTAINER_STOP_TIMEOUT),
        images.base.reference, "sleep", "infinity",
    )  # fmt: skip
    try:
        yield name
    finally:
        podman.run("rm", "--force", "--time", "0", name, check=False)


async def restart_through_the_restarter(
    tmp_path: Path, podman: Podman, container: str, stop_timeout: str
) -> dict[str, Any]:
    """One LLMServerStuck alert for a target restarted by `docker`; its journaled result."""
    async with fake_vllm("stalled") as fake:
        action = {
            "kind": "docker",
            "container": container,
            "socket": str(podman.socket),
            "stop_timeout": stop_timeout,
        }
        config = write_config(
            tmp_path,
            [target_entry("gpu1", fake.url, action, action_timeout=ACTION_TIMEOUT)],
        )
        async with running_restarter(config) as (client, restarter):
            answer = await post_alerts(client, payload(alert("gpu1")))
            assert answer["decisions"][0]["decision"] == "restart", answer
            await settle(restarter)
            entry = restarter.journal.recent(1)[0]
            assert entry.decision == "action_result"
            result: dict[str, Any] = entry.as_json()
            return result


async def test_a_restart_answers_204_and_restarts_the_container(
    tmp_path: Path, podman: Podman, container: str
) -> None:
    """POST /containers/NAME/restart answers 204: a journaled success, the container restarted."""
    before = podman.inspect(container)
    assert before is not None
    since = time.time() - 1
    result = await restart_through_the_restarter(tmp_path, podman, container, "1s")
    assert result["result"] == "success", result
    # PID 1 (`sleep`) ignores SIGTERM: the engine killed it after t, and its events say so.
    assert result["detail"] == (
        f"docker restarted {container} (t=1): it ignored SIGTERM: SIGKILL after 1 s"
    )
    after = podman.inspect(container)
    assert after is not None
    assert after["Id"] == before["Id"]
    assert after["State"]["Running"]
    assert after["State"]["StartedAt"] != before["State"]["StartedAt"]
    assert podman.container_events(container, since).count("restart") == 1


async def test_an_unknown_container_is_a_journaled_404_failure(
    tmp_path: Path, podman: Podman
) -> None:
    """A container the engine does not know: 404, journaled as a failure with its message."""
    missing = f"sw-action-missing-{secrets.token_hex(4)}"
    result = await restart_through_the_restarter(tmp_path, podman, missing, "1s")
    assert result["result"] == "failure", result
    assert result["detail"].startswith(f"docker answered 404 for {missing}: "), result
    assert "no such container" in result["detail"].lower()
    assert podman.inspect(missing) is None


async def test_the_stop_timeout_is_honoured(tmp_path: Path, podman: Podman, container: str) -> None:
    """`t` reaches the engine: SIGKILL after the action's 3 s, not the container's own 120 s,
    and the journaled detail says the engine had to kill."""
    result = await restart_through_the_restarter(tmp_path, podman, container, "3s")
    assert result["result"] == "success", result  # the container's 120 s would time out at 30 s
    assert result["detail"] == (
        f"docker restarted {container} (t=3): it ignored SIGTERM: SIGKILL after 3 s"
    )
    # PID 1 ignores SIGTERM, so only the kill after `t` ends it: the restart cannot be quicker.
    assert result["duration_seconds"] >= 3, result
    after = podman.inspect(container)
    assert after is not None
    assert after["State"]["Running"]
