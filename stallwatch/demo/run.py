"""Runs the demo: starts the pipeline, plays the script, prints and returns the summary.

Everything it started is stopped at the end, also when it fails, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import aiohttp

from stallwatch import __version__
from stallwatch.demo.configs import BATCH_TARGET, HUNG_TARGET, PROXY_TARGET, SERVERS
from stallwatch.demo.errors import DemoError, DemoInterrupted
from stallwatch.demo.observer import Observer
from stallwatch.demo.pipeline import Pipeline
from stallwatch.demo.script import FULL_SCRIPT, Script, Story
from stallwatch.demo.summary import format_summary_table, rotation_problems, story_problems
from stallwatch.demo.timeline import Timeline
from stallwatch.localstack.errors import LocalStackError

HTTP_TIMEOUT = aiohttp.ClientTimeout(total=3.0)


@dataclass(frozen=True)
class DemoOptions:
    """Which script to play, where to write the JSON summary, whether to color the timeline."""

    script: Script = FULL_SCRIPT
    json_summary: Path | None = None
    project_root: Path | None = None
    color: bool = False


@dataclass
class DemoReport:
    """Whether the story happened as it should, what went wrong, and the whole summary."""

    ok: bool
    problems: list[str]
    summary: dict[str, Any]


class Demo:
    """One run of the demo: its timeline, pipeline, story and, once started, its observer."""

    def __init__(self, options: DemoOptions, out: TextIO) -> None:
        self.options = options
        self.script = options.script
        self.out = out
        self.started = time.monotonic()
        self.timeline = Timeline(out, self.started, options.color)
        self.pipeline = Pipeline(self.timeline)
        self.observer: Observer | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.story = Story(self.script, self.timeline, self.pipeline, self.tasks)
        self.failure: str | None = None

    async def run(self) -> DemoReport:
        try:
            async with aiohttp.ClientSession(
                timeout=HTTP_TIMEOUT, headers={"User-Agent": f"stallwatch-demo/{__version__}"}
            ) as session:
                try:
                    await self._run(session)
                except (DemoError, LocalStackError) as error:
                    self.failure = str(error)
                    self.timeline.emit("problem", str(error), "problem")
                    self.pipeline.print_logs()
                finally:
                    await self.story.stop_clients()
                    await self._cancel_tasks()
            return self._report()
        finally:
            await self.pipeline.shutdown()

    async def _run(self, session: aiohttp.ClientSession) -> None:
        self.timeline.say(
            f"stallwatch {__version__} demo ({self.script.name}): the incident "
            "that stallwatch was made for, on this machine, with no Docker"
        )
        observer = await self.pipeline.start(session, self.options.project_root)
        self.observer = observer
        self.tasks.append(asyncio.create_task(observer.run(self.script.heartbeat_seconds)))
        await self.story.play(session, observer)

    async def _cancel_tasks(self) -> None:
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        self.tasks.clear()

    def _report(self) -> DemoReport:
        observer = self.observer
        elapsed = time.monotonic() - self.started
        if observer is None:
            problems = [self.failure or "the demo did not get to its story"]
            return DemoReport(
                False,
                problems,
                {
                    "version": __version__,
                    "ok": False,
                    "problems": problems,
                    "duration_seconds": round(elapsed, 1),
                    "processes": self.pipeline.process_list(),
                    "timeline": self.timeline.events,
                },
            )
        for name, tally in observer.tallies.items():
            restarted_by_supervisor = sum(
                1 for target, _ in self.pipeline.supervisor.restarts if target == name
            )
            if name != HUNG_TARGET:
                tally.false_restarts = max(tally.false_restarts, restarted_by_supervisor)
        tallies = observer.tallies
        problems = ([self.failure] if self.failure else []) + story_problems(tallies, HUNG_TARGET)
        story = self.story
        batch, traffic, users, rotation = story.batch, story.traffic, story.users, story.rotation
        if users is not None and rotation.hung_at is not None:
            problems += rotation_problems(rotation)
        ok = not problems
        summary = {
            "version": __version__,
            "script": self.script.name,
            "ok": ok,
            "problems": problems,
            "duration_seconds": round(elapsed, 1),
            "hung_target": HUNG_TARGET,
            "targets": {name: tally.as_json() for name, tally in tallies.items()},
            "batch_job": batch.as_json() if batch is not None else None,
            "user_traffic": traffic.as_json() if traffic is not None else None,
            "haproxy_users": users.as_json() if users is not None else None,
            "haproxy_rotation": rotation.as_json(),
            "old_watchdog_request": story.old_watchdog,
            "long_prompt": story.long_prompt,
            "compile": story.compile,
            "journal": observer.journal_entries,
            "processes": self.pipeline.process_list(),
            "timeline": self.timeline.events,
        }
        say = self.timeline.say
        say("")
        say(format_summary_table([tallies[name] for name in (*SERVERS, PROXY_TARGET)]))
        say("")
        if batch is not None:
            say(
                f"  batch job on {BATCH_TARGET}: {batch.sent} long requests, {batch.failed_total} "
                "failed (a false restart would have failed all 4 in flight)"
            )
        if traffic is not None:
            say(
                f"  user traffic on {HUNG_TARGET}: {traffic.completed} requests done, "
                f"{traffic.failed_total} failed (in flight on the hung process when it was "
                f"replaced), {traffic.refused} refused while the new process started"
            )
        if users is not None and rotation.out_at is not None and rotation.hung_at is not None:
            out = rotation.out_at - rotation.hung_at
            back = (
                f"{rotation.back_at - rotation.out_at:.0f} s"
                if rotation.back_at is not None
                else "until the end"
            )
            say(
                f"  users through HAProxy: {HUNG_TARGET} got {rotation.sent_at_hang} of their "
                f"requests before its hang, {rotation.hang_to_out} from the hang until it left "
                f"rotation {out:.1f} s later (lost with the hung process), "
                f"{rotation.while_out} while out of rotation ({back}), "
                f"{rotation.after_back} after it came back; {users.completed} answered, "
                f"{users.failed_total} given up"
            )
        say(f"  old-style test request to {BATCH_TARGET}: {story.old_watchdog}")
        say(f"  compile on {BATCH_TARGET}: {story.compile}")
        say(f"  long prompt on {HUNG_TARGET}: {story.long_prompt}; read busy, never stuck")
        if ok:
            say(
                f"  0 test requests to busy servers, 0 false restarts, the real stall on "
                f"{HUNG_TARGET} restarted once. Total {elapsed:.0f} s."
            )
        else:
            for problem in problems:
                say(f"  PROBLEM: {problem}")
        return DemoReport(ok, problems, summary)


async def _run_with_signals(demo: Demo) -> DemoReport:
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    with contextlib.suppress(NotImplementedError):
        loop.add_signal_handler(signal.SIGTERM, task.cancel)
    return await demo.run()


def run_demo(options: DemoOptions, out: TextIO = sys.stdout) -> DemoReport:
    """Run the demo to its end (or until it fails or is interrupted); leave nothing running."""
    demo = Demo(options, out)
    try:
        report = asyncio.run(_run_with_signals(demo))
    except asyncio.CancelledError:
        raise DemoInterrupted("terminated") from None
    if options.json_summary is not None:
        options.json_summary.write_text(json.dumps(report.summary, indent=2) + "\n")
    return report
