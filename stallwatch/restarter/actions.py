"""Run a target's restart action (command, docker, systemd, http, kubernetes) under a timeout.

The action comes from the restarter's config only. The target's name reaches a command as
the environment variable STALLWATCH_TARGET and is never put into an argv or a shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import signal
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, assert_never
from urllib.parse import quote

import aiohttp

from stallwatch import USER_AGENT
from stallwatch.common.kubernetes_config import KubernetesAction
from stallwatch.common.restarter_config import (
    Action,
    CommandAction,
    DockerAction,
    HttpAction,
    SystemdAction,
    Target,
)
from stallwatch.restarter.stop_reports import (
    SYSTEMD_STOP_PROPERTIES,
    docker_detail,
    docker_kill_time,
    killed_after_the_grace,
    systemd_detail,
)

if TYPE_CHECKING:
    from stallwatch.restarter.kube.action import PodRestarter

# pdb_blocked: an eviction a PodDisruptionBudget refused (kubernetes actions only).
ActionResult = Literal["success", "failure", "timeout", "pdb_blocked"]
TARGET_ENV = "STALLWATCH_TARGET"
_DETAIL_CHARS = 500


@dataclass(frozen=True)
class ActionOutcome:
    result: ActionResult
    detail: str
    duration: float


def _tail(data: bytes) -> str:
    text = data.decode("utf-8", errors="replace").strip()
    return text if len(text) <= _DETAIL_CHARS else "…" + text[-_DETAIL_CHARS:]


# Of a command's output only the last this many bytes are kept (the detail shows the last
# _DETAIL_CHARS characters of them); the rest is read and dropped, so a chatty command
# neither fills memory nor blocks on a full pipe.
OUTPUT_KEPT_BYTES = 4 * 1024
# Once the command has exited, the rest of its output is awaited this long at most (a
# process outside its process group may hold the pipe open for ever).
OUTPUT_DRAIN_SECONDS = 1.0
# asyncio's Process.wait() also waits for the output pipe to close, which a background child
# can hold open; while it is open, the command's exit is looked for this often.
EXIT_POLL_SECONDS = 0.05


class _OutputTail:
    """The last OUTPUT_KEPT_BYTES of a stream, and how many bytes it had in all."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.total = 0

    async def read_from(self, stream: asyncio.StreamReader) -> None:
        while chunk := await stream.read(64 * 1024):
            self.total += len(chunk)
            self.kept += chunk
            if len(self.kept) > OUTPUT_KEPT_BYTES:
                del self.kept[: len(self.kept) - OUTPUT_KEPT_BYTES]


async def _wait_for_exit(process: asyncio.subprocess.Process, reader: asyncio.Task[None]) -> None:
    """Until the command itself has exited, whoever still holds its output pipe."""
    while process.returncode is None and not reader.done():
        await asyncio.wait({reader}, timeout=EXIT_POLL_SECONDS)
    if process.returncode is None:
        await process.wait()


def _kill_group(pgid: int) -> bool:
    """SIGKILL every process left in the group; whether there was any."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


async def run_argv(argv: list[str], target_name: str) -> tuple[bool, str]:
    """Run `argv` (no shell) with STALLWATCH_TARGET set; its own exit status is the result.

    The command runs in a process group of its own. When it exits (or is cancelled), what it
    left running in that group is killed, and the detail says so.
    """
    environment = {**os.environ, TARGET_ENV: target_name}
    process = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=environment,
        start_new_session=True,
    )
    assert process.stdout is not None
    output = _OutputTail()
    reader = asyncio.create_task(output.read_from(process.stdout))
    try:
        await _wait_for_exit(process, reader)
    finally:
        left_running = _kill_group(process.pid)
        await _wait_for_exit(process, reader)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(reader), OUTPUT_DRAIN_SECONDS)
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    summary = _tail(bytes(output.kept))
    detail = f"{argv[0]} exited {process.returncode}" + (f": {summary}" if summary else "")
    if left_running:
        detail += " (killed the processes it left running in its process group)"
    return process.returncode == 0, detail


# How long the engine's event log is read after a restart, at most (a socket proxy may not
# pass /events, or an engine may stream past `until`): the restart is done by then anyway.
DOCKER_EVENTS_SECONDS = 5.0
# How long `systemctl show` and `journalctl` may take after a systemd restart, each.
SYSTEMD_QUERY_SECONDS = 5.0


async def _query(argv: list[str]) -> str:
    """A short query's output: '' when it cannot run, fails, or takes SYSTEMD_QUERY_SECONDS."""
    try:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL,
        )
    except OSError:
        return ""
    try:
        async with asyncio.timeout(SYSTEMD_QUERY_SECONDS):
            output, _ = await process.communicate()
    except TimeoutError:
        return ""
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    return output.decode(errors="replace") if process.returncode == 0 else ""


