"""No request of the exporter, `/probe`, `stallwatch check` or the restarter follows a redirect.

An allowed server answers each endpoint with a redirect to a second server outside the
allow-list, which counts every request it gets: it must get none, and each redirect is a failed
read that says so. Real aiohttp servers on loopback; an ast check covers every request call.
"""

from __future__ import annotations

import ast
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.common.exporter_config import exporter_config_from_mapping
from stallwatch.common.restarter_config import HttpAction, Target
from stallwatch.exporter.app import running_exporter
from stallwatch.net.fetch import (
    ask_models,
    engine_faults,
    engine_sleeps,
    read_metrics,
    send_test_request,
)
from stallwatch.restarter.actions import ActionRunner
from stallwatch.restarter.confirm import confirm_stall
from tests.support.real_payloads import real_payload

PACKAGE = Path(__file__).resolve().parents[2] / "stallwatch"
REQUEST_METHODS = {"get", "post", "put", "patch", "delete", "head", "options", "request"}
TIMEOUT = aiohttp.ClientTimeout(total=5)


class Sink:
    """A server outside the allow-list that counts every request it gets."""

    def __init__(self) -> None:
        self.requests: list[str] = []
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.server = TestServer(app, host="127.0.0.1")

    async def handle(self, request: web.Request) -> web.Response:
        self.requests.append(f"{request.method} {request.path}")
        body = {"choices": [{"text": "x"}], "data": [{"id": "m", "owned_by": "vllm"}]}
        return web.json_response(body)

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")


class Redirecting:
    """An allowed server: `redirect` paths answer 302 (GET) or 307 (POST) to the sink; the
    others answer as an idle vLLM does."""

    def __init__(self, sink: Sink, redirect: set[str]) -> None:
        self.sink = sink
        self.redirect = redirect
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.server = TestServer(app, host="127.0.0.1")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        if request.path in self.redirect:
            status = 307 if request.method == "POST" else 302
            return web.Response(status=status, headers={"Location": self.sink.url + request.path})
        if request.path == "/metrics":
            return web.Response(text=real_payload("vllm-0.32.0-cpu-idle-1.txt"))
        if request.path == "/v1/models":
            return web.json_response({"data": [{"id": "m", "owned_by": "vllm"}]})
        return web.json_response({}, status=404)

    @property
    def url(self) -> str:
        return str(self.server.make_url("")).rstrip("/")

    @property
    def address(self) -> str:
        return self.url.removeprefix("http://")


@contextlib.asynccontextmanager
async def servers(*redirect: str) -> AsyncIterator[tuple[Redirecting, Sink]]:
    sink = Sink()
    allowed = Redirecting(sink, set(redirect))
    await sink.server.start_server()
    await allowed.server.start_server()
    try:
        yield allowed, sink
    finally:
        await allowed.server.close()
        await sink.server.close()


async def test_every_exporter_read_refuses_a_redirect() -> None:
    """/metrics, /v1/models, the sleep check, /fault_tolerance/status and the test request
    each get a redirect: none is followed, and each is a failed read naming the redirect."""
    paths = ("/metrics", "/v1/models", "/props", "/fault_tolerance/status", "/v1/completions")
    async with servers(*paths) as (allowed, sink), aiohttp.ClientSession() as session:
        metrics = await read_metrics(session, allowed.url + "/metrics", timeout=2)
        models = await ask_models(session, allowed.url, timeout=2)
        asleep = await engine_sleeps(session, allowed.url, "llamacpp", timeout=2)
        faulted = await engine_faults(session, allowed.url, "vllm", timeout=2)
        probe = await send_test_request(
            session, allowed.url, model="m", endpoint="completions", timeout=2
        )
    assert sink.requests == []
    assert metrics.reading is None
    assert metrics.error_reason == "http_status"
    assert metrics.detail.startswith("HTTP 302 redirect to http://")
    assert metrics.detail.endswith("/metrics, not followed")
    assert models.error_reason == "http_status"
    assert not models.listed
    assert "redirect" in models.detail
    assert asleep is None
    assert faulted == ()
    assert not probe.succeeded
    assert probe.detail.startswith("HTTP 307 redirect to http://")


