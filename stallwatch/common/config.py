"""Helpers for strict YAML config: every error names the file and the field."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

_DECIMAL_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
# Prometheus' own format: whole numbers only, weeks allowed.
_PROMETHEUS_DURATION_PART = re.compile(r"(\d+)(ms|s|m|h|d|w)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def _duration_seconds(text: str, part: re.Pattern[str]) -> float | None:
    """The sum of `text`'s consecutive number-unit parts, or None unless they cover it all."""
    position = 0
    seconds = 0.0
    for match in part.finditer(text):
        if match.start() != position:
            break
        seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        position = match.end()
    return seconds if position == len(text) and position > 0 else None


class ConfigError(ValueError):
    """A config file that cannot be used, with the file and the field at fault."""

    def __init__(self, source: str, field: str, message: str) -> None:
        self.source = source
        self.field = field
        self.message = message
        where = f"{source}: {field}: " if field else f"{source}: "
        super().__init__(where + message)


def parse_duration(value: object) -> float:
    """Seconds from `15s`, `1m30s`, `2h`, `500ms`, or a plain number of seconds."""
    if isinstance(value, bool):
        raise ValueError("expected a duration like 15s, 10m or 1h")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and value.strip():
        parsed = _duration_seconds(value.strip(), _DECIMAL_DURATION_PART)
        if parsed is None:
            raise ValueError(f"expected a duration like 15s, 10m or 1h, got {value!r}")
        seconds = parsed
    else:
        raise ValueError(f"expected a duration like 15s, 10m or 1h, got {value!r}")
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    return seconds


def parse_prometheus_duration(text: str) -> float:
    """Seconds in a Prometheus-style duration such as `30s`, `10m`, `1h30m` or `200ms`."""
    if not text:
        raise ValueError("empty duration")
    seconds = _duration_seconds(text, _PROMETHEUS_DURATION_PART)
    if seconds is None:
        raise ValueError(f"not a duration: {text!r}")
    return seconds


def load_yaml_mapping(path: Path) -> dict[str, Any]:
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(source, "", f"cannot read: {error.strerror or error}") from error
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(source, "", f"not valid YAML: {error}") from error
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, "", "expected a mapping at the top level")
    return data


class Section:
    """One mapping in a config file, read field by field; leftover keys are errors."""

    def __init__(self, source: str, path: str, data: object) -> None:
        if not isinstance(data, Mapping):
            raise ConfigError(source, path or "(top level)", "expected a mapping")
        self.source = source
        self.path = path
        self._data = dict(data)
        self._seen: set[str] = set()

    def field_name(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def error(self, key: str, message: str) -> ConfigError:
        return ConfigError(self.source, self.field_name(key), message)

    def has(self, key: str) -> bool:
        return key in self._data

    def raw(self, key: str, default: object = None) -> object:
        self._seen.add(key)
        return self._data.get(key, default)

    def required(self, key: str) -> object:
        self._seen.add(key)
        if key not in self._data or self._data[key] is None:
            raise self.error(key, "is required")
        return self._data[key]

    def string(self, key: str, default: str | None = None, *, required: bool = False) -> str:
        value = self.required(key) if required else self.raw(key, default)
        if not isinstance(value, str) or not value:
            raise self.error(key, f"expected a non-empty string, got {value!r}")
        return value

    def optional_string(self, key: str) -> str | None:
        value = self.raw(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise self.error(key, f"expected a non-empty string, got {value!r}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.raw(key, default)
        if not isinstance(value, bool):
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def integer(self, key: str, default: int, *, minimum: int = 0) -> int:
        value = self.raw(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.error(key, f"expected an integer >= {minimum}, got {value!r}")
        return value

    def duration(self, key: str, default: float, *, minimum: float = 0.0) -> float:
        value = self.raw(key, default)
        try:
            seconds = parse_duration(value)
        except ValueError as error:
            raise self.error(key, str(error)) from error
        if seconds < minimum:
            raise self.error(key, f"must be at least {minimum:g} s")
        return seconds

    def choice(self, key: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.raw(key, default)
        if value not in choices:
            raise self.error(key, f"expected one of {', '.join(choices)}, got {value!r}")
        assert isinstance(value, str)
        return value

    def string_map(self, key: str) -> dict[str, str]:
        value = self.raw(key, {}) or {}
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise self.error(key, "expected a mapping of strings to strings")
        return dict(value)

    def section(self, key: str) -> Section:
        return Section(self.source, self.field_name(key), self.raw(key, {}) or {})

    def sections(self, key: str) -> list[Section]:
        value = self.raw(key, [])
        if not isinstance(value, list):
            raise self.error(key, "expected a list")
        return [
            Section(self.source, f"{self.field_name(key)}[{i}]", v) for i, v in enumerate(value)
        ]

    def finish(self) -> None:
        """Reject keys nobody asked for: a typo must not silently fall back to a default."""
        unknown = sorted(set(self._data) - self._seen)
        if unknown:
            raise self.error(unknown[0], "unknown key")
