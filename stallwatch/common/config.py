"""The config dialect both components share: one error, one duration grammar, one strict reader.

Every error is a `ConfigError` that names the file and the field (a dotted path such as
`targets[1].url`). A file is read to its end and every error in it reported at once
(`ConfigErrors`): a field that cannot be read is recorded and read as its default, and a part
that cannot be built (a target, a module) is recorded and left out, so one mistake hides no
other. Durations are Prometheus durations (`30s`, `1h30m`, `500ms`), whole numbers
only. Nothing here reads YAML: the schemas build from plain mappings, so importing them loads
no parser.
"""

from __future__ import annotations

import re
import reprlib
from collections.abc import Callable, Collection, Mapping
from typing import TypeVar
from urllib.parse import SplitResult, urlsplit, urlunsplit

DURATION_HINT = "expected a duration like 15s, 10m or 1h"
# Prometheus' own grammar (model.ParseDuration): units in this order, each at most once.
# ASCII digits only, as Prometheus takes them (a fullwidth 2 is no digit), nothing after the unit.
_PROMETHEUS_DURATION = re.compile(
    r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?",
    re.ASCII,
)
_UNIT_MILLISECONDS = (
    365 * 86_400_000,
    7 * 86_400_000,
    86_400_000,
    3_600_000,
    60_000,
    1_000,
    1,
)
# Prometheus keeps durations in an int64 of milliseconds; longer ones are out of range there.
_MAX_MILLISECONDS = 2**63 - 1


# How a value is quoted in a message: bounded, whatever its size (a string of megabytes, or a
# list reached through YAML aliases many times over), and computed without building the whole.
_QUOTE = reprlib.Repr()
_QUOTE.maxlevel = 3
_QUOTE.maxstring = 80
_QUOTE.maxother = 80
_QUOTE.maxlong = 40
for _name in ("maxlist", "maxtuple", "maxdict", "maxset", "maxfrozenset"):
    setattr(_QUOTE, _name, 6)


# The longest field path or message an error keeps (a key of megabytes is a field path too).
_LONGEST_MESSAGE = 1000


def _bounded(text: str) -> str:
    if len(text) <= _LONGEST_MESSAGE:
        return text
    return f"{text[: _LONGEST_MESSAGE - 30]}... ({len(text)} characters)"


def quoted(value: object) -> str:
    """`value` as a message quotes it: its repr, cut to about a line (`...` where cut)."""
    return _QUOTE.repr(value)


class ConfigError(ValueError):
    """A config that cannot be used, with the file and the field at fault."""

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source = source
        self.field = _bounded(field)
        self.message = _bounded(message)
        field, message = self.field, self.message
        where = f"{source}: {field}: " if field else f"{source}: "
        super().__init__(where + message)


class ConfigErrors(ConfigError):
    """Every error found in one file, in the order they were read; the first is its own field."""

    def __init__(self, errors: tuple[ConfigError, ...]) -> None:
        first = errors[0]
        super().__init__(first.source, first.field, first.message)
        self.errors = errors

    def __str__(self) -> str:
        if len(self.errors) == 1:
            return str(self.errors[0])
        lines = [f"{self.source}: {len(self.errors)} errors"]
        lines += [f"  {e.field}: {e.message}" if e.field else f"  {e.message}" for e in self.errors]
        return "\n".join(lines)


def _each(error: ConfigError) -> tuple[ConfigError, ...]:
    return error.errors if isinstance(error, ConfigErrors) else (error,)


_T = TypeVar("_T")
_F = TypeVar("_F")


def parse_duration(value: object) -> float:
    """Seconds in a Prometheus duration (`30s`, `10m`, `1h30m`, `200ms`, `0`); finite, >= 0."""
    if not isinstance(value, str):
        raise ValueError(f"{DURATION_HINT}, got {quoted(value)}")
    match = _PROMETHEUS_DURATION.fullmatch(value)
    if value == "0":
        return 0.0
    if not value or match is None:
        raise ValueError(f"{DURATION_HINT}, got {quoted(value)}")
    milliseconds = sum(
        int(count) * unit
        for count, unit in zip(match.groups(), _UNIT_MILLISECONDS, strict=True)
        if count is not None
    )
    if milliseconds > _MAX_MILLISECONDS:
        raise ValueError(f"duration out of range: {quoted(value)}")
    return milliseconds / 1000


