"""One worker's links to the others: hand a `/probe` to its target's owner, gather every
worker's families for `/metrics`, reload them all; and the series a worker publishes of itself."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Iterator

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from stallwatch.exporter.peers import PeerAnswer, PeerLink, PeerUnavailable
from stallwatch.exporter.workers import FamilyData, WorkerShare, families_from_json, owner

log = logging.getLogger("stallwatch.exporter")

# How long a worker waits for another's families or reload.
ASK_TIMEOUT_SECONDS = 5.0
# A `/probe` without Prometheus' scrape timeout header waits this long for its owner.
PROBE_TIMEOUT_SECONDS = 120.0
# Beyond the scrape's own timeout: the owner ends its read within the scrape's budget.
PROBE_TIMEOUT_MARGIN_SECONDS = 1.0
TEXT = "text/plain; charset=utf-8"


class WorkerLinks:
    """This worker's connections to every other worker."""

    def __init__(self, share: WorkerShare) -> None:
        self.share = share
        self.handed_over = 0  # `/probe`s this worker handed to their target's owner
        self._links = {
            index: PeerLink(share.socket_path(index))
            for index in range(share.count)
            if index != share.index
        }

    def owner(self, key: str | None) -> int | None:
        """The other worker owning `key`; None when this one owns it (or nobody: no key)."""
        if key is None:
            return None
        index = owner(key, self.share.count)
        return None if index == self.share.index else index

    async def probe(
        self, index: int, module: str, target: str, scrape_timeout: str | None, debug: bool
    ) -> PeerAnswer:
        """Worker `index`'s answer to the `/probe`; a 503 when it cannot be asked."""
        wait = PROBE_TIMEOUT_SECONDS
        try:
            if scrape_timeout is not None:
                wait = float(scrape_timeout) + PROBE_TIMEOUT_MARGIN_SECONDS
        except ValueError:
            pass  # the owner refuses the header
        request = {
            "op": "probe",
            "module": module,
            "target": target,
            "scrape_timeout": scrape_timeout,
            "debug": debug,
        }
        self.handed_over += 1
        try:
            return await self._links[index].ask(request, wait)
        except (PeerUnavailable, TimeoutError) as error:
            detail = str(error) or f"no answer within {wait:g} s"
            text = f"probe refused: worker {index}, which reads this target, is unavailable: "
            return PeerAnswer(503, TEXT, f"{text}{detail}\n".encode())

    async def families(self) -> list[list[FamilyData]]:
        """Every other worker's families; a worker that cannot answer is left out (logged)."""
        answers = await asyncio.gather(
            *(self._ask(index, {"op": "metrics"}) for index in self._links)
        )
        return [
            families_from_json(answer.body)
            for answer in answers
            if answer is not None and answer.status == 200
        ]

    async def verdicts(self) -> dict[str, tuple[str, str]]:
        """The state and reason of every configured target the other workers poll, by name (a
        worker that cannot answer is left out: its targets show as not polled yet)."""
        answers = await asyncio.gather(
            *(self._ask(index, {"op": "verdicts"}) for index in self._links)
        )
        found: dict[str, tuple[str, str]] = {}
        for answer in answers:
            if answer is not None and answer.status == 200:
                for name, (state, reason) in json.loads(answer.body).items():
                    found[str(name)] = (str(state), str(reason))
        return found

    async def reload(self) -> str | None:
        """Reload every other worker; the first error, if any."""
        answers = await asyncio.gather(
            *(self._ask(index, {"op": "reload"}) for index in self._links)
        )
        for index, answer in zip(self._links, answers, strict=True):
            if answer is None:
                return f"worker {index} could not be asked to reload"
            if answer.status != 200:
                return answer.body.decode("utf-8", errors="replace")
        return None

    def answering(self, count: int) -> Metric:
        """The gauge of the workers whose families this `/metrics` holds."""
        return GaugeMetricFamily(
            "stallwatch_exporter_workers_answering",
            "Workers whose series this scrape of /metrics holds (fewer than "
            "stallwatch_exporter_workers while one restarts).",
            value=count,
        )

    async def _ask(self, index: int, request: dict[str, object]) -> PeerAnswer | None:
        try:
            return await self._links[index].ask(request, ASK_TIMEOUT_SECONDS)
        except (PeerUnavailable, TimeoutError) as error:
            log.warning("worker %d did not answer %s: %s", index, request["op"], error or "timeout")
            return None

    async def close(self) -> None:
        for link in self._links.values():
            await link.close()


WORKER_LINKS_KEY = web.AppKey("worker_links", WorkerLinks)


class WorkerCollector(Collector):
    """What a worker publishes of itself: how many workers there are, its restarts, the
    `/probe`s it handed over."""

    def __init__(self, links: WorkerLinks) -> None:
        self._links = links

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "stallwatch_exporter_workers",
            "Worker processes of the exporter (--workers).",
            value=self._links.share.count,
        )
        yield CounterMetricFamily(
            "stallwatch_exporter_worker_restarts",
            "Worker processes started again after one died; the targets it owned start anew.",
            value=self._links.share.restarts,
        )
        yield CounterMetricFamily(
            "stallwatch_exporter_probes_handed_over",
            "/probe requests that reached a worker other than their target's owner and were "
            "handed to the owner.",
            value=self._links.handed_over,
        )
