"""The parser's search in C reads every payload exactly as reading it line by line does."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from stallwatch.core import reading as reading_module
from stallwatch.core import sample_line
from stallwatch.core.reading import parse_reading
from stallwatch.engines import AUTO, PROFILES

REAL_METRICS = Path(__file__).resolve().parents[1] / "testdata" / "real-metrics"
PAYLOADS = sorted(p for p in REAL_METRICS.glob("*.txt") if not p.name.endswith(".headers.txt"))
KINDS = (AUTO, *PROFILES)


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


@pytest.mark.parametrize("path", PAYLOADS, ids=[p.name for p in PAYLOADS])
def test_every_captured_payload_reads_the_same_both_ways_under_every_kind(path: Path) -> None:
    """Each captured real payload gives equal readings searched and line by line, every kind."""
    text = _text(path)
    for kind in KINDS:
        searched = parse_reading(text, taken_at=1.0, kind=kind)
        one_by_one = parse_reading(text, taken_at=1.0, kind=kind, line_by_line=True)
        assert searched == one_by_one, kind


@pytest.mark.parametrize("path", PAYLOADS, ids=[p.name for p in PAYLOADS])
def test_the_captured_payloads_are_searched_not_read_line_by_line(path: Path) -> None:
    """The comparison above is not empty: the real payloads take the search."""
    assert reading_module._lines_by_expression(_text(path), reading_module._TABLES[AUTO])


def _mutations(text: str, rng: random.Random) -> list[str]:
    lines = text.split("\n")

    def on_some_lines(change: object) -> str:
        assert callable(change)
        return "\n".join(change(line) if rng.random() < 0.2 else line for line in lines)

    cut = rng.randrange(len(text))
    return [
        on_some_lines(lambda line: "  \t" + line),
        on_some_lines(lambda line: line + " \t "),
        on_some_lines(lambda line: line.replace(" ", "\t", 1)),
        on_some_lines(lambda line: line.replace("{", " {", 1)),
        on_some_lines(lambda line: line.rsplit(" ", 1)[0]),
        on_some_lines(lambda line: line + "x"),
        on_some_lines(lambda line: line.replace("} ", "} NaN ", 1)),
        on_some_lines(lambda line: line.replace("} ", "} +Inf #", 1)),
        on_some_lines(lambda line: line.replace('"', "", 1)),
        on_some_lines(lambda line: line.replace("=", '="\\"', 1)),
        on_some_lines(lambda line: line + "\n" + line),
        on_some_lines(lambda line: "\n\n" + line),
        on_some_lines(lambda line: "# " + line),
        on_some_lines(lambda line: line[: len(line) // 2]),
        on_some_lines(lambda line: line.replace("model_name", "model_näme", 1)),
        text[:cut],
        text[cut:],
        text.replace("\n", "\r\n"),
        text.replace("\n", "\r", 3),
        text.replace("\n", "\x1e", 2),
        text.replace(" ", "\x1f", 2),
        "\n".join(line for line in lines if line.startswith("#")),
        "   \n\t\n",
        "",
    ]


@pytest.mark.parametrize("path", PAYLOADS, ids=[p.name for p in PAYLOADS])
def test_garbled_payloads_read_the_same_both_ways(path: Path) -> None:
    """Indented, trailing-blank, cut, doubled, commented, CR and non-ASCII variants agree."""
    rng = random.Random(path.name)
    for variant in _mutations(_text(path), rng):
        for kind in (AUTO, "vllm", "sglang", "llamacpp"):
            searched = parse_reading(variant, taken_at=1.0, kind=kind)
            one_by_one = parse_reading(variant, taken_at=1.0, kind=kind, line_by_line=True)
            assert searched == one_by_one, (kind, variant[:200])


def test_a_name_that_only_starts_like_a_wanted_one_is_not_read() -> None:
    """`vllm:num_requests_running_extra` is not `vllm:num_requests_running`, either way."""
    text = (
        'vllm:num_requests_running_extra{engine="0",model_name="m"} 7\n'
        'vllm:num_requests_running{engine="0",model_name="m"} 2\n'
    )
    for line_by_line in (False, True):
        reading = parse_reading(text, taken_at=1.0, line_by_line=line_by_line)
        assert reading.running == 2.0


LABEL_SETS = [
    '{a="1",b="two"} 3',
    '{ a = "1" , b="x y" ,} 3',
    '{a="es\\"caped",b="back\\\\slash",c="new\\nline"} 1',
    '{a="1"}b="2"} 1',
    '{="empty name"} 1',
    '{a}b="odd"} 1',
    '{,,, a="1"} 1',
    "{ } 1",
    "{} 1",
    '{a="unterminated',
    "{a=1} 1",
    '{a="1" b="2"} 1',
    '{a="1",',
    '{a="x}"} 1',
    '{a="ü",b="="} 1',
]


@pytest.mark.parametrize("text", LABEL_SETS)
def test_plain_labels_matched_in_c_read_as_the_character_loop_reads_them(text: str) -> None:
    """Label sets, escaped, odd and broken, give the same labels (or the same error) both ways."""

    def read(plain_first: bool) -> object:
        try:
            return sample_line.parse_labels(text, 0, plain_first=plain_first)
        except ValueError as error:
            return str(error)

    assert read(True) == read(False)


@pytest.mark.parametrize("path", PAYLOADS, ids=[p.name for p in PAYLOADS])
def test_every_label_set_of_the_captured_payloads_reads_the_same_both_ways(path: Path) -> None:
    """Every labelled sample line of every captured payload gives the same labels both ways."""
    for line in _text(path).splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        brace = line.index("{")
        fast = sample_line.parse_labels(line, brace)
        assert fast == sample_line.parse_labels(line, brace, plain_first=False), line


def _split_each(lines: list[str]) -> list[str]:
    """Each line's name, labels and value, or its error, written out (a NaN equals a NaN)."""
    results: list[str] = []
    for line in lines:
        try:
            results.append(repr(sample_line.split_sample(line)))
        except ValueError as error:
            results.append(str(error))
    return results


