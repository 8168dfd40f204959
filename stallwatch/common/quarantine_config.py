"""`quarantine:` of the restarter's config: taking a stuck target out of users' rotation before
its restart, and the guards that keep the verdict failing open."""

from __future__ import annotations

from dataclasses import dataclass

from stallwatch.common.config import Section

# The pool of a target that names none: the targets a restarter lists are replicas of one
# another unless the config says otherwise.
DEFAULT_POOL = "default"
DEFAULT_MAX_SHARE = 50  # percent: Envoy's panic threshold
DEFAULT_EXPIRE_AFTER = 900.0
DEFAULT_CHECK_INTERVAL = 5.0
DEFAULT_TEST_REQUEST_TIMEOUT = 10.0
QUARANTINE_KEYS = (
    "enabled",
    "max_share",
    "expire_after",
    "check_interval",
    "test_request",
    "test_request_timeout",
    "agent_listen",
)


@dataclass(frozen=True)
class QuarantineSettings:
    """`enabled`: quarantine on a confirmed stall; `max_share`: at most this % of a pool out of
    rotation at once; `expire_after`: a quarantine no fresh read has confirmed this long ends;
    `check_interval`: how often a quarantined target is read; `test_request`: confirm that an
    idle-looking quarantined target serves with one `max_tokens: 1` request; `agent_listen`:
    the HAProxy agent-check responder's address (None: off)."""

    enabled: bool = True
    max_share: int = DEFAULT_MAX_SHARE
    expire_after: float = DEFAULT_EXPIRE_AFTER
    check_interval: float = DEFAULT_CHECK_INTERVAL
    test_request: bool = True
    test_request_timeout: float = DEFAULT_TEST_REQUEST_TIMEOUT
    agent_listen: str | None = None


def quarantine_settings_from(top: Section) -> QuarantineSettings:
    """The `quarantine:` section of the restarter's config (absent: the defaults)."""
    section = top.section("quarantine", QUARANTINE_KEYS)
    max_share = section.integer("max_share", DEFAULT_MAX_SHARE, minimum=1)
    if max_share > 100:
        section.report("max_share", "expected a percentage from 1 to 100")
    check_interval = section.duration("check_interval", DEFAULT_CHECK_INTERVAL, minimum=0.5)
    expire_after = section.duration("expire_after", DEFAULT_EXPIRE_AFTER)
    if expire_after <= check_interval:
        section.report("expire_after", "must be longer than check_interval")
    agent_listen = section.optional_string("agent_listen")
    if agent_listen is not None:
        section.listen("agent_listen", agent_listen)
    return QuarantineSettings(
        enabled=section.boolean("enabled", True),
        max_share=max_share,
        expire_after=expire_after,
        check_interval=check_interval,
        test_request=section.boolean("test_request", True),
        test_request_timeout=section.duration("test_request_timeout", DEFAULT_TEST_REQUEST_TIMEOUT),
        agent_listen=agent_listen,
    )
