"""Parse an Alertmanager webhook notification (payload version "4"), rejecting anything ill-formed.

The whole payload is checked before any alert in it is acted on, so a malformed payload
changes nothing. Only the fields the restarter uses are required; optional fields are
type-checked when present.
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

PAYLOAD_VERSION = "4"
TARGET_LABEL = "target"

AlertStatus = Literal["firing", "resolved"]

_RFC3339 = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,9})?(Z|[+-]\d\d:\d\d)$")
_OPTIONAL_STRINGS = ("receiver", "externalURL", "groupKey", "status")
_OPTIONAL_LABEL_SETS = ("groupLabels", "commonLabels", "commonAnnotations")


class PayloadError(ValueError):
    """A notification that is not a well-formed Alertmanager version 4 payload."""


@dataclass(frozen=True)
class Alert:
    """One alert of a notification, judged on its own labels."""

    status: AlertStatus
    labels: Mapping[str, str]
    fingerprint: str
    starts_at: str

    @property
    def alertname(self) -> str:
        return self.labels.get("alertname", "")

    @property
    def target(self) -> str | None:
        return self.labels.get(TARGET_LABEL) or None


@dataclass(frozen=True)
class Notification:
    alerts: tuple[Alert, ...]
    receiver: str = ""
    external_url: str = ""
    group_key: str = ""


def _valid_unicode(text: str, path: str) -> str:
    """`text`, if it can be written anywhere: JSON lets a lone surrogate through, UTF-8 not."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise PayloadError(f"{path}: not valid Unicode (a lone surrogate escape)") from None
    return text


def _label_set(value: Any, path: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise PayloadError(f"{path}: expected an object of strings")
    for key, item in value.items():
        _valid_unicode(key, f"{path} key {key!r}")
        if not isinstance(item, str):
            raise PayloadError(f"{path}.{key}: expected a string")
        _valid_unicode(item, f"{path}.{key}")
    return dict(value)


def _string(value: Any, path: str, *, required: bool = True) -> str:
    if not isinstance(value, str) or (required and not value):
        raise PayloadError(f"{path}: expected a non-empty string")
    return _valid_unicode(value, path)


def _alert(value: Any, index: int) -> Alert:
    path = f"alerts[{index}]"
    if not isinstance(value, dict):
        raise PayloadError(f"{path}: expected an object")
    for key in ("status", "labels", "startsAt", "fingerprint"):
        if key not in value:
            raise PayloadError(f"{path}.{key}: missing")
    status = value["status"]
    if status not in ("firing", "resolved"):
        raise PayloadError(f'{path}.status: expected "firing" or "resolved"')
    labels = _label_set(value["labels"], f"{path}.labels")
    if "annotations" in value:
        _label_set(value["annotations"], f"{path}.annotations")
    for key in ("endsAt", "generatorURL"):
        if key in value:
            _string(value[key], f"{path}.{key}", required=False)
    starts_at = _string(value["startsAt"], f"{path}.startsAt")
    if not _RFC3339.match(starts_at):
        raise PayloadError(f"{path}.startsAt: expected an RFC 3339 time")
    fingerprint = _string(value["fingerprint"], f"{path}.fingerprint")
    return Alert(status=status, labels=labels, fingerprint=fingerprint, starts_at=starts_at)


def parse_notification(body: bytes) -> Notification:
    """The notification in `body`, or PayloadError saying what is wrong with it."""
    try:
        document = json.loads(body)
    except (ValueError, RecursionError) as error:
        raise PayloadError(f"not JSON: {error}") from None
    if not isinstance(document, dict):
        raise PayloadError("expected a JSON object")
    if document.get("version") != PAYLOAD_VERSION:
        raise PayloadError(f'version: expected "{PAYLOAD_VERSION}"')
    for key in _OPTIONAL_STRINGS:
        if key in document:
            _string(document[key], key, required=False)
    for key in _OPTIONAL_LABEL_SETS:
        if key in document:
            _label_set(document[key], key)
    alerts = document.get("alerts")
    if not isinstance(alerts, list):
        raise PayloadError("alerts: expected a list")
    return Notification(
        alerts=tuple(_alert(item, index) for index, item in enumerate(alerts)),
        receiver=document.get("receiver", ""),
        external_url=document.get("externalURL", ""),
        group_key=document.get("groupKey", ""),
    )


def episode_before(starts_at: str, other: str) -> bool:
    """Whether the alert episode that began at `starts_at` began before `other` (Alertmanager's
    RFC 3339 startsAt, nanoseconds included); False when either cannot be read."""
    first, second = _instant(starts_at), _instant(other)
    return first is not None and second is not None and first < second


def _instant(text: str) -> tuple[datetime.datetime, int] | None:
    """An RFC 3339 time as (the second, its nanoseconds): Python's datetime stops at micro."""
    head, _, fraction = text.partition(".")
    digits, zone = fraction, ""
    for index, char in enumerate(fraction):
        if not char.isdigit():
            digits, zone = fraction[:index], fraction[index:]
            break
    try:
        second = datetime.datetime.fromisoformat(head + (zone if fraction else ""))
    except ValueError:
        return None
    if second.tzinfo is None:
        return None
    return second.astimezone(datetime.UTC), int((digits + "000000000")[:9] or 0)
