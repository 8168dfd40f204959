"""Parse a vLLM `/metrics` payload into a `Reading`: only what the decision needs.

A payload is about 50 KB of exposition text, of which a few dozen lines matter. The parser
looks at each line's metric name first and parses labels and value only for the lines it
wants, so it spends its time proportional to the payload size with a small constant.
A garbled payload is not an error: lines that cannot be read are counted and skipped, and a
payload without any engine series simply yields a reading with no engines.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

PROCESS_START_TIME = "process_start_time_seconds"

# The engine-side series the decision reads, by the sample name vLLM V1 exports.
RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
SLEEP_STATE = "vllm:engine_sleep_state"
STEPS = "vllm:iteration_tokens_total_count"
GENERATION_TOKENS = "vllm:generation_tokens_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"
REQUESTS_COMPLETED = "vllm:request_success_total"
PREEMPTIONS = "vllm:num_preemptions_total"

# Counters: each only grows within one process, so a decrease means a new process.
COUNTERS: tuple[str, ...] = (
    STEPS,
    GENERATION_TOKENS,
    PROMPT_TOKENS,
    REQUESTS_COMPLETED,
    PREEMPTIONS,
)
GAUGES: tuple[str, ...] = (RUNNING, WAITING, KV_CACHE_USAGE)
# request_success_total has one series per finished_reason; they are added up.
SUMMED: frozenset[str] = frozenset({REQUESTS_COMPLETED})

_WANTED: frozenset[str] = frozenset((*COUNTERS, *GAUGES, SLEEP_STATE))


@dataclass(frozen=True)
class EngineSample:
    """The values of one engine (one `model_name`, `engine` label pair) in one read.

    A value is None when the payload had no sample for it (prometheus multiprocess mode
    publishes some gauges only after the first request): unknown, not zero.
    """

    model_name: str
    engine: str
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None
    awake: float | None = None
    steps: float | None = None
    generation_tokens: float | None = None
    prompt_tokens: float | None = None
    requests_completed: float | None = None
    preemptions: float | None = None

    @property
    def key(self) -> tuple[str, str]:
        return (self.model_name, self.engine)

    @property
    def work(self) -> float:
        """Requests running plus waiting; an unknown gauge counts as no work."""
        return (self.running or 0.0) + (self.waiting or 0.0)

    def counters(self) -> dict[str, float | None]:
        return {
            STEPS: self.steps,
            GENERATION_TOKENS: self.generation_tokens,
            PROMPT_TOKENS: self.prompt_tokens,
            REQUESTS_COMPLETED: self.requests_completed,
            PREEMPTIONS: self.preemptions,
        }


@dataclass(frozen=True)
class Reading:
    """One read of a server's `/metrics`, taken at `taken_at` (seconds, caller's clock)."""

    taken_at: float
    engines: tuple[EngineSample, ...] = ()
    process_start_time: float | None = None
    malformed_lines: int = 0
    # A start marker from a response header (llama.cpp's Process-Start-Time-Unix): equality only.
    start_marker: str | None = field(default=None)

    @property
    def has_engines(self) -> bool:
        return bool(self.engines)

    def engine_map(self) -> dict[tuple[str, str], EngineSample]:
        return {engine.key: engine for engine in self.engines}

    @property
    def running(self) -> float | None:
        return _sum_known(engine.running for engine in self.engines)

    @property
    def waiting(self) -> float | None:
        return _sum_known(engine.waiting for engine in self.engines)

    @property
    def model_names(self) -> tuple[str, ...]:
        return tuple(sorted({engine.model_name for engine in self.engines}))


def _sum_known(values: Iterable[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


class _MalformedLine(ValueError):
    pass


def _parse_labels(text: str, start: int) -> tuple[dict[str, str], int]:
    """Parse `{a="x",b="y"}` starting at the `{`; return the labels and the index after `}`."""
    labels: dict[str, str] = {}
    position = start + 1
    length = len(text)
    while True:
        while position < length and text[position] in " ,":
            position += 1
        if position >= length:
            raise _MalformedLine("unterminated label set")
        if text[position] == "}":
            return labels, position + 1
        equals = text.find("=", position)
        if equals < 0 or equals + 1 >= length or text[equals + 1] != '"':
            raise _MalformedLine("label without a quoted value")
        name = text[position:equals].strip()
        position = equals + 2
        value_chars: list[str] = []
        while True:
            if position >= length:
                raise _MalformedLine("unterminated label value")
            char = text[position]
            if char == "\\" and position + 1 < length:
                escaped = text[position + 1]
                value_chars.append("\n" if escaped == "n" else escaped)
                position += 2
                continue
            if char == '"':
                position += 1
                break
            value_chars.append(char)
            position += 1
        labels[name] = "".join(value_chars)


def _parse_value(text: str) -> float:
    fields = text.split()
    if not fields:
        raise _MalformedLine("no value")
    try:
        return float(fields[0])
    except ValueError as error:
        raise _MalformedLine(f"bad value {fields[0]!r}") from error


def _split_sample(line: str) -> tuple[str, dict[str, str], float]:
    brace = line.find("{")
    space = line.find(" ")
    if brace >= 0 and (space < 0 or brace < space):
        labels, after = _parse_labels(line, brace)
        return line[:brace], labels, _parse_value(line[after:])
    if space < 0:
        raise _MalformedLine("no value")
    return line[:space], {}, _parse_value(line[space:])


def _add(current: float | None, value: float) -> float:
    return value if current is None else current + value


def parse_reading(payload: str, *, taken_at: float) -> Reading:
    """Read the engine series and the process start time from exposition text.

    Non-finite values are treated as missing. A payload with no engine series gives a
    reading with no engines (the `no_metrics` state), never an exception.
    """
    values: dict[tuple[str, str], dict[str, float]] = {}
    start_time: float | None = None
    malformed = 0
    for raw_line in payload.splitlines():
        line = raw_line.strip()
        if not line or line[0] == "#":
            continue
        if line[0] == "v":
            end = len(line)
            for stop in ("{", " "):
                found = line.find(stop)
                if 0 <= found < end:
                    end = found
            name = line[:end]
            if name not in _WANTED:
                continue
            try:
                _, labels, value = _split_sample(line)
            except _MalformedLine:
                malformed += 1
                continue
            if not math.isfinite(value):
                continue
            if name == SLEEP_STATE:
                if labels.get("sleep_state") != "awake":
                    continue
                name = "awake"
            key = (labels.get("model_name", ""), labels.get("engine", ""))
            engine_values = values.setdefault(key, {})
            if name in SUMMED:
                engine_values[name] = _add(engine_values.get(name), value)
            else:
                engine_values[name] = value
        elif line.startswith(PROCESS_START_TIME):
            try:
                name, _, value = _split_sample(line)
            except _MalformedLine:
                malformed += 1
                continue
            if name == PROCESS_START_TIME and math.isfinite(value):
                start_time = value
    engines = tuple(_engine_sample(key, found) for key, found in sorted(values.items()))
    return Reading(
        taken_at=taken_at,
        engines=engines,
        process_start_time=start_time,
        malformed_lines=malformed,
    )


def _engine_sample(key: tuple[str, str], found: Mapping[str, float]) -> EngineSample:
    return EngineSample(
        model_name=key[0],
        engine=key[1],
        running=found.get(RUNNING),
        waiting=found.get(WAITING),
        kv_cache_usage=found.get(KV_CACHE_USAGE),
        awake=found.get("awake"),
        steps=found.get(STEPS),
        generation_tokens=found.get(GENERATION_TOKENS),
        prompt_tokens=found.get(PROMPT_TOKENS),
        requests_completed=found.get(REQUESTS_COMPLETED),
        preemptions=found.get(PREEMPTIONS),
    )


def with_start_marker(reading: Reading, marker: str | None) -> Reading:
    """Attach a process start marker taken from a response header."""
    return replace(reading, start_marker=marker)
