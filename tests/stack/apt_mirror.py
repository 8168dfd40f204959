"""Find the Debian mirror this machine's apt already uses, from its sources files."""

from __future__ import annotations

from pathlib import Path

SOURCES_DIR = Path("/etc/apt")


def _one_line_entries(text: str) -> list[tuple[list[str], list[str], list[str]]]:
    """`deb [options] URI SUITE COMPONENT...` lines as (uris, suites, components)."""
    entries = []
    for raw in text.splitlines():
        words = raw.split("#", 1)[0].split()
        if not words or words[0] != "deb":
            continue
        words = words[1:]
        if words and words[0].startswith("["):
            while words and not words[0].endswith("]"):
                words = words[1:]
            words = words[1:]
        if len(words) >= 2:
            entries.append(([words[0]], [words[1]], words[2:]))
    return entries


def _deb822_entries(text: str) -> list[tuple[list[str], list[str], list[str]]]:
    """deb822 stanzas (`Types:`, `URIs:`, `Suites:`, `Components:`) of type deb."""
    entries = []
    for stanza in text.split("\n\n"):
        fields: dict[str, list[str]] = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line or line[:1].isspace():
                continue
            key, value = line.split(":", 1)
            fields[key.strip().lower()] = value.split()
        if "deb" in fields.get("types", []) and fields.get("enabled", ["yes"]) != ["no"]:
            entries.append(
                (fields.get("uris", []), fields.get("suites", []), fields.get("components", []))
            )
    return entries


def debian_mirror(codename: str, sources_dir: Path = SOURCES_DIR) -> str | None:
    """The URI of the first enabled `deb` entry serving `codename` with `main`, or None."""
    files = [sources_dir / "sources.list"]
    parts = sources_dir / "sources.list.d"
    if parts.is_dir():
        files += sorted(parts.iterdir())
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if path.suffix == ".sources":
            entries = _deb822_entries(text)
        elif path.name == "sources.list" or path.suffix == ".list":
            entries = _one_line_entries(text)
        else:
            continue
        for uris, suites, components in entries:
            if codename in suites and "main" in components and uris:
                return uris[0].rstrip("/")
    return None


def os_codename(os_release: Path = Path("/etc/os-release")) -> str | None:
    """VERSION_CODENAME from os-release (e.g. bookworm), or None."""
    if not os_release.is_file():
        return None
    for line in os_release.read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition("=")
        if key == "VERSION_CODENAME" and value.strip('"'):
            return value.strip('"')
    return None
