"""Real Prometheus and Alertmanager on loopback, running stallwatch's own rules and routing.

The stack is `stallwatch.localstack.stack.LocalStack`, which owns the config rewrite (only
timing and addresses change: 1 s scrape and evaluation, LLMServerDown `for:` 3s,
StallwatchExporterDown 2s, group_wait 0s / group_interval 1s) and the two processes. This
module adds what only the tests need. One `AlertingStack` per test session (Prometheus needs
about 5 s to discover its targets, so tests change what an existing target serves instead of
adding targets):

- Prometheus scrapes job `stallwatch-exporter` at 127.0.0.1:`exporter_port` and job
  `stallwatch-restarter` at 127.0.0.1:`restarter_port`. Nothing listens there until a test
  starts its exporter (real or fake) on that port.
- Alertmanager sends the restarter's notifications to `receiver`, a recording webhook server
  that requires the bearer token, the stand-in for the restarter.
- `wait_for_query`, `wait_for_alert` and `wait_for_am_alert` poll without blocking the test's
  event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest
from aiohttp import web

from stallwatch.localstack.errors import MissingBinaryError
from stallwatch.localstack.processes import HTTP_TIMEOUT_SECONDS, free_port
from stallwatch.localstack.rewrite import ProjectFiles, ScrapeTargets, Webhook
from stallwatch.localstack.stack import LocalStack

__all__ = [
    "HTTP_TIMEOUT_SECONDS",
    "WEBHOOK_PATH",
    "AlertingStack",
    "MissingBinaryError",
    "Notification",
    "RecordingReceiver",
    "poll",
    "running_stack",
]

T = TypeVar("T")
Stack = TypeVar("Stack", bound=LocalStack)


@contextlib.contextmanager
def running_stack(stack: Stack) -> Iterator[Stack]:
    """`stack` started (a missing binary fails the test, naming it), stopped afterwards."""
    try:
        stack.start()
    except MissingBinaryError as error:
        pytest.fail(str(error))
    try:
        yield stack
    finally:
        stack.stop()


WEBHOOK_PATH = "/alerts"


# --- the restarter stand-in --------------------------------------------------------------------


@dataclass(frozen=True)
class Notification:
    """One webhook POST that carried the right bearer token."""

    payload: dict[str, Any]
    authorization: str
    user_agent: str
    received_at: float  # time.time()
    received_monotonic: float  # time.monotonic(), comparable with the test's own clock

    def matches(self, alertname: str, target: str, status: str) -> bool:
        return any(
            alert.get("status") == status
            and alert.get("labels", {}).get("alertname") == alertname
            and alert.get("labels", {}).get("target") == target
            for alert in self.payload.get("alerts", [])
        )


class RecordingReceiver:
    """A real aiohttp webhook server on loopback, in its own thread, recording every payload."""

    def __init__(self, token: str) -> None:
        self.token = token
        self.port = 0
        self._condition = threading.Condition()
        self._notifications: list[Notification] = []
        self._rejected = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="recording-receiver", daemon=True
        )
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{WEBHOOK_PATH}"

    @property
    def notifications(self) -> list[Notification]:
        with self._condition:
            return list(self._notifications)

    @property
    def rejected(self) -> int:
        """POSTs refused for a missing or wrong bearer token."""
        with self._condition:
            return self._rejected

    def start(self) -> None:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(HTTP_TIMEOUT_SECONDS)

    def stop(self) -> None:
        """Close the server and its thread. Safe before `start()` and more than once."""
        if self._loop.is_closed():
            return
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(
                HTTP_TIMEOUT_SECONDS
            )
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(HTTP_TIMEOUT_SECONDS)
        self._loop.close()

    def clear(self) -> None:
        with self._condition:
            self._notifications.clear()
            self._rejected = 0

    def find(self, alertname: str, target: str, status: str = "firing") -> Notification | None:
        with self._condition:
            for notification in self._notifications:
                if notification.matches(alertname, target, status):
                    return notification
        return None

    async def wait_for(
        self, alertname: str, target: str, status: str = "firing", timeout: float = 30.0
    ) -> Notification:
        """The first notification with an alert of that name, target and status."""

        async def check() -> Notification | None:
            return self.find(alertname, target, status)

        return await poll(check, timeout, f"webhook {alertname}{{target={target!r}}} {status}")

    def wait_for_blocking(
        self, alertname: str, target: str, status: str = "firing", timeout: float = 30.0
    ) -> Notification:
        deadline = time.monotonic() + timeout
        with self._condition:
            while True:
                for notification in self._notifications:
                    if notification.matches(alertname, target, status):
                        return notification
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"no webhook {alertname}{{target={target!r}}} {status}")
                self._condition.wait(remaining)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post(WEBHOOK_PATH, self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert isinstance(server, asyncio.base_events.Server)
        self.port = server.sockets[0].getsockname()[1]

    async def _handle(self, request: web.Request) -> web.Response:
        received_at, received_monotonic = time.time(), time.monotonic()
        authorization = request.headers.get("Authorization", "")
        if not secrets.compare_digest(authorization, f"Bearer {self.token}"):
            with self._condition:
                self._rejected += 1
            return web.Response(status=401, text="missing or wrong bearer token\n")
        try:
            payload = json.loads(await request.read())
        except (UnicodeDecodeError, json.JSONDecodeError):
            return web.Response(status=400, text="body is not JSON\n")
        if not isinstance(payload, dict):
            return web.Response(status=400, text="body is not a JSON object\n")
        notification = Notification(
            payload=payload,
            authorization=authorization,
            user_agent=request.headers.get("User-Agent", ""),
            received_at=received_at,
            received_monotonic=received_monotonic,
        )
        with self._condition:
            self._notifications.append(notification)
            self._condition.notify_all()
        return web.Response(status=200)


async def poll(check: Callable[[], Awaitable[T | None]], timeout: float, what: str) -> T:
    """Call `check` every 50 ms until it returns something other than None."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result is not None:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        await asyncio.sleep(0.05)