async def _docker_kill_times(
    session: aiohttp.ClientSession, container: str, since: float, until: float
) -> list[float]:
    """When the engine's events between `since` and `until` show a SIGKILL of `container`.

    Empty when they cannot be read: the restart itself succeeded, and the detail still states
    the bound (`t`). Whole seconds, and no `filters` (the events are matched here): podman 4's
    Docker API answers no events at all to fractional times or to a container filter.
    """
    params = {"since": str(math.floor(since)), "until": str(math.floor(until) + 1)}
    times: list[float] = []
    try:
        async with asyncio.timeout(DOCKER_EVENTS_SECONDS):
            async with session.get(
                "http://docker/events",
                params=params,
                headers={"User-Agent": USER_AGENT},
                allow_redirects=False,
            ) as response:
                if response.status != 200:
                    return times
                async for line in response.content:
                    with contextlib.suppress(ValueError):
                        at = docker_kill_time(json.loads(line), container)
                        if at is not None:
                            times.append(at)
    except (TimeoutError, aiohttp.ClientError, OSError, ValueError):
        pass
    return times


class ActionRunner:
    """Runs actions; owns the Docker sockets' sessions, borrows the process's HTTP session."""

    def __init__(self, session: aiohttp.ClientSession, *, kube: PodRestarter | None = None) -> None:
        self._session = session
        self._kube = kube
        self._docker_sessions: dict[str, aiohttp.ClientSession] = {}

    async def close(self) -> None:
        for session in self._docker_sessions.values():
            await session.close()
        self._docker_sessions.clear()

    async def run(self, target: Target) -> ActionOutcome:
        """Run the target's action; a timeout or an error is an outcome, not an exception."""
        started = time.monotonic()
        try:
            async with asyncio.timeout(target.action_timeout):
                result, detail = await _runner_for(target.action)(self, target.action, target.name)
        except TimeoutError:
            detail = f"no result within {target.action_timeout:g} s"
            return ActionOutcome("timeout", detail, time.monotonic() - started)
        except (OSError, aiohttp.ClientError, ValueError) as error:
            detail = f"{type(error).__name__}: {error}"
            return ActionOutcome("failure", detail, time.monotonic() - started)
        return ActionOutcome(result, detail, time.monotonic() - started)

    async def _command(self, action: CommandAction, target_name: str) -> tuple[ActionResult, str]:
        succeeded, detail = await run_argv(list(action.argv), target_name)
        return _result(succeeded), detail

    async def _kubernetes(
        self, action: KubernetesAction, target_name: str
    ) -> tuple[ActionResult, str]:
        if self._kube is None:
            return "failure", "no Kubernetes API configured"
        return await self._kube.restart(action)

    async def _systemd_restart(
        self, action: SystemdAction, target_name: str
    ) -> tuple[ActionResult, str]:
        """`systemctl [--user] restart UNIT`; then the unit's stop bound (`systemctl show`) and
        whether its journal shows that systemd had to SIGKILL, for the detail."""
        scope = ["--user"] if action.user else []
        since = time.time()
        succeeded, detail = await run_argv(
            ["systemctl", *scope, "restart", action.unit], target_name
        )
        properties = [arg for name in SYSTEMD_STOP_PROPERTIES for arg in ("-p", name)]
        show = await _query(["systemctl", *scope, "show", *properties, action.unit])
        since_arg = f"--since=@{math.floor(since)}"
        journal = await _query(
            ["journalctl", *scope, "--unit", action.unit, since_arg, "--output=cat", "--quiet"]
        )
        return _result(succeeded), systemd_detail(detail, show, journal)

    def _docker_session(self, socket_path: str) -> aiohttp.ClientSession:
        session = self._docker_sessions.get(socket_path)
        if session is None or session.closed:
            session = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=socket_path))
            self._docker_sessions[socket_path] = session
        return session

    async def _docker_restart(
        self, action: DockerAction, target_name: str
    ) -> tuple[ActionResult, str]:
        """Docker Engine API: POST /containers/{name}/restart?t=STOP_TIMEOUT (204 on success).

        The engine sends the container's stop signal (SIGTERM unless the image says otherwise)
        and SIGKILL after `t` seconds. Whether it had to kill is read from its event log, and
        the detail says so.
        """
        session = self._docker_session(action.socket)
        path = f"/containers/{quote(action.container, safe='')}/restart"
        # The API takes whole seconds; rounding down would cut a container's grace short.
        stop_timeout = math.ceil(action.stop_timeout)
        since = time.time()
        async with session.post(
            f"http://docker{path}",
            params={"t": str(stop_timeout)},
            headers={"User-Agent": USER_AGENT},
            allow_redirects=False,
        ) as response:
            body = await response.content.read(64 * 1024)
            if response.status == 204:
                kills = await _docker_kill_times(session, action.container, since, time.time())
                killed = killed_after_the_grace(kills, since, stop_timeout)
                return "success", docker_detail(action.container, stop_timeout, killed)
            message = _tail(body)
            with contextlib.suppress(ValueError):
                answer = json.loads(body)
                if isinstance(answer, dict) and isinstance(answer.get("message"), str):
                    message = answer["message"]
            return "failure", f"docker answered {response.status} for {action.container}: {message}"

    async def _http_request(self, action: HttpAction, target_name: str) -> tuple[ActionResult, str]:
        headers = {"User-Agent": USER_AGENT}
        if action.bearer_token_file is not None:
            token_file = Path(action.bearer_token_file)
            token = (await asyncio.to_thread(token_file.read_text, encoding="utf-8")).strip()
            headers["Authorization"] = f"Bearer {token}"
        async with self._session.request(
            action.method,
            action.url,
            json={"target": target_name, "action": "restart"},
            headers=headers,
            allow_redirects=False,
        ) as response:
            body = await response.content.read(64 * 1024)
            detail = f"{action.method} {action.url} answered {response.status}"
            if 300 <= response.status < 400:  # never followed: a failure, whatever it says
                detail += ", a redirect, not followed"
            # The receiver owns the stop: what it answers (how it stopped the server, whether
            # it had to SIGKILL) is kept, as a command's output is.
            summary = _tail(body)
            ok = 200 <= response.status < 300
            return _result(ok), detail + (f": {summary}" if summary else "")


