"""Every relative link and `#anchor` in README.md and docs/*.md points at something that exists.

A link's file must exist (relative to the page it is on), and an anchor must be the slug GitHub
makes of a heading of the target page (lower case, punctuation dropped, spaces to hyphens, `-1`,
`-2` added to repeated headings), or an explicit `id`/`name` in its HTML.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^ {0,3}(```|~~~)")
HEADING = re.compile(r"^ {0,3}(#{1,6})[ \t]+(.*?)(?:[ \t]+#+)?[ \t]*$")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
INLINE_LINK = re.compile(
    r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)"
)
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_ANCHOR = re.compile(r"<[a-zA-Z][^>]*\s(?:id|name)=\"([^\"]+)\"")
HTML_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")


@dataclass(frozen=True)
class Link:
    page: Path
    line: int
    target: str


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading's text (before any `-N` for repeats)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link counts by its text
    text = re.sub(r"<[^>]+>", "", text)
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def prose_lines(text: str) -> list[tuple[int, str]]:
    """The page's lines outside fenced code blocks, numbered from 1."""
    lines, in_fence = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if FENCE.match(line):
            in_fence = not in_fence
            continue
        if not in_fence:
            lines.append((number, line))
    return lines


def anchors(page: Path) -> set[str]:
    """Every anchor a link may use on the page: heading slugs and explicit HTML ids."""
    text = page.read_text(encoding="utf-8")
    found: set[str] = set(HTML_ANCHOR.findall(text))
    seen: dict[str, int] = {}
    for _, line in prose_lines(text):
        match = HEADING.match(line)
        if match is None:
            continue
        slug = github_slug(match.group(2))
        repeats = seen.get(slug, 0)
        seen[slug] = repeats + 1
        found.add(slug if repeats == 0 else f"{slug}-{repeats}")
    return found


def links(page: Path) -> list[Link]:
    """The page's links, leaving out code and HTML comments."""
    text = HTML_COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), page.read_text("utf-8"))
    found: list[Link] = []
    for number, line in prose_lines(text):
        line = INLINE_CODE.sub("", line)
        targets = INLINE_LINK.findall(line)
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            targets.append(definition.group(1))
        found.extend(Link(page, number, target) for target in targets)
    return found


def broken(link: Link) -> str | None:
    """Why the link does not resolve, or None when it does."""
    if SCHEME.match(link.target) or link.target.startswith("//"):
        return None  # absolute: not this test's business
    path, _, anchor = link.target.partition("#")
    target = (link.page.parent / path).resolve() if path else link.page
    if not target.exists():
        return f"no such file: {path}"
    if anchor and target.suffix == ".md" and anchor not in anchors(target):
        return f"no heading with the anchor #{anchor} in {target.name}"
    return None


def problems(pages: list[Path]) -> list[str]:
    """Every broken link on the pages, as `page:line: target: why`."""
    found = []
    for page in pages:
        for link in links(page):
            reason = broken(link)
            if reason is not None:
                where = page.relative_to(REPO) if page.is_relative_to(REPO) else page.name
                found.append(f"{where}:{link.line}: ({link.target}) {reason}")
    return found


def documentation() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def test_every_link_in_the_readme_and_docs_resolves() -> None:
    """Every relative link in README.md and docs/*.md names an existing file and heading."""
    pages = documentation()
    assert len(pages) > 1, "no pages in docs/"
    assert sum(len(links(page)) for page in pages) > 20, "the link scanner found almost nothing"
    assert problems(pages) == []


def test_every_docs_page_is_linked_from_the_readme() -> None:
    """No page in docs/ is an orphan: the README links to each one."""
    linked = {
        (REPO / link.target.partition("#")[0]).resolve()
        for link in links(REPO / "README.md")
        if not SCHEME.match(link.target)
    }
    orphans = [page.name for page in documentation()[1:] if page.resolve() not in linked]
    assert orphans == []


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Quick start", "quick-start"),
        ("See it work: `make demo`", "see-it-work-make-demo"),
        ("One-shot check, without Prometheus", "one-shot-check-without-prometheus"),
        ("Tested on a real vLLM server (`tests/real`)", "tested-on-a-real-vllm-server-testsreal"),
        ("The vLLM simulator (`stallwatch sim`)", "the-vllm-simulator-stallwatch-sim"),
        (
            "Safety rules, in the order they are checked",
            "safety-rules-in-the-order-they-are-checked",
        ),
        ("`stallwatch_target_up` and [links](x.md)", "stallwatch_target_up-and-links"),
        ("Ünïcode — dash", "ünïcode--dash"),
    ],
)
def test_slugs_are_the_ones_github_makes(heading: str, slug: str) -> None:
    """Heading text becomes the anchor GitHub renders for it."""
    assert github_slug(heading) == slug


def test_broken_files_and_anchors_are_reported(tmp_path: Path) -> None:
    """A missing file, a missing heading and a repeat past the last `-N` are each reported."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "other.md").write_text("# Other\n\n## Part\n\n## Part\n", encoding="utf-8")
    page = tmp_path / "README.md"
    page.write_text(
        "# Title\n\n"
        "[ok](docs/other.md#part-1) [ok](#title) [ok](https://example.invalid/x#y)\n"
        "`[in code](missing.md)`\n"
        "```\n[in a fence](missing.md)\n```\n"
        "[gone](docs/missing.md)\n"
        "[no heading](docs/other.md#part-2)\n"
        "[no local heading](#nothing)\n"
        "[ref]: docs/also-missing.md\n",
        encoding="utf-8",
    )
    reported = problems([page])
    assert [problem.split(":")[1] for problem in reported] == ["8", "9", "10", "11"], reported
    assert "no such file: docs/missing.md" in reported[0]
    assert "#part-2" in reported[1]
    assert "#nothing" in reported[2]
    assert "docs/also-missing.md" in reported[3]
