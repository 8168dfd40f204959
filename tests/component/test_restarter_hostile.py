"""Hostile input: random JSON and random bytes never get a 5xx and never run an action."""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stallwatch.common.restarter_config import DEFAULT_RESTART_ALERTS as RESTART_ALERTS
from stallwatch.restarter.app import RESTARTER_KEY, Restarter, build_app
from tests.support.restarter import (
    METRICS_TEMPLATE,
    STARTS_AT,
    TOKEN,
    marker_argv,
    target_entry,
    write_config,
)


@dataclass
class Running:
    port: int
    marker: Path
    restarter: Restarter


@contextlib.contextmanager
def restarter_in_a_thread(tmp_path: Path) -> Iterator[Running]:
    """The restarter (and a stalled target's /metrics) served by a loop in another thread,
    so that hypothesis can drive it with plain blocking requests."""
    marker = tmp_path / "marker"
    loop = asyncio.new_event_loop()
    ready = threading.Event()
    state: dict[str, Any] = {}

    async def stalled_metrics(request: web.Request) -> web.Response:
        text = METRICS_TEMPLATE.format(running="4.0", generated=2730.0, steps=690.0)
        return web.Response(text=text, content_type="text/plain")

    async def start() -> None:
        target_app = web.Application()
        target_app.router.add_get("/metrics", stalled_metrics)
        target_runner = web.AppRunner(target_app)
        await target_runner.setup()
        target_site = web.TCPSite(target_runner, "127.0.0.1", 0)
        await target_site.start()
        target_port = target_runner.addresses[0][1]
        config = write_config(
            tmp_path,
            [
                target_entry(
                    "gpu1",
                    f"http://127.0.0.1:{target_port}/metrics",
                    {"kind": "command", "argv": marker_argv(marker)},
                )
            ],
            confirm={"gap": "1s", "timeout": "2s"},
            max_body_bytes=64 * 1024,
        )
        app = build_app(config)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state.update(
            runners=[runner, target_runner],
            port=runner.addresses[0][1],
            restarter=app[RESTARTER_KEY],
        )
        ready.set()

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(30)
    ready.wait(30)

    async def stop() -> None:
        for runner in state["runners"]:
            await runner.cleanup()

    try:
        yield Running(state["port"], marker, state["restarter"])
    finally:
        asyncio.run_coroutine_threadsafe(stop(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    with restarter_in_a_thread(tmp_path_factory.mktemp("hostile")) as served:
        yield served


def post(port: int, body: bytes, *, token: str = TOKEN) -> tuple[int, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(
            "POST",
            "/alerts",
            body=body,
            headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        )
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=12), children, max_size=4)
    ),
    max_leaves=20,
)
label_values = st.sampled_from(
    ["LLMServerStuck", "LLMServerUnresponsive", "LLMServerDown", "gpu1", "gpu9", ""]
) | st.text(max_size=8)
well_formed_alerts = st.fixed_dictionaries(
    {
        "status": st.sampled_from(["firing", "resolved"]),
        "labels": st.fixed_dictionaries(
            {"alertname": label_values, "target": label_values},
            optional={"severity": label_values},
        )
        | st.dictionaries(
            st.sampled_from(["alertname", "target", "severity"]) | st.text(max_size=6),
            label_values,
            max_size=3,
        ),
        "startsAt": st.sampled_from(
            [STARTS_AT, "2026-11-30T05:29:50Z", "2026-11-30T05:29:50+02:00"]
        ),
        "fingerprint": st.text(min_size=1, max_size=16),
    },
    optional={"annotations": st.dictionaries(st.text(max_size=6), st.text(max_size=6))},
)
well_formed_payloads = st.fixed_dictionaries(
    {"version": st.just("4"), "alerts": st.lists(well_formed_alerts, max_size=3)},
    optional={
        "receiver": st.text(max_size=8),
        "status": st.sampled_from(["firing", "resolved"]),
        "commonLabels": st.dictionaries(st.text(max_size=6), label_values, max_size=3),
        "externalURL": st.text(max_size=8),
        "truncatedAlerts": st.integers(min_value=0),
    },
)


@st.composite
def near_payloads(draw: st.DrawFn) -> dict[str, Any]:
    """A well-formed payload, often with one part replaced by arbitrary JSON."""
    document: dict[str, Any] = draw(well_formed_payloads)
    mutation = draw(st.sampled_from(["none", "top", "alert"]))
    if mutation == "top":
        key = draw(st.sampled_from(["version", "alerts", "receiver", "commonLabels", "status"]))
        document[key] = draw(json_values)
    elif mutation == "alert" and document["alerts"]:
        item = draw(st.sampled_from(document["alerts"]))
        key = draw(st.sampled_from(["status", "labels", "startsAt", "fingerprint", "annotations"]))
        item[key] = draw(json_values)
    return document


def check_answer(running: Running, status: int, body: bytes) -> None:
    assert status < 500, body
    if status == 200:
        for decision in json.loads(body)["decisions"]:
            # the only alert that may restart is a firing LLMServerStuck for gpu1;
            # the marker proves below that no action ever ran
            assert decision["decision"] in ("skip", "resolved", "restart"), decision
    assert not running.marker.exists()


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(document=json_values)
def test_random_json_never_5xx_never_acts(running: Running, document: Any) -> None:
    """Any JSON document gets 400 (or 2xx), never a 5xx, and runs nothing."""
    status, body = post(running.port, json.dumps(document).encode())
    check_answer(running, status, body)
    assert status == 400


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.binary(max_size=2048))
def test_random_bytes_never_5xx_never_acts(running: Running, data: bytes) -> None:
    """Any byte string gets 400, never a 5xx, and runs nothing."""
    status, body = post(running.port, data)
    check_answer(running, status, body)
    assert status == 400


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(document=near_payloads())
def test_near_valid_payloads_never_5xx_never_act(running: Running, document: Any) -> None:
    """Payload-shaped documents with wrong parts get 400 or a journaled skip, never an action.

    The target is really stalled, so the only thing standing between a payload and a restart
    is the restarter's own checks; a generated alert that passes them all would restart gpu1,
    and `fingerprint`-less or mistyped alerts must never get that far.
    """
    alerts = document["alerts"] if isinstance(document["alerts"], list) else []
    for item in alerts:
        # a well-formed firing restart alert for gpu1 is a real restart request: take it out
        labels = item.get("labels") if isinstance(item, dict) else None
        if (
            isinstance(labels, dict)
            and labels.get("target") == "gpu1"
            and labels.get("alertname") in RESTART_ALERTS
            and item.get("status") == "firing"
        ):
            labels["target"] = "gpu9"
    status, body = post(running.port, json.dumps(document).encode())
    check_answer(running, status, body)


def test_hostile_tokens_are_refused(running: Running) -> None:
    """Tokens that differ from the real one in length, case or content get 401."""
    body = json.dumps({"version": "4", "alerts": []}).encode()
    for token in ("", TOKEN[:-1], TOKEN + "x", TOKEN.upper(), "é" + TOKEN, "Token " + TOKEN):
        status, _ = post(running.port, body, token=token)
        assert status == 401, token
    assert post(running.port, body)[0] == 200