@pytest.mark.parametrize("path", PAYLOADS, ids=[p.name for p in PAYLOADS])
def test_a_line_whose_label_set_was_read_before_splits_as_if_it_were_new(path: Path) -> None:
    """The label sets kept from earlier reads change nothing: every line of every garbled
    variant splits the same with nothing kept and with all of them kept, values included."""
    rng = random.Random(path.name)
    lines = [
        line.strip()
        for variant in _mutations(_text(path), rng)
        for line in variant.split("\n")
        if line.strip() and not line.strip().startswith("#")
    ]
    moved = [line.replace("} ", "} 42", 1) for line in lines]
    sample_line.KNOWN_HEADS.clear()
    cold = _split_each(lines)
    if any("{" in line for line in lines):
        assert sample_line.KNOWN_HEADS  # the label sets are kept
    assert _split_each(lines) == cold
    warm_moved = _split_each(moved)
    sample_line.KNOWN_HEADS.clear()
    assert warm_moved == _split_each(moved)


def _forget_routes() -> None:
    sample_line.KNOWN_HEADS.clear()
    for table in reading_module._TABLES.values():
        table.routes.clear()


@pytest.mark.parametrize("path", PAYLOADS, ids=[p.name for p in PAYLOADS])
def test_a_payload_whose_lines_were_routed_before_reads_as_if_it_were_new(path: Path) -> None:
    """The routes kept from earlier reads change nothing: every garbled variant, values moved
    or made unreadable, reads the same under every kind with no route kept and with all kept."""
    rng = random.Random(path.name)
    variants = _mutations(_text(path), rng)
    variants += [
        variant.replace("} ", "} 42 ", 7).replace("} ", "} x", 3).replace("} ", "} NaN", 2)
        for variant in variants
    ]
    # A "}" after the label set: the head up to the last "}" is not the name and labels.
    variants.append("\n".join(f"{line} }}" for line in _text(path).split("\n")))
    for kind in KINDS:
        table = reading_module._TABLES[
            AUTO if kind == AUTO else reading_module.profile_for(kind).kind
        ]
        routed = False
        for variant in variants:
            _forget_routes()
            cold = parse_reading(variant, taken_at=1.0, kind=kind, line_by_line=True)
            routed = routed or bool(table.routes)
            assert parse_reading(variant, taken_at=1.0, kind=kind, line_by_line=True) == cold
            assert parse_reading(variant, taken_at=1.0, kind=kind) == cold
        if kind in (AUTO, *(p for p in PROFILES if p in path.name)):
            assert routed  # the comparisons went through kept routes
