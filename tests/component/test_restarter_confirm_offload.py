"""The restarter's confirmation of a big `/metrics` is judged off the event loop, as the
exporter's polls are; a small one is judged inline."""

from __future__ import annotations

import threading
from typing import Any

import aiohttp
import pytest

from stallwatch.core import confirmation as core_confirmation
from stallwatch.net.offload import OFF_LOOP_BYTES
from stallwatch.restarter import confirm
from tests.support.exporter import big_metrics_server


def _payload(series: int) -> bytes:
    lines = [
        f'vllm:num_requests_running{{model_name="m",engine="{i}"}} 1\n'
        f'vllm:iteration_tokens_total_count{{model_name="m",engine="{i}"}} 5\n'
        for i in range(series)
    ]
    return "".join(lines).encode()


@pytest.mark.parametrize(("series", "off_loop"), [(4_000, True), (2, False)], ids=["big", "small"])
async def test_a_big_confirmation_is_judged_off_the_event_loop(
    monkeypatch: pytest.MonkeyPatch, series: int, off_loop: bool
) -> None:
    """Two reads of a frozen server with a payload of 128 KiB or more are judged in the offload
    pool's thread (on the loop they held the webhook and /-/healthy for seconds); a small
    payload's pair is judged on the loop's own thread, the reading is the whole payload's."""
    body = _payload(series)
    assert (len(body) >= OFF_LOOP_BYTES) is off_loop
    threads: list[int] = []
    real = core_confirmation.judge_attempts

    def judged(*args: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args)

    monkeypatch.setattr(confirm, "judge_attempts", judged)
    async with big_metrics_server(body) as url, aiohttp.ClientSession() as session:
        result = await confirm.confirm_stall(
            session, f"{url}/metrics", gap_seconds=0.05, timeout=10.0
        )
    assert len(threads) == 1
    assert (threads[0] != threading.get_ident()) is off_loop
    assert result.reading is not None
    assert len(result.reading.engines) == series
