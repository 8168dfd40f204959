"""What the contract tier shares: the real helm and kubectl (`make tools`), the chart rendered
with `helm template`, the kustomize overlays built with `kubectl kustomize`."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.tools import find_tool, missing_reason

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "stallwatch"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
KUBE = REPO / "deploy" / "kubernetes"
RELEASE = "stallwatch"
NAMESPACE = "stallwatch"


def tool(name: str) -> str:
    """The pinned tool, or a skip saying how to install it."""
    path = find_tool(name)
    if path is None:
        pytest.skip(missing_reason(name))
    return path


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


def explain(result: subprocess.CompletedProcess[str]) -> str:
    return f"exit {result.returncode}\nstdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr}"


def helm_template(*args: str) -> subprocess.CompletedProcess[str]:
    """`helm template stallwatch charts/stallwatch -n stallwatch ARGS`, as it finished."""
    return run(tool("helm"), "template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args)


def render(*args: str) -> list[dict[str, Any]]:
    """The objects the chart renders with ARGS (values files, --set), checked to render."""
    result = helm_template(*args)
    assert result.returncode == 0, explain(result)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def values(name: str) -> tuple[str, str]:
    """The `-f` arguments of one of the chart's ci/ values files."""
    path = CHART / "ci" / f"{name}-values.yaml"
    assert path.is_file(), path
    return ("-f", str(path))


def kustomize(overlay: str) -> list[dict[str, Any]]:
    """The objects of one overlay of deploy/kubernetes, which must build without a warning."""
    result = run(tool("kubectl"), "kustomize", str(KUBE / overlay))
    assert result.returncode == 0, explain(result)
    assert result.stderr == "", f"kubectl kustomize {overlay} warned:\n{result.stderr}"
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def one(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"{len(found)} {kind} {name or ''} in {[d['kind'] for d in docs]}"
    return found[0]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    spec: dict[str, Any] = doc["spec"]["template"]["spec"]
    return spec
