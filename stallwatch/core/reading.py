"""Parse a model server's `/metrics` payload into a `Reading`: the common engine sample, per engine.

Which series feed which field of the sample is each engine's profile
(`stallwatch.engines`); `kind="auto"` reads every profile's series in one pass and keeps
the engine whose identifying families are present. A payload is tens of KB of exposition
text of which a few dozen lines matter: the parser finds the lines that start with a name it
wants with one regular expression (a prefix tree of the names, run in C), and parses labels
and value only for those. A server's lines come back at every read with only their values
changed: where each line's name and labels go (which field of which engine) is found once, and
a later read parses the value alone. A payload that is not all ASCII, or holds a carriage
return or another ASCII control character besides newline and tab, is read line by line
instead, with the same result. Either way the grammar is Prometheus' text format: lines end at
newline alone (a U+2028 inside a label value is part of it), and spaces or tabs may stand
between a name and its `{`, between labels, and before the value. A garbled payload is not an
error: unreadable lines are counted and skipped, and a payload without any engine series yields
a reading with no engines.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from stallwatch.core.sample_line import (
    KNOWN_HEADS,
    MAX_KNOWN_HEADS,
    NAME_END,
    MalformedLine,
    parse_value,
    split_sample,
)
from stallwatch.engines import AUTO, PROFILES, profile_for
from stallwatch.engines.profile import COUNTER_ROLES, EngineProfile, InflightSeries, Series

PROCESS_START_TIME = "process_start_time_seconds"

# vLLM's names for the common fields, kept for the callers that name them.
_VLLM = PROFILES["vllm"].role_names
RUNNING = _VLLM["running"]
WAITING = _VLLM["waiting"]
KV_CACHE_USAGE = _VLLM["kv_cache_usage"]
STEPS = _VLLM["steps"]
GENERATION_TOKENS = _VLLM["generation_tokens"]
PROMPT_TOKENS = _VLLM["prompt_tokens"]
REQUESTS_COMPLETED = _VLLM["requests_completed"]
PREEMPTIONS = _VLLM["preemptions"]


@dataclass(frozen=True)
class EngineSample:
    """The common sample of one engine (one model and engine-label identity) in one read.

    A value is None when the payload had no sample for it (some registries publish a series
    only after its first update): unknown, not zero. `kind` names the profile that read it.
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
    forward_tokens: float | None = None
    idle_loop: float | None = None
    forwards_started: float | None = None
    forwards_failed: float | None = None
    queue_time_sum: float | None = None
    queue_time_count: float | None = None
    kind: str = "vllm"

    @property
    def key(self) -> tuple[str, str]:
        return (self.model_name, self.engine)

    @property
    def profile(self) -> EngineProfile:
        return profile_for(self.kind)

    @property
    def forward_in_flight(self) -> float:
        """Forwards begun and not yet ended, where the engine counts both ends of each (TGI)."""
        if self.forwards_started is None or self.steps is None:
            return 0.0
        return max(0.0, self.forwards_started - self.steps - (self.forwards_failed or 0.0))

    @property
    def work(self) -> float:
        """Requests running plus waiting, or a forward in flight where the engine shows one
        that its gauges do not yet; an unknown gauge counts as no work."""
        gauges = (self.running or 0.0) + (self.waiting or 0.0)
        return gauges if gauges > 0 else self.forward_in_flight

    def counters(self) -> dict[str, float | None]:
        """The engine's progress counters by their exported family name."""
        names = self.profile.role_names
        return {names[role]: getattr(self, role) for role in COUNTER_ROLES if role in names}

    def role_of(self, family: str) -> str | None:
        """The common field a family name of this engine feeds."""
        for role, name in self.profile.role_names.items():
            if name == family:
                return role
        return None


