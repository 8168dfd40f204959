"""The demo's script: how long each act lasts and how big its work is, and the acts themselves.

1. a batch job fills every slot of gpu-a; an old-style watchdog's test request times out while
   stallwatch reads `busy` and sends nothing;
2. gpu-a falls silent mid-batch (a JIT compile) and goes on by itself: people are told, the
   restarter waits out its restart window and restarts nothing;
3. a long prompt on gpu-b: a chunked prefill with a flat step count, read `busy`, never stuck;
4. gpu-b really hangs while serving traffic and is restarted once, through the whole pipeline;
   users who reach the servers through HAProxy move off gpu-b as soon as the restarter has
   confirmed the stall (its agent-check answers `down`), and back once the new process serves.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from stallwatch import USER_AGENT
from stallwatch.demo.configs import (
    BATCH_TARGET,
    DEMO_RESTART_AFTER,
    HUNG_TARGET,
    MODEL,
    PREFILL_TOKENS_PER_SECOND,
)
from stallwatch.demo.observer import WORK_STATES, Observer
from stallwatch.demo.pipeline import Pipeline, until
from stallwatch.demo.summary import RotationTally
from stallwatch.demo.timeline import Timeline
from stallwatch.demo.traffic import KeepBusy
from stallwatch.localstack.haproxy import HAProxy, in_rotation

OLD_WATCHDOG_TIMEOUT_SECONDS = 3.0
OLD_WATCHDOG_USER_AGENT = "old-watchdog/1.0"


@dataclass(frozen=True)
class Script:
    """How long each act lasts and how big its work is."""

    name: str
    batch_max_tokens: int
    batch_alone_seconds: float  # the batch job alone before the old watchdog's request
    long_prompt_tokens: int
    traffic_concurrency: int
    traffic_max_tokens: int
    traffic_before_hang_seconds: float
    after_recovery_seconds: float
    wind_down_seconds: float
    heartbeat_seconds: float  # a status line this often (0: never)
    recovery_timeout_seconds: float = 60.0
    # How long gpu-a's engine is silent in act 2: longer than two polls (the alert), shorter
    # than the demo's restart window (DEMO_RESTART_AFTER).
    compile_seconds: float = 6.0
    # Users through HAProxy in act 4: requests at a time, their size, and how long a user
    # waits for an answer before giving up and asking again.
    users_concurrency: int = 2
    users_max_tokens: int = 8
    users_timeout_seconds: float = 5.0


FULL_SCRIPT = Script(
    name="full",
    batch_max_tokens=8000,
    batch_alone_seconds=20.0,
    long_prompt_tokens=30000,
    traffic_concurrency=2,
    traffic_max_tokens=400,
    traffic_before_hang_seconds=15.0,
    after_recovery_seconds=25.0,
    wind_down_seconds=10.0,
    heartbeat_seconds=10.0,
)
SHORT_SCRIPT = Script(
    name="short",
    batch_max_tokens=8000,
    batch_alone_seconds=3.0,
    long_prompt_tokens=9000,
    traffic_concurrency=2,
    traffic_max_tokens=400,
    traffic_before_hang_seconds=3.0,
    after_recovery_seconds=4.0,
    wind_down_seconds=3.0,
    heartbeat_seconds=0.0,
)


class Story:
    """The three acts and the wind-down, played on a started pipeline; what they showed."""

    def __init__(
        self,
        script: Script,
        timeline: Timeline,
        pipeline: Pipeline,
        tasks: list[asyncio.Task[Any]],
    ) -> None:
        self.script = script
        self.timeline = timeline
        self.pipeline = pipeline
        self.tasks = tasks  # the demo cancels these at the end
        self.batch: KeepBusy | None = None
        self.traffic: KeepBusy | None = None
        self.users: KeepBusy | None = None  # through HAProxy
        self.rotation = RotationTally(HUNG_TARGET)
        self._batch_counted = False
        self.old_watchdog = ""
        self.long_prompt = ""
        self.compile = ""
        self.batch_window_start = 0

    async def play(self, session: aiohttp.ClientSession, observer: Observer) -> None:
        await self._act_batch_job(session, observer)
        await self._act_compile(session, observer)
        await self._act_long_prompt(session, observer)
        await self._act_hang(session, observer)
        await self._wind_down(observer)

    async def _sim_stats(self, session: aiohttp.ClientSession, name: str) -> dict[str, Any]:
        async with session.get(f"{self.pipeline.server_url(name)}/sim/stats") as response:
            stats: dict[str, Any] = await response.json()
            return stats

    async def _sim_test_requests(self, session: aiohttp.ClientSession, name: str) -> int:
        stats = await self._sim_stats(session, name)
        return int(stats["completions_by_user_agent"].get(USER_AGENT, 0))

    async def _wait_sim_work(
        self, session: aiohttp.ClientSession, name: str, at_least: int, timeout: float = 15
    ) -> None:
        async def check() -> bool:
            stats = await self._sim_stats(session, name)
            return int(stats["running"]) + int(stats["waiting"]) >= at_least

        await until(check, timeout, f"{name} to have {at_least} requests")

    async def _act_batch_job(self, session: aiohttp.ClientSession, observer: Observer) -> None:
        script, timeline = self.script, self.timeline
        timeline.emit(
            "story",
            f"ACT 1: a batch job fills all 4 slots of {BATCH_TARGET} with long generations "
            f"(ignore_eos, {script.batch_max_tokens} tokens each, 10 tokens/s each)",
            "story",
        )

        self.batch = KeepBusy(
            session,
            self.pipeline.server_url(BATCH_TARGET),
            concurrency=4,
            prompt_tokens=32,
            max_tokens=script.batch_max_tokens,
            user_agent="batch-job/1.0",
        )
        self.batch.start()
        await self._wait_sim_work(session, BATCH_TARGET, 4)
        await observer.wait_for(
            lambda: observer.state_of(BATCH_TARGET) == "busy", 15, f"{BATCH_TARGET} busy"
        )
        # Ground truth from here on: the simulator counts every stallwatch request it gets.
        # (A test request sent by the last idle poll, just before the work arrived, is
        # counted before this point: the exporter sends it right after its read.)
        self.batch_window_start = await self._sim_test_requests(session, BATCH_TARGET)
        await asyncio.sleep(script.batch_alone_seconds)
        timeline.emit(
            "story",
            f"an old-style watchdog sends its test request to {BATCH_TARGET} "
            f"(max_tokens 1, timeout {OLD_WATCHDOG_TIMEOUT_SECONDS:g} s)",
            "story",
        )
        started = time.monotonic()
        try:
            async with session.post(
                f"{self.pipeline.server_url(BATCH_TARGET)}/v1/completions",
                json={"model": MODEL, "prompt": "ping", "max_tokens": 1},
                headers={"User-Agent": OLD_WATCHDOG_USER_AGENT},
                timeout=aiohttp.ClientTimeout(total=OLD_WATCHDOG_TIMEOUT_SECONDS),
            ) as response:
                await response.read()
                self.old_watchdog = (
                    f"answered {response.status} in {time.monotonic() - started:.1f} s"
                )
        except TimeoutError:
            self.old_watchdog = (
                f"timed out after {time.monotonic() - started:.1f} s, queued behind 4 running "
                "requests: the old watchdog would now restart a healthy server and fail them all"
            )
        timeline.emit("story", f"old-style test request: {self.old_watchdog}", "story")
        timeline.emit(
            "story",
            f"stallwatch reads {BATCH_TARGET}'s counters instead: "
            f"{observer.state_of(BATCH_TARGET)}, "
            f"{observer.tallies[BATCH_TARGET].test_requests} test requests sent to it so far",
            "story",
        )

    async def _fault(self, session: aiohttp.ClientSession, name: str, fault: str) -> None:
        async with session.post(
            f"{self.pipeline.server_url(name)}/sim/fault", json={"fault": fault}
        ) as response:
            response.raise_for_status()

    async def _act_compile(self, session: aiohttp.ClientSession, observer: Observer) -> None:
        script, timeline = self.script, self.timeline
        name = BATCH_TARGET
        tally = observer.tallies[name]
        timeline.emit(
            "story",
            f"ACT 2: {name}'s engine falls silent for {script.compile_seconds:g} s with 4 "
            "requests in flight, as vLLM does while it JIT-compiles kernels for a new prompt "
            "shape, then goes on by itself",
            "story",
        )
        silent_at = time.monotonic()
        await self._fault(session, name, "hang")
        await observer.wait_for(
            lambda: tally.skips.get("restart_window", 0) > 0,
            script.recovery_timeout_seconds,
            f"the restarter to open {name}'s restart window",
        )
        await asyncio.sleep(max(0.0, silent_at + script.compile_seconds - time.monotonic()))
        await self._fault(session, name, "recover")
        timeline.emit("story", f"{name}'s compile is over: its engine moves again", "good")
        await observer.wait_for(
            lambda: (
                tally.skips.get("recovered_in_window", 0) > 0 and observer.state_of(name) == "busy"
            ),
            script.recovery_timeout_seconds,
            f"{name} recovered inside its restart window",
        )
        self.compile = (
            f"{script.compile_seconds:g} s of silence with 4 requests in flight: people were "
            f"told, the restarter waited (restart window {DEMO_RESTART_AFTER}), "
            f"{tally.restarts} restarts"
        )
        timeline.emit(
            "story",
            f"{name} recovered by itself: LLMServerStuck told people, the restarter waited "
            f"(restart_after {DEMO_RESTART_AFTER}, 5m in production) and restarted nothing; "
            "the near miss is journaled and counted",
            "good",
        )

    async def _act_long_prompt(self, session: aiohttp.ClientSession, observer: Observer) -> None:
        script, timeline = self.script, self.timeline
        name = HUNG_TARGET
        timeline.emit(
            "story",
            f"ACT 3: a {script.long_prompt_tokens}-token prompt on {name}: a long chunked "
            "prefill (64-token chunks) — no output steps, only the KV cache grows",
            "story",
        )
        before = await self._engine_counters(session, name)

        async def long_prompt() -> None:
            async with session.post(
                f"{self.pipeline.server_url(name)}/v1/completions",
                json={
                    "model": MODEL,
                    "prompt": " ".join(["context"] * script.long_prompt_tokens),
                    "max_tokens": 8,
                },
                headers={"User-Agent": "long-prompt/1.0"},
                timeout=aiohttp.ClientTimeout(total=120),
            ) as response:
                await response.read()

        task = asyncio.create_task(long_prompt())
        self.tasks.append(task)
        await self._wait_sim_work(session, name, 1)
        await observer.wait_for(lambda: observer.state_of(name) == "busy", 15, f"{name} busy")
        window_start = await self._sim_test_requests(session, name)
        await asyncio.sleep(script.long_prompt_tokens / PREFILL_TOKENS_PER_SECOND / 2)
        during = await self._engine_counters(session, name)
        window_end = await self._sim_test_requests(session, name)
        observer.tallies[name].sim_test_requests_while_busy += max(0, window_end - window_start)
        self.long_prompt = (
            f"output steps {before[0]:.0f} → {during[0]:.0f}, "
            f"KV cache {before[1]:.0%} → {during[1]:.0%}"
        )
        timeline.emit(
            "story",
            f"{name}'s own counters during the prefill: {self.long_prompt}; a step-count "
            f"watchdog would call it stuck, stallwatch reads {observer.state_of(name)}",
            "story",
        )
        await task
        timeline.emit("story", f"the long prompt finished on {name}", "story")
        await observer.wait_for(
            lambda: observer.state_of(name) not in WORK_STATES, 10, f"{name} done"
        )

    async def _engine_counters(
        self, session: aiohttp.ClientSession, name: str
    ) -> tuple[float, float]:
        """(output steps, KV-cache usage) from the server's own /metrics."""
        async with session.get(f"{self.pipeline.server_url(name)}/metrics") as response:
            text = await response.text()
        steps = usage = 0.0
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "vllm:iteration_tokens_total_count":
                    steps = sample.value
                elif sample.name == "vllm:kv_cache_usage_perc":
                    usage = sample.value
        return steps, usage

    async def _act_hang(self, session: aiohttp.ClientSession, observer: Observer) -> None:
        script, timeline = self.script, self.timeline
        name = HUNG_TARGET
        tally = observer.tallies[name]
        timeline.emit(
            "story",
            f"ACT 4: user traffic on {name} ({script.traffic_concurrency} requests at a time), "
            "then its engine really hangs",
            "story",
        )

        self.traffic = KeepBusy(
            session,
            self.pipeline.server_url(name),
            concurrency=script.traffic_concurrency,
            prompt_tokens=64,
            max_tokens=script.traffic_max_tokens,
            user_agent="user-traffic/1.0",
        )
        self.traffic.start()
        await self._end_batch(observer)
        haproxy = self.pipeline.haproxy
        assert haproxy is not None  # started with the pipeline
        self.users = KeepBusy(
            session,
            haproxy.url,
            concurrency=script.users_concurrency,
            prompt_tokens=16,
            max_tokens=script.users_max_tokens,
            user_agent="haproxy-users/1.0",
            timeout=script.users_timeout_seconds,
        )
        self.users.start()
        timeline.emit(
            "story",
            f"users reach both servers through HAProxy ({script.users_concurrency} at a time, "
            f"giving up after {script.users_timeout_seconds:g} s)",
            "story",
        )
        await self._wait_sim_work(session, name, script.traffic_concurrency)
        await observer.wait_for(lambda: observer.state_of(name) == "busy", 15, f"{name} busy")
        window_start = await self._sim_test_requests(session, name)
        await asyncio.sleep(script.traffic_before_hang_seconds)
        window_end = await self._sim_test_requests(session, name)
        tally.sim_test_requests_while_busy += max(0, window_end - window_start)
        rotation = self.rotation
        rotation.sent_at_hang = await _sent_to(haproxy, name)
        async with session.post(
            f"{self.pipeline.server_url(name)}/sim/fault", json={"fault": "hang"}
        ) as response:
            response.raise_for_status()
        tally.hung_at = rotation.hung_at = time.monotonic()
        follow = asyncio.create_task(self._follow_rotation(haproxy, name))
        self.tasks.append(follow)
        timeline.emit(
            "story",
            f"{name}'s engine core hangs with {script.traffic_concurrency} requests in flight "
            "(/health still 200, /metrics frozen)",
            "problem",
        )
        await observer.wait_for(
            lambda: (
                tally.resolved_at is not None
                and any(target == name for target, _ in self.pipeline.supervisor.restarts)
            ),
            script.recovery_timeout_seconds,
            f"{name} to be restarted and LLMServerStuck to resolve",
        )
        tally.restarted_at = next(
            t for target, t in self.pipeline.supervisor.restarts if target == name
        )
        await observer.wait_for(
            lambda: observer.state_of(name) == "busy", 20, f"{name} serving again"
        )
        timeline.emit("story", f"{name} serves its users again", "good")
        try:
            await asyncio.wait_for(asyncio.shield(follow), script.recovery_timeout_seconds)
        except TimeoutError:
            timeline.emit("problem", f"{name} did not come back into HAProxy's rotation", "problem")
        await asyncio.sleep(script.after_recovery_seconds)
        rotation.sent_at_end = await _sent_to(haproxy, name)

    async def _follow_rotation(self, haproxy: HAProxy, name: str) -> None:
        """Watch HAProxy from the hang: when it takes `name` out (the agent's `down`), what it
        sends it while out, and when it puts it back."""
        rotation, timeline = self.rotation, self.timeline
        while True:
            try:
                row = (await asyncio.to_thread(haproxy.servers))[name]
            except (OSError, KeyError):  # a look that failed: the next one tells
                await asyncio.sleep(0.1)
                continue
            status, sent = row["status"], int(row["stot"])
            now = time.monotonic()
            if rotation.out_at is None:
                if status == "DOWN (agent)":
                    rotation.out_at, rotation.sent_at_out = now, sent
                    rotation.sent_last_out = sent
                    timeline.emit(
                        "haproxy",
                        f"{name} out of rotation {now - (rotation.hung_at or now):.1f} s after "
                        f"the hang ({row['last_agt']}); users go to the other server",
                        "good",
                    )
            elif in_rotation(status):
                rotation.back_at = now
                timeline.emit(
                    "haproxy",
                    f"{name} back in rotation after {now - rotation.out_at:.1f} s out; "
                    f"HAProxy sent it {rotation.while_out} requests meanwhile",
                    "good",
                )
                return
            else:
                rotation.sent_last_out = sent
            await asyncio.sleep(0.1)

    async def _end_batch(self, observer: Observer) -> None:
        """The batch job ends (its clients stop; requests in flight are aborted): the test
        requests gpu-a got while it was busy are counted up to here."""
        if self._batch_counted:
            return
        self._batch_counted = True
        batch_end = await self._sim_test_requests(observer.session, BATCH_TARGET)
        observer.tallies[BATCH_TARGET].sim_test_requests_while_busy += max(
            0, batch_end - self.batch_window_start
        )
        if self.batch is not None:
            await self.batch.stop()
            self.timeline.emit(
                "story",
                f"the batch job on {BATCH_TARGET} ends ({self.batch.sent} long requests, "
                f"{self.batch.failed_total} failed)",
                "story",
            )

    async def _wind_down(self, observer: Observer) -> None:
        await self._end_batch(observer)
        await asyncio.sleep(self.script.wind_down_seconds)
        await observer.sample()
        await self.stop_clients()
        self.timeline.emit("story", "the end: stopping everything", "story")

    async def stop_clients(self) -> None:
        """Stop the batch job and the user traffic (requests in flight are abandoned)."""
        for client in (self.batch, self.traffic, self.users):
            if client is not None:
                await client.stop()


async def _sent_to(haproxy: HAProxy, name: str) -> int:
    """Requests HAProxy has sent `name` so far (its `stot`)."""
    return int((await asyncio.to_thread(haproxy.servers))[name]["stot"])
