"""The routing verdict over the network: `GET /routable` (by `?target=` or the `Host` header) and
the HAProxy agent-check reply, both from the restarter's verdicts (`core/routing_answers.py`
decides the words)."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from stallwatch.core.routing_answers import (
    agent_reply,
    agent_target,
    host_target,
    routable_answer,
    valid_target_name,
)
from stallwatch.restarter.service import Restarter
from stallwatch.restarter.web import RESTARTER_KEY, error_response


def known_targets(restarter: Restarter) -> set[str]:
    """The targets the restarter knows now: configured, found by a pod rule, or quarantined."""
    names = {target.name for target in restarter.config.targets}
    names.update(restarter.memory.quarantines)
    if restarter.kube is not None:
        names.update(restarter.kube.pod_targets)
    return names


def agent_answer(restarter: Restarter) -> Callable[[str], str]:
    """The agent-check reply to an agent-send line, from the restarter's verdicts."""

    def answer(line: str) -> str:
        return agent_reply(restarter.verdict(agent_target(line, known_targets(restarter))))

    return answer


async def handle_routable(request: web.Request) -> web.StreamResponse:
    """`GET /routable?target=NAME` (or keyed by the `Host` header without its port, as Envoy's
    per-endpoint health check sends it): 200 while the target may take users' requests
    (unknown targets too: fail-open), 503 with the reason while it is out of rotation. One
    line of text, or JSON with `Accept: application/json`. No token: read-only, like /metrics."""
    restarter = request.app[RESTARTER_KEY]
    name = request.query.get("target")
    if name is None:
        name = host_target(request.headers.get("Host", ""))
    if not valid_target_name(name):
        return error_response(400, "target: give a target's name (?target=NAME or the Host header)")
    answer = routable_answer(
        restarter.verdict(name), known=name in known_targets(restarter), now=restarter.clock()
    )
    headers = {"Cache-Control": "no-store"}
    if "application/json" in request.headers.get("Accept", ""):
        return web.json_response(answer.document, status=answer.status, headers=headers)
    return web.Response(status=answer.status, text=answer.text, headers=headers)