def _result(succeeded: bool) -> ActionResult:
    return "success" if succeeded else "failure"


_A = TypeVar("_A", CommandAction, DockerAction, SystemdAction, HttpAction, KubernetesAction)


@dataclass(frozen=True)
class _Runner(Generic[_A]):
    """How one action kind runs: the action's class and the ActionRunner method that runs it."""

    action_type: type[_A]
    run: Callable[[ActionRunner, _A, str], Awaitable[tuple[ActionResult, str]]]

    def __call__(
        self, runner: ActionRunner, action: Action, target_name: str
    ) -> Awaitable[tuple[ActionResult, str]]:
        if not isinstance(action, self.action_type):
            raise TypeError(
                f"a {action.kind} action given to the {self.action_type.__name__} runner"
            )
        return self.run(runner, action, target_name)


# One runner an action kind, keyed as the config's ACTION_KINDS; a unit test holds the two
# tables to the same keys.
RUNNERS: Mapping[str, _Runner[Any]] = MappingProxyType(
    {
        "command": _Runner(CommandAction, ActionRunner._command),
        "docker": _Runner(DockerAction, ActionRunner._docker_restart),
        "systemd": _Runner(SystemdAction, ActionRunner._systemd_restart),
        "http": _Runner(HttpAction, ActionRunner._http_request),
        "kubernetes": _Runner(KubernetesAction, ActionRunner._kubernetes),
    }
)


def _runner_for(action: Action) -> _Runner[Any]:
    """The runner of the action's kind; a class added to `Action` without one fails mypy here."""
    match action:
        case CommandAction() | DockerAction() | SystemdAction() | HttpAction() | KubernetesAction():
            return RUNNERS[action.kind]
        case _:
            assert_never(action)