@dataclass(frozen=True)
class Reading:
    """One read of a server's `/metrics`, taken at `taken_at` (seconds, caller's clock)."""

    taken_at: float
    engines: tuple[EngineSample, ...] = ()
    process_start_time: float | None = None
    malformed_lines: int = 0
    # A start marker from a response header (llama.cpp's Process-Start-Time-Unix): equality only.
    start_marker: str | None = field(default=None)
    # Client requests in flight at the HTTP layer, where the engine publishes them fresh.
    inflight_requests: float | None = None
    # The payload held no sample at all (nothing, or comments only): a TGI before its first
    # request, whose registry creates each series at its first update.
    empty: bool = False

    @property
    def has_engines(self) -> bool:
        return bool(self.engines)

    @property
    def engine_kind(self) -> str | None:
        """The profile that read the engines; None when no engine's families were present."""
        return self.engines[0].kind if self.engines else None

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
        return tuple(sorted({e.model_name for e in self.engines if e.model_name}))


def _sum_known(values: Iterable[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return sum(known) if known else None


_Tree = dict[str, "_Tree"]


def _prefix_tree(names: Iterable[str]) -> str:
    """A regular expression matching exactly `names`, shared prefixes written once: the regular
    expression engine then walks each line's name once instead of trying every name."""
    tree: _Tree = {}
    for name in names:
        node = tree
        for char in name:
            node = node.setdefault(char, {})
        node[""] = {}

    def pattern(node: _Tree) -> str:
        branches = [
            re.escape(char) + pattern(child) for char, child in sorted(node.items()) if char
        ]
        if not branches:
            return ""
        body = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{body})?" if "" in node else body

    return pattern(tree)


# Characters besides "\n", " " and "\t" that the line-by-line reading below strips at a
# line's ends (a CRLF payload), or that lines starting with them need a look of their own: a
# payload with none of them, all ASCII, is read by the expression.
_ODD_ASCII = ("\r", "\v", "\f", "\x1c", "\x1d", "\x1e", "\x1f")
# What the line-by-line reading strips at a line's ends: blanks, and a CRLF payload's "\r".
_LINE_ENDS = " \t\r\v\f\x1c\x1d\x1e\x1f"
# In "\n" + payload: the first line that is neither blank nor a comment.
_FIRST_SAMPLE = re.compile(r"\n[ \t]*[^# \t\n]")


@dataclass(frozen=True)
class _Table:
    """What one parse looks for: sample name to (profile, rules), the lines' first letters,
    and the expression that finds, in "\n" + payload, the lines that start with those names."""

    series: Mapping[str, tuple[EngineProfile, tuple[Series, ...]]]
    inflight: Mapping[str, tuple[EngineProfile, InflightSeries]]
    first_letters: frozenset[str]
    wanted_lines: re.Pattern[str]
    # Each line's route by its head: its name and label set (see parse_reading).
    routes: dict[str, _Route] = field(default_factory=dict)

    def wants(self, name: str) -> bool:
        return name in self.series or name in self.inflight or name == PROCESS_START_TIME


def _table(profiles: Iterable[EngineProfile]) -> _Table:
    series: dict[str, tuple[EngineProfile, tuple[Series, ...]]] = {}
    inflight: dict[str, tuple[EngineProfile, InflightSeries]] = {}
    for profile in profiles:
        for name, rules in profile.series.items():
            series[name] = (profile, rules)
        if profile.inflight is not None:
            inflight[profile.inflight.name] = (profile, profile.inflight)
    names = {*series, *inflight, PROCESS_START_TIME}
    letters = {name[0] for name in names}
    # A name ends at "{", a space or a tab (where the loop below cuts it) or at the line's end.
    # The loop checks each name again: the expression may find too many lines, never too few.
    wanted_lines = re.compile(
        r"\n[ \t]*((?:" + _prefix_tree(names) + r")(?:[{ \t][^\n]*|[ \t]*(?=\n|\Z)))"
    )
    return _Table(series, inflight, frozenset(letters), wanted_lines)


_TABLES: dict[str, _Table] = {kind: _table((profile,)) for kind, profile in PROFILES.items()}
_TABLES[AUTO] = _table(PROFILES.values())


def _lines_by_expression(payload: str, table: _Table) -> tuple[list[str], bool] | None:
    """The stripped lines that start with a wanted name, and whether the payload has no sample
    at all; None when the payload's lines must be read one by one (see _ODD_ASCII)."""
    if not payload.isascii() or any(odd in payload for odd in _ODD_ASCII):
        return None
    text = "\n" + payload
    lines = [match.group(1).rstrip(" \t") for match in table.wanted_lines.finditer(text)]
    return lines, _FIRST_SAMPLE.search(text) is None


def _lines_one_by_one(payload: str, table: _Table) -> tuple[list[str], bool]:
    """What `_lines_by_expression` gives, read line by line: every stripped line whose first
    character starts a wanted name, and whether the payload has no sample at all. Lines end at
    "\n" alone, as Prometheus reads them: a Unicode line separator (U+2028, U+0085) inside a
    label value is part of the value, not a line break."""
    first_letters = table.first_letters
    lines: list[str] = []
    empty = True
    for raw_line in payload.split("\n"):
        line = raw_line.strip(_LINE_ENDS)
        if not line:
            continue
        if empty and line[0] != "#":
            empty = False
        if line[0] in first_letters:
            lines.append(line)
    return lines, empty


def _identity(profile: EngineProfile, labels: Mapping[str, str]) -> tuple[str, str]:
    model = labels.get(profile.model_label, "") if profile.model_label else ""
    names = profile.engine_labels
    if not names:
        return model, ""
    if len(names) == 1:
        return model, labels.get(names[0], "")
    return model, "/".join(labels.get(name, "") for name in names)


# What a wanted sample line feeds, found from its name and labels alone: a series' roles, the
# process start time, or an in-flight gauge.
_FEEDS_ROLES, _FEEDS_START, _FEEDS_INFLIGHT = range(3)


@dataclass(frozen=True, slots=True)
class _Route:
    """Where one line's value goes, by its name and labels (each label set routed once)."""

    feeds: int
    name: str = ""
    kind: str = ""
    identity: tuple[str, str] = ("", "")
    part: bool = False  # a part of a series split by `split_label`: a total wins over it
    roles: tuple[tuple[str, bool], ...] = ()  # (role, summed) of the rules keeping the labels
    counted: bool = False  # an in-flight sample that counts


_START = _Route(_FEEDS_START)


def _route(table: _Table, name: str, labels: Mapping[str, str]) -> _Route:
    """The route of a line with a name the table wants (`_Table.wants`) and these labels."""
    entry = table.series.get(name)
    if entry is not None:
        profile, rules = entry
        return _Route(
            _FEEDS_ROLES,
            name,
            profile.kind,
            _identity(profile, labels),
            profile.split_label is not None and labels.get(profile.split_label, "") != "",
            tuple((rule.role, rule.summed) for rule in rules if rule.keeps(labels)),
        )
    if name == PROCESS_START_TIME:
        return _START
    profile, rule = table.inflight[name]
    counted = labels.get(rule.label) not in rule.not_counted
    return _Route(_FEEDS_INFLIGHT, name, profile.kind, counted=counted)


def parse_reading(
    payload: str, *, taken_at: float, kind: str = AUTO, line_by_line: bool = False
) -> Reading:
    """Read the engine series and the process start time from exposition text.

    `kind` forces one engine's profile; `auto` keeps the engine whose identifying families
    are present. Non-finite values are treated as missing. A payload with no engine series
    gives a reading with no engines (the `no_metrics` state), never an exception; one with no
    sample at all is marked `empty`. `line_by_line` reads every line in Python even when the
    payload allows the search in C (the same reading, slower: for tests and benchmarks).
    """
    table_kind = kind if kind == AUTO else profile_for(kind).kind
    table = _TABLES[table_kind]
    searched = None if line_by_line else _lines_by_expression(payload, table)
    lines, empty = searched if searched is not None else _lines_one_by_one(payload, table)
    routes = table.routes
    values: dict[str, dict[tuple[str, str], dict[str, float]]] = {}
    split_values: dict[str, dict[tuple[str, str], dict[str, float]]] = {}
    inflight: dict[str, float] = {}
    seen: dict[str, set[str]] = {}
    start_time: float | None = None
    malformed = 0
    for line in lines:
        # A line's head: its name and label set, up to the last "}"; without one, its name.
        close = line.rfind("}")
        if close >= 0:
            head_end = close + 1
        else:
            end = NAME_END.search(line)
            head_end = len(line) if end is None else end.start()
        head = line[:head_end]
        route = routes.get(head)
        try:
            if route is not None:
                value = parse_value(line[head_end:])
            else:
                end = NAME_END.search(line)
                if not table.wants(line if end is None else line[: end.start()]):
                    continue
                name, labels, value = split_sample(line)
                route = _route(table, name, labels)
                # Kept when the head is all of the name and labels: no "}", or a last "}"
                # that closes the label set (see KNOWN_HEADS).
                if close < 0 or head in KNOWN_HEADS:
                    if len(routes) >= MAX_KNOWN_HEADS:
                        routes.clear()
                    routes[head] = route
        except MalformedLine:
            malformed += 1
            continue
        if not math.isfinite(value):
            continue
        feeds = route.feeds
        if feeds == _FEEDS_ROLES:
            if not route.roles:
                continue
            seen.setdefault(route.kind, set()).add(route.name)
            engine_values = (
                (split_values if route.part else values)
                .setdefault(route.kind, {})
                .setdefault(route.identity, {})
            )
            for role, summed in route.roles:
                if summed and role in engine_values:
                    engine_values[role] += value
                else:
                    engine_values[role] = value
        elif feeds == _FEEDS_START:
            start_time = value
        elif route.counted:
            inflight[route.kind] = inflight.get(route.kind, 0.0) + value
        else:
            inflight.setdefault(route.kind, 0.0)
    for split_kind, parts in split_values.items():
        for key, part_values in parts.items():
            engine_totals = values.setdefault(split_kind, {}).setdefault(key, {})
            for role, part_value in part_values.items():
                engine_totals.setdefault(role, part_value)
    chosen = _choose(seen) if kind == AUTO else (table_kind if table_kind in values else None)
    if chosen is None:
        return Reading(
            taken_at=taken_at,
            process_start_time=start_time,
            malformed_lines=malformed,
            empty=empty,
        )
    engines = tuple(
        _engine_sample(chosen, key, found) for key, found in sorted(values[chosen].items())
    )
    return Reading(
        taken_at=taken_at,
        engines=engines,
        process_start_time=start_time,
        malformed_lines=malformed,
        inflight_requests=inflight.get(chosen),
    )


def _choose(seen: Mapping[str, set[str]]) -> str | None:
    """The engine whose identifying families are present; the most series found wins a tie."""
    best: str | None = None
    best_score = (0, 0)
    for kind, names in seen.items():
        score = (len(names & PROFILES[kind].identified_by), len(names))
        if score[0] and score > best_score:
            best, best_score = kind, score
    return best


def _engine_sample(kind: str, key: tuple[str, str], found: Mapping[str, float]) -> EngineSample:
    get = found.get
    return EngineSample(
        model_name=key[0],
        engine=key[1],
        running=get("running"),
        waiting=get("waiting"),
        kv_cache_usage=get("kv_cache_usage"),
        awake=get("awake"),
        steps=get("steps"),
        generation_tokens=get("generation_tokens"),
        prompt_tokens=get("prompt_tokens"),
        requests_completed=get("requests_completed"),
        preemptions=get("preemptions"),
        forward_tokens=get("forward_tokens"),
        idle_loop=get("idle_loop"),
        forwards_started=get("forwards_started"),
        forwards_failed=get("forwards_failed"),
        queue_time_sum=get("queue_time_sum"),
        queue_time_count=get("queue_time_count"),
        kind=kind,
    )


# A baseline older than this many poll intervals means a poll since gave no reading.
FRESH_BASELINE_INTERVALS = 1.5


def known_engine(baseline: Reading | None, now: float, interval: float) -> str | None:
    """The engine `kind: auto` may read again without asking `/v1/models` first: the one the
    previous poll read, when that poll gave a reading; None when it must identify again (no
    reading yet, no engine in it, or a failed read since: the process may have changed)."""
    if baseline is None or baseline.engine_kind is None:
        return None
    age = now - baseline.taken_at
    if not 0.0 <= age <= interval * FRESH_BASELINE_INTERVALS:
        return None
    return baseline.engine_kind


def with_start_marker(reading: Reading, marker: str | None) -> Reading:
    """Attach a process start marker taken from a response header."""
    return reading if reading.start_marker == marker else replace(reading, start_marker=marker)