def state_of(body: str, target: str) -> str:
    for family in text_string_to_metric_families(body):
        for sample in family.samples:
            if (
                sample.name == "stallwatch_target_state"
                and sample.value == 1.0
                and sample.labels.get("target") == target
            ):
                return sample.labels["state"]
    raise AssertionError(f"no state for {target} in {body}")


async def probe_once(redirect: str) -> tuple[str, list[str]]:
    """One `/probe` of an allowed server whose `redirect` path redirects out of the list."""
    async with servers(redirect) as (allowed, sink):
        modules = {
            "m": {"allow": [allowed.address], "interval": "1s", "test_request": {"enabled": True}}
        }
        config = exporter_config_from_mapping({"modules": modules}, "exporter.yml")
        async with (
            running_exporter(config, Path("exporter.yml"), port=0) as (_, url),
            aiohttp.ClientSession() as session,
            session.get(
                f"{url}/probe", params={"target": allowed.address, "module": "m"}, timeout=TIMEOUT
            ) as response,
        ):
            assert response.status == 200
            body = await response.text()
        return state_of(body, allowed.address), sink.requests


async def test_probe_of_a_server_whose_test_request_redirects() -> None:
    """`/probe` of an idle server answering POST /v1/completions with a 307 out of the
    allow-list: the test request is not sent there (nor twice), and it reads unresponsive."""
    state, elsewhere = await probe_once("/v1/completions")
    assert elsewhere == []
    assert state == "unresponsive"


async def test_probe_of_a_server_whose_model_list_redirects() -> None:
    """`/probe` of a server answering GET /v1/models with a 302 out of the allow-list: nothing
    is read there, and the server reads down (it cannot be read; never restarted)."""
    state, elsewhere = await probe_once("/v1/models")
    assert elsewhere == []
    assert state == "down"


async def test_restarter_confirmation_and_http_action_refuse_a_redirect() -> None:
    """The restarter's confirmation reads and its http action get redirects: none followed,
    the confirmation refuses, the action fails and says it was a redirect."""
    async with servers("/metrics", "/restart") as (allowed, sink), aiohttp.ClientSession() as s:
        confirmation = await confirm_stall(s, allowed.url + "/metrics", gap_seconds=0.01, timeout=2)
        runner = ActionRunner(s)
        action = HttpAction(url=allowed.url + "/restart")
        outcome = await runner.run(Target("gpu", allowed.url + "/metrics", action))
        await runner.close()
    assert sink.requests == []
    assert not confirmation.confirmed
    assert outcome.result == "failure"
    assert "answered 307, a redirect, not followed" in outcome.detail


def request_calls(path: Path) -> list[tuple[str, bool]]:
    """Each `session.get(...)`-like call in `path`: where, and whether it refuses redirects."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        receiver = ast.unparse(node.func.value)
        if node.func.attr not in REQUEST_METHODS or not receiver.endswith("session"):
            continue
        refused = any(
            k.arg == "allow_redirects"
            and isinstance(k.value, ast.Constant)
            and k.value.value is False
            for k in node.keywords
        )
        found.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", refused))
    return found


def test_every_request_call_of_the_exporter_and_restarter_refuses_redirects() -> None:
    """Every HTTP request call of the exporter, the restarter and their shared network edge
    passes allow_redirects=False."""
    parts = ("net", "exporter", "restarter")
    files = [path for part in parts for path in (PACKAGE / part).rglob("*.py")]
    calls = [call for path in sorted(files) for call in request_calls(path)]
    assert len(calls) >= 8  # the check sees the calls it is about
    assert [where for where, refused in calls if not refused] == []
