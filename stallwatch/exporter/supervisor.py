"""`stallwatch exporter --workers N`: one listening socket, N worker processes serving it.

The supervisor binds the exporter's address, starts the workers (each `stallwatch exporter`
given the socket and its share, `exporter.workers`), says where it listens once every worker
answers, and then only watches: SIGHUP checks the config file and, when it is valid, has every
worker reload it; SIGTERM or SIGINT stops the workers; a worker that dies is started again
(its targets start anew) and counted in `stallwatch_exporter_worker_restarts_total`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import signal
import socket
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from stallwatch.common.config import ConfigError, netloc
from stallwatch.common.config_files import load_exporter_config
from stallwatch.common.exporter_config import ExporterConfig
from stallwatch.exporter.app import ListenError, listen_error
from stallwatch.exporter.workers import WorkerShare, restart_delay

log = logging.getLogger("stallwatch.exporter")

WORKER_START_SECONDS = 30.0
STOP_SECONDS = 10.0
BACKLOG = 1024


def listening_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on `host`:`port`, for the workers to share."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
    except OSError as error:
        raise listen_error(host, port, error) from None
    sock.set_inheritable(True)
    return sock


class Supervisor:
    """Starts the workers, starts again one that dies, stops them all."""

    def __init__(
        self, worker_argv: Sequence[str], count: int, sock: socket.socket, socket_dir: Path
    ) -> None:
        self.worker_argv = list(worker_argv)
        self.count = count
        self.sock = sock
        self.socket_dir = socket_dir
        self.restarts = [0] * count
        self.started_at = [0.0] * count
        self.processes: dict[int, asyncio.subprocess.Process] = {}
        self.stopping = False

    def share(self, index: int) -> WorkerShare:
        return WorkerShare(index, self.count, self.socket_dir, self.restarts[index])

    async def start(self, index: int) -> None:
        share = self.share(index)
        argv = [
            *self.worker_argv,
            f"--worker={share.index}/{share.count}",
            f"--worker-dir={share.socket_dir}",
            f"--worker-fd={self.sock.fileno()}",
            f"--worker-restarts={share.restarts}",
        ]
        self.started_at[index] = asyncio.get_running_loop().time()
        self.processes[index] = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.DEVNULL, pass_fds=(self.sock.fileno(),)
        )

    async def wait_ready(self, seconds: float = WORKER_START_SECONDS) -> None:
        """Wait until every worker answers on its local socket; ListenError if one exits."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        waiting = set(range(self.count))
        while waiting:
            for index in list(waiting):
                process = self.processes[index]
                if process.returncode is not None:
                    raise ListenError(f"worker {index} exited with {process.returncode}")
                if self.share(index).socket_path(index).exists():
                    waiting.discard(index)
            if waiting and loop.time() > deadline:
                raise ListenError(f"workers {sorted(waiting)} did not start in {seconds:g} s")
            await asyncio.sleep(0.05)

    async def watch(self, index: int) -> None:
        """Start worker `index` again whenever it dies, until the supervisor stops."""
        delay = 0.0
        while not self.stopping:
            process = self.processes[index]
            code = await process.wait()
            if self.stopping:
                return
            ran = asyncio.get_running_loop().time() - self.started_at[index]
            delay = restart_delay(ran, delay)
            self.restarts[index] += 1
            log.error(
                "worker %d (pid %d) exited with %d after %.0f s; starting it again in %g s "
                "(restart %d), its targets start anew",
                index,
                process.pid,
                code,
                ran,
                delay,
                self.restarts[index],
            )
            await asyncio.sleep(delay)
            if not self.stopping:
                await self.start(index)

    def signal_all(self, signum: int) -> None:
        for process in self.processes.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signum)

    async def stop(self) -> None:
        self.stopping = True
        self.signal_all(signal.SIGTERM)
        waits = [p.wait() for p in self.processes.values() if p.returncode is None]
        try:
            async with asyncio.timeout(STOP_SECONDS):
                await asyncio.gather(*waits)
        except TimeoutError:
            self.signal_all(signal.SIGKILL)
            await asyncio.gather(*(p.wait() for p in self.processes.values()))


def reload_checked(config_path: Path, supervisor: Supervisor) -> None:
    """SIGHUP: have every worker reload the file, if it loads; else keep the running config."""
    try:
        load_exporter_config(config_path, reloading=True)
    except ConfigError as error:
        log.error("reload refused, keeping the running config: %s", error)
        return
    supervisor.signal_all(signal.SIGHUP)


async def supervise(
    config: ExporterConfig,
    config_path: Path,
    worker_argv: Sequence[str],
    count: int,
    scheme: str = "http",
) -> None:
    """Run `count` workers on the config's listening address until SIGTERM or SIGINT.

    `worker_argv` starts one worker (the command line, less the worker's own flags); `scheme`
    is how the workers answer (https with TLS)."""
    sock = listening_socket(config.listen_host, config.listen_port)
    socket_dir = Path(tempfile.mkdtemp(prefix="stallwatch-workers-"))
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    supervisor = Supervisor(worker_argv, count, sock, socket_dir)
    watching: list[asyncio.Task[None]] = []
    # The handlers come before "listening on": a SIGHUP right after it must reload, not end
    # the supervisor or be lost. One that comes while the workers start is relayed once they
    # all serve (a worker that has not read the file yet reads the new one anyway).
    ready = False
    hangup_while_starting = False

    def on_hangup() -> None:
        nonlocal hangup_while_starting
        if ready:
            reload_checked(config_path, supervisor)
        else:
            hangup_while_starting = True

    loop.add_signal_handler(signal.SIGHUP, on_hangup)
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    try:
        for index in range(count):
            await supervisor.start(index)
        await supervisor.wait_ready()
        ready = True
        if hangup_while_starting:
            on_hangup()
        url = f"{scheme}://{netloc(config.listen_host, sock.getsockname()[1])}"
        log.info("listening on %s with %d targets, %d workers", url, len(config.targets), count)
        print(f"listening on {url}", flush=True)
        watching = [asyncio.create_task(supervisor.watch(i)) for i in range(count)]
        await stop.wait()
    finally:
        for signum in (signal.SIGHUP, signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await supervisor.stop()
        for task in watching:
            task.cancel()
        await asyncio.gather(*watching, return_exceptions=True)
        sock.close()
        shutil.rmtree(socket_dir, ignore_errors=True)


def worker_command() -> list[str]:
    """How this interpreter starts `stallwatch`."""
    return [sys.executable, "-m", "stallwatch"]
