"""The alert plans' steps, answered: at once (the clock, the journal's history, the memory, a
pool) or by reading or asking the model server (two confirming reads, one fresh read, one test
request to a target out of rotation, where no user shares its queue)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol
from urllib.parse import urlsplit

import aiohttp

from stallwatch.common.quarantine_config import QuarantineSettings
from stallwatch.common.restarter_config import RestarterConfig, Target
from stallwatch.core.alert_plan import (
    AlertMemory,
    AlertOutcome,
    AskClock,
    AskHistory,
    AskMemory,
    AskPool,
    AskTestRequest,
    Confirm,
    FreshRead,
    Plan,
    advance,
)
from stallwatch.core.alerts import Alert
from stallwatch.core.confirmation import ReadAttempt
from stallwatch.core.holds import Hold
from stallwatch.core.policy import History
from stallwatch.net.fetch import read_metrics, send_test_request
from stallwatch.restarter.confirm import Confirmations, attempt
from stallwatch.restarter.holds import TargetHolds


def base_url(target: Target) -> str:
    """The server's base URL: its metrics URL without the path."""
    parts = urlsplit(target.metrics_url)
    return f"{parts.scheme}://{parts.netloc}"


async def fresh_read(
    session: aiohttp.ClientSession | None, target: Target, timeout: float
) -> ReadAttempt | None:
    """One read of the target's metrics (None: not started, nothing to read with)."""
    if session is None:
        return None
    return attempt(await read_metrics(session, target.metrics_url, timeout=timeout))


async def one_test_request(
    session: aiohttp.ClientSession, target: Target, model: str, settings: QuarantineSettings
) -> tuple[bool, str]:
    """One `max_tokens: 1` completion for `model` to a quarantined target; whether it
    answered, and how."""
    result = await send_test_request(
        session,
        base_url(target),
        model=model,
        endpoint="completions",
        timeout=settings.test_request_timeout,
    )
    return result.succeeded, result.detail


class Pending:
    """A plan that wants a step that waits: driven again under its target's lock."""


PENDING = Pending()


class Owner(Protocol):
    """What of the restarter the steps use."""

    memory: AlertMemory
    config: RestarterConfig
    confirmations: Confirmations
    holds: TargetHolds

    @property
    def session(self) -> aiohttp.ClientSession: ...

    @property
    def open_session(self) -> aiohttp.ClientSession | None: ...

    def clock(self) -> float: ...

    def history(self, alert: Alert, now: float, holds: Mapping[str, Hold]) -> History: ...

    def pool_members(self, target: Target) -> tuple[str, ...]: ...


class PlanSteps:
    """Drives a plan: each step answered for the restarter."""

    def __init__(self, owner: Owner) -> None:
        self.owner = owner

    def answer_now(self, step: object, holds: Mapping[str, Hold] | None) -> object:
        """The answer to a step that needs no waiting (PENDING: it needs waiting)."""
        match step:
            case AskClock():
                return self.owner.clock()
            case AskHistory(alert=alert, now=now):
                current = holds if holds is not None else self.owner.holds.follow(now)
                return self.owner.history(alert, now, current)
            case AskMemory():
                return self.owner.memory
            case AskPool(target=target):
                return self.owner.pool_members(target)
        return PENDING

    def now(self, plan: Plan, holds: Mapping[str, Hold]) -> AlertOutcome | Pending:
        """Drive `plan` as far as it goes without waiting: its outcome, or PENDING."""
        step = advance(plan, None)
        while not isinstance(step, AlertOutcome):
            answer = self.answer_now(step, holds)
            if answer is PENDING:
                plan.close()
                return PENDING
            step = advance(plan, answer)
        return step

    async def run(self, plan: Plan, asked_at: float) -> AlertOutcome:
        """Drive `plan` to its end, the steps that wait included (under the caller's lock)."""
        step = advance(plan, None)
        while not isinstance(step, AlertOutcome):
            match step:
                case Confirm(target=target):
                    answer: object = await self.owner.confirmations.confirm(
                        self.owner.session, target, self.owner.config.confirm, asked_at
                    )
                case FreshRead(target=target):
                    answer = await fresh_read(
                        self.owner.open_session, target, self.owner.config.confirm.timeout
                    )
                case AskTestRequest(target=target, model=model):
                    answer = await one_test_request(
                        self.owner.session, target, model, self.owner.config.quarantine
                    )
                case _:
                    answer = self.answer_now(step, None)
            step = advance(plan, answer)
        return step