# --- the stack ---------------------------------------------------------------------------------


class AlertingStack(LocalStack):
    """LocalStack + recording receiver, started with `start()`, ended with `stop()`.

    Synchronous helpers (`query`, `alerts`, `am_alerts`) come from LocalStack; the async
    `wait_for_*` helpers poll them without blocking the test's event loop.
    """

    def __init__(self, workdir: Path, repo: Path) -> None:
        self.exporter_port = free_port()
        self.restarter_port = free_port()
        self.exporter_address = f"127.0.0.1:{self.exporter_port}"
        self.restarter_address = f"127.0.0.1:{self.restarter_port}"
        self.token = secrets.token_hex(16)
        self.receiver = RecordingReceiver(self.token)
        super().__init__(
            workdir,
            scrape=ScrapeTargets(exporter=self.exporter_address, restarter=self.restarter_address),
            # The receiver's port is known once it listens: start() sets the final URL.
            webhook=Webhook(url=self.receiver.url, token=self.token),
            project=ProjectFiles.locate(repo),
        )

    def start(self) -> None:
        """Start the receiver, then Prometheus and Alertmanager with the receiver's URL."""
        self.receiver.start()
        # Read after the receiver is in place: a subclass may swap it for another address.
        self.webhook = Webhook(url=self.receiver.url, token=self.token)
        super().start()  # on failure it calls stop(), which also stops the receiver

    def stop(self) -> None:
        """Stop Prometheus and Alertmanager, then the receiver. Safe to call more than once."""
        super().stop()
        self.receiver.stop()

    async def wait_for_query(self, promql: str, timeout: float = 30.0) -> list[dict[str, Any]]:
        """The first non-empty result of `promql`."""

        async def check() -> list[dict[str, Any]] | None:
            return await asyncio.to_thread(self.query, promql) or None

        return await poll(check, timeout, f"a result for {promql!r}")

    async def wait_for_alert(
        self, alertname: str, target: str, state: str = "firing", timeout: float = 30.0
    ) -> dict[str, Any]:
        """The Prometheus alert with that name and target, once it is in `state`."""

        async def check() -> dict[str, Any] | None:
            for alert in await asyncio.to_thread(self.alerts):
                if _identifies(alert["labels"], alertname, target) and alert["state"] == state:
                    return alert
            return None

        return await poll(check, timeout, f"Prometheus alert {alertname}{{target={target!r}}}")

    async def wait_for_am_alert(
        self, alertname: str, target: str, timeout: float = 30.0
    ) -> dict[str, Any]:
        """The active Alertmanager alert with that name and target."""

        async def check() -> dict[str, Any] | None:
            for alert in await asyncio.to_thread(self.am_alerts):
                labels = alert["labels"]
                if _identifies(labels, alertname, target) and alert["status"]["state"] == "active":
                    return alert
            return None

        return await poll(check, timeout, f"Alertmanager alert {alertname}{{target={target!r}}}")


def _identifies(labels: dict[str, str], alertname: str, target: str) -> bool:
    return labels.get("alertname") == alertname and labels.get("target") == target