def parse_listen(value: str) -> tuple[str, int]:
    """`host:port`, `[v6]:port`, or `:port` (all interfaces) into a host and a port."""
    host, separator, port_text = value.rpartition(":")
    if not separator or not port_text.isdigit() or int(port_text) > 65535:
        raise ValueError(f"expected host:port, e.g. 127.0.0.1:9732, got {quoted(value)}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"write an IPv6 address in brackets, e.g. [::1]:9732, got {quoted(value)}")
    return host or "0.0.0.0", int(port_text)


def netloc(host: str, port: int) -> str:
    """`host:port`, an IPv6 address in brackets: how a URL and a message write an address."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _redacted(parts: SplitResult) -> str:
    """The URL with its user info replaced by `***@`, safe to show."""
    host = parts.netloc.rpartition("@")[2]
    return quoted(urlunsplit(parts._replace(netloc=f"***@{host}")))


def check_url(value: str) -> str:
    """Why `value` is not an http(s) URL a client can connect to, or "" if it is one."""
    try:
        parts = urlsplit(value)
    except ValueError as error:
        return f"not a valid URL ({error}): {quoted(value)}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"expected an http:// or https:// URL with a host, got {quoted(value)}"
    if "@" in parts.netloc:
        # The URL itself is not quoted: it holds the password.
        return (
            f"user info (user:password@) is not allowed in a URL, got {_redacted(parts)}: a URL "
            "is shown in stallwatch_target_info{url}, on / and in logs; credentials go in their "
            "own config fields (an http action's bearer_token_file), never in a URL"
        )
    try:
        port = parts.port
    except ValueError:
        port = 0
    if port == 0:
        return f"the port must be a number from 1 to 65535, got {quoted(value)}"
    return ""


class Section:
    """One mapping of a config file, read field by field; keys it does not know are errors.

    A Section and the sections read from it share one list of problems: a value that cannot be
    read is recorded there and read as its default; `attempt` records what a whole part raises;
    `finish` raises them all at once.
    """

    def __init__(
        self,
        source: str,
        path: str,
        data: object,
        keys: Collection[str],
        problems: list[ConfigError] | None = None,
    ) -> None:
        self.source = source
        self.path = path
        self.problems: list[ConfigError] = [] if problems is None else problems
        self._data: Mapping[str, object] = {}
        if not isinstance(data, Mapping):
            raise ConfigError(
                source, path or "(top level)", f"expected a mapping, got {_kind(data)}"
            )
        for key in data:
            if not isinstance(key, str):
                self._record(
                    ConfigError(source, path or "(top level)", f"key {quoted(key)} is not a string")
                )
            elif key not in keys:
                known = ", ".join(sorted(keys))
                self.report(key, f"unknown key (known keys: {known})")
        self._data = data

    def _record(self, error: ConfigError) -> None:
        self.problems.extend(_each(error))

    def report(self, key: str, message: str) -> None:
        """Record an error at `key` and read on."""
        self._record(self.error(key, message))

    def _fallback(self, key: str, message: str, fallback: _T) -> _T:
        self.report(key, message)
        return fallback

    def attempt(self, build: Callable[[], _T], fallback: _F) -> _T | _F:
        """`build()`, or `fallback` with what it raised recorded."""
        try:
            return build()
        except ConfigError as error:
            self._record(error)
            return fallback

    def finish(self) -> None:
        """Raise every problem recorded in this file, if there is any."""
        if self.problems:
            raise ConfigErrors(tuple(self.problems))

    def field_name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.source, self.field_name(key), message)

    def has(self, key: str) -> bool:
        return self._data.get(key) is not None

    def raw(self, key: str, default: object = None) -> object:
        value = self._data.get(key)
        return default if value is None else value

    def required(self, key: str) -> object:
        value = self._data.get(key)
        if value is None:
            raise self.error(key, "is required")
        return value

    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str:
        value = self.required(key) if required else self.raw(key, default)
        if not isinstance(value, str) or not value:
            message = f"expected a non-empty string, got {quoted(value)}"
            if required or not default:
                raise self.error(key, message)
            return self._fallback(key, message, default)
        return value

    def optional_string(self, key: str) -> str | None:
        return self.string(key) if self.has(key) else None

    def string_list(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.raw(key, list(default))
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            return self._fallback(
                key, f"expected a list of non-empty strings, got {quoted(value)}", default
            )
        return tuple(value)

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            return self._fallback(key, f"expected true or false, got {quoted(value)}", default)
        return value

    def integer(self, key: str, default: int, *, minimum: int = 0) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            message = f"expected an integer >= {minimum}, got {quoted(value)}"
            return self._fallback(key, message, max(default, minimum))
        return value

    def number(self, key: str, default: float, *, above: float, at_most: float) -> float:
        """A plain number in (`above`, `at_most`]; `default` applies when the key is absent."""
        if not self.has(key):
            return default
        value = self._data[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            return self._fallback(key, f"expected a number, got {quoted(value)}", default)
        if not above < value <= at_most:
            message = f"must be above {above:g} and at most {at_most:g}, got {value}"
            return self._fallback(key, message, default)
        return float(value)

    def duration(
        self, key: str, default: float, *, minimum: float = 0.0, zero: bool = False, why: str = ""
    ) -> float:
        """A duration above zero (or zero, where `zero` says it means something), >= `minimum`.

        `default` is in seconds and applies when the key is absent.
        """
        if not self.has(key):
            return default
        value = self._data[key]
        try:
            seconds = parse_duration(value)
        except ValueError as error:
            return self._fallback(key, str(error), default)
        if seconds < minimum:
            message = f"must be at least {_format_seconds(minimum)}{why}, got {value}"
            return self._fallback(key, message, default)
        if seconds == 0 and not zero:
            return self._fallback(key, f"must be longer than zero, got {value}", default)
        return seconds

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.raw(key, default)
        if not isinstance(value, str) or value not in choices:
            message = f"expected one of {', '.join(choices)}, got {quoted(value)}"
            if default not in choices:
                raise self.error(key, message)
            return self._fallback(key, message, default)
        return value

    def string_map(self, key: str) -> dict[str, str]:
        value = self.raw(key, {})
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            return self._fallback(key, "expected a mapping of strings to strings", {})
        return dict(value)

    def url(self, key: str) -> str:
        text = self.string(key, required=True)
        problem = check_url(text)
        if problem:
            raise self.error(key, problem)
        return text

    def listen(self, key: str, default: str) -> tuple[str, int]:
        try:
            return parse_listen(self.string(key, default))
        except ValueError as error:
            return self._fallback(key, str(error), parse_listen(default))

    def section(self, key: str, keys: Collection[str]) -> Section:
        """The mapping at `key`; one that is no mapping is recorded and read as empty."""
        path = self.field_name(key)
        try:
            return Section(self.source, path, self.raw(key, {}), keys, self.problems)
        except ConfigError as error:
            self._record(error)
            return Section(self.source, path, {}, keys, self.problems)

    def sections(self, key: str, keys: Collection[str], *, required: bool = False) -> list[Section]:
        value = self.raw(key, None if required else [])
        if value is None:
            return self._fallback(key, "is required", [])
        if not isinstance(value, list) or (required and not value):
            return self._fallback(
                key, "expected a non-empty list" if required else "expected a list", []
            )
        path = self.field_name(key)
        sections = []
        for index, item in enumerate(value):
            try:
                sections.append(Section(self.source, f"{path}[{index}]", item, keys, self.problems))
            except ConfigError as error:  # an item that is no mapping is left out
                self._record(error)
        return sections


def _kind(value: object) -> str:
    return "nothing" if value is None else type(value).__name__


def _format_seconds(seconds: float) -> str:
    return f"{seconds * 1000:g}ms" if 0 < seconds < 1 else f"{seconds:g}s"
