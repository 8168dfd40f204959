"""One version everywhere: pyproject.toml says it; the CHANGELOG's latest release, the
Dockerfile's default VERSION, the kustomize image tags, the chart's appVersion and
`stallwatch --version` say the same."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]


def package_version() -> str:
    version: str = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    return version


def changelog_latest_release(text: str) -> str:
    """The newest `## X.Y.Z` heading; `## Unreleased ...` is not a release."""
    for line in text.splitlines():
        match = re.fullmatch(r"## (\d+\.\d+\.\d+)\s*", line)
        if match:
            return match.group(1)
    raise AssertionError("the CHANGELOG has no `## X.Y.Z` heading")


def test_the_changelog_parser_skips_unreleased() -> None:
    """The CHANGELOG's latest release is the first numbered heading, not Unreleased (0.2.0)."""
    text = "# Changelog\n\n## Unreleased (0.2.0)\n\n- x\n\n## 0.1.0\n\n- y\n"
    assert changelog_latest_release(text) == "0.1.0"
    with pytest.raises(AssertionError):
        changelog_latest_release("## Unreleased\n")


def test_the_changelog_latest_release_is_the_package_version() -> None:
    """CHANGELOG.md's newest released heading is pyproject's version."""
    text = (REPO / "CHANGELOG.md").read_text()
    assert changelog_latest_release(text) == package_version()


def test_the_dockerfile_default_version_is_the_package_version() -> None:
    """The Dockerfile's `ARG VERSION=` (its OCI version label) is pyproject's version."""
    (version,) = re.findall(r"^ARG VERSION=(\S+)$", (REPO / "Dockerfile").read_text(), re.M)
    assert version == package_version()


def test_the_chart_app_version_is_the_package_version() -> None:
    """charts/stallwatch's appVersion (the default image tag) is pyproject's version."""
    chart = yaml.safe_load((REPO / "charts" / "stallwatch" / "Chart.yaml").read_text())
    assert chart["appVersion"] == package_version()


def test_the_kustomize_image_tags_are_the_package_version() -> None:
    """Every `images:` newTag in deploy/kubernetes is pyproject's version."""
    tags = []
    for path in sorted((REPO / "deploy" / "kubernetes").glob("*/kustomization.yaml")):
        for image in yaml.safe_load(path.read_text()).get("images", []):
            tags.append(image["newTag"])
    assert tags
    assert set(tags) == {package_version()}


def test_the_command_reports_the_package_version() -> None:
    """`stallwatch --version` prints pyproject's version (the installed metadata)."""
    stallwatch = Path(sys.executable).parent / "stallwatch"
    result = subprocess.run(
        [str(stallwatch), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"stallwatch {package_version()}"
