"""Hold the coordination.k8s.io Lease that makes this replica the one that acts.

Every `renew_every` seconds the keeper reads the Lease and, if it may, writes it back at the
resourceVersion it read (a 409 means another replica wrote first: it did not get it). The
write carries the restarts of the policy's look-back (this journal's and those already in the
Lease), so a replica that takes over honours the cooldowns and budgets of the one before.
Before a restart action changes anything, `fence` writes the Lease once more: a replica that
lost the Lease meanwhile finds out then, and does not act.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from stallwatch.common.kubernetes_config import LeaseSettings
from stallwatch.core.lease import decode_ledger, encode_ledger, lease_move, merge_restarts
from stallwatch.core.policy import PastRestart
from stallwatch.restarter.kube.api import ApiException, KubeApi

log = logging.getLogger("stallwatch.restarter")


class LeaseKeeper:
    def __init__(
        self,
        api: KubeApi,
        settings: LeaseSettings,
        *,
        clock: Callable[[], float],
        own_restarts: Callable[[float], tuple[PastRestart, ...]],
        lookback: Callable[[], float],
    ) -> None:
        self.api = api
        self.settings = settings
        self.clock = clock
        self.own_restarts = own_restarts
        self.lookback = lookback
        self.holding = False
        self.holder: str | None = None
        # The restarts the Lease held when last read (those of earlier holders too).
        self.shared: tuple[PastRestart, ...] = ()
        self._lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None

    async def step(self) -> bool:
        """Read the Lease, take or renew it if this replica may; whether it holds it now."""
        async with self._lock:
            try:
                self.holding = await self._step()
            except ApiException as error:
                if self.holding:
                    log.warning("lease: not renewed (%s): not acting", error.status)
                self.holding = False
            return self.holding

    async def _step(self) -> bool:
        settings = self.settings
        now = self.clock()
        lease = await self.api.lease(settings.namespace, settings.name)
        if lease is not None:
            self.shared = decode_ledger(lease.ledger)
            self.holder = lease.view.holder
        move = lease_move(
            None if lease is None else lease.view, settings.identity, now, settings.duration
        )
        if move == "wait":
            return False
        since = now - self.lookback()
        ledger = encode_ledger(merge_restarts(self.own_restarts(since), self.shared), since)
        try:
            await self.api.write_lease(
                settings.namespace,
                settings.name,
                holder=settings.identity,
                duration=settings.duration,
                now=now,
                ledger=ledger,
                previous=lease,
                taking=move == "take",
            )
        except ApiException as error:
            if error.status == 409:  # another replica wrote the Lease first
                return False
            raise
        if move == "take":
            log.info(
                "lease %s/%s taken by %s (was %s)",
                settings.namespace,
                settings.name,
                settings.identity,
                self.holder or "free",
            )
        self.holder = settings.identity
        return True

    async def fence(self) -> bool:
        """Renew now (writing the latest restarts into the Lease); whether this replica may act."""
        return await self.step()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            await self.step()
            await asyncio.sleep(self.settings.renew_every)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        self.holding = False
