"""The Debian mirror for the base image is read from apt's own sources, in both formats."""

from __future__ import annotations

from pathlib import Path

from .apt_mirror import debian_mirror, os_codename

DEB822 = """\
Types: deb
# a snapshot the mirror follows
URIs: http://mirror.example/debian/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""


def sources(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "sources.list.d").mkdir()
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_a_deb822_sources_file_names_the_mirror(tmp_path: Path) -> None:
    """debian.sources: the URI of the stanza serving the release's own suite with main."""
    root = sources(tmp_path, {"sources.list.d/debian.sources": DEB822})
    assert debian_mirror("bookworm", root) == "http://mirror.example/debian"


def test_one_line_entries_skip_other_suites_sources_and_options(tmp_path: Path) -> None:
    """`deb [opts] URI SUITE main`: deb-src, third-party suites and comments are passed over."""
    text = (
        "# deb http://commented.example/debian bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb https://vendor.example/apt cloud-sdk-bookworm main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://one.example/debian bookworm main contrib\n"
    )
    root = sources(tmp_path, {"sources.list": text})
    assert debian_mirror("bookworm", root) == "http://one.example/debian"


def test_no_entry_for_the_release_is_none(tmp_path: Path) -> None:
    """Sources with no entry for the release give None (the tier then fails with a reason)."""
    root = sources(tmp_path, {"sources.list.d/debian.sources": DEB822})
    assert debian_mirror("trixie", root) is None


def test_the_codename_comes_from_os_release(tmp_path: Path) -> None:
    """VERSION_CODENAME, quoted or not."""
    release = tmp_path / "os-release"
    release.write_text('NAME="Debian GNU/Linux"\nVERSION_CODENAME="bookworm"\n')
    assert os_codename(release) == "bookworm"
    assert os_codename(tmp_path / "missing") is None
