"""The API server's name rules, as the restarter checks alert labels before any API call."""

from __future__ import annotations

import pytest

from stallwatch.core.kube_names import is_namespace_name, is_pod_name, name_problem

POD_NAMES = [
    ("vllm-0", True),
    ("vllm.gpu-a.0", True),
    ("0", True),
    ("x" * 253, True),
    ("x" * 254, False),
    (".", False),
    ("..", False),
    ("a..b", False),
    ("a.-b", False),
    ("-a", False),
    ("a-", False),
    ("Vllm", False),
    ("vllm/eviction", False),
    ("vllm_0", False),
    ("", False),
    ("vllm\n", False),
]
NAMESPACE_NAMES = [
    ("llm", True),
    ("l" * 63, True),
    ("l" * 64, False),
    ("llm.prod", False),
    ("..", False),
    ("LLM", False),
    ("llm-", False),
]


@pytest.mark.parametrize(("name", "valid"), POD_NAMES)
def test_pod_names_are_dns1123_subdomains(name: str, valid: bool) -> None:
    """A pod name is valid exactly when it is a DNS-1123 subdomain of at most 253 characters."""
    assert is_pod_name(name) is valid


@pytest.mark.parametrize(("name", "valid"), NAMESPACE_NAMES)
def test_namespace_names_are_dns1123_labels(name: str, valid: bool) -> None:
    """A namespace name is valid exactly when it is a DNS-1123 label of at most 63 characters."""
    assert is_namespace_name(name) is valid


def test_the_problem_names_the_field_and_shortens_long_values() -> None:
    """The refusal says which name is wrong, and repeats at most 80 characters of it."""
    assert name_problem("llm", "vllm-0") is None
    namespace = name_problem("LLM", "vllm-0")
    assert namespace is not None
    assert namespace.startswith("namespace 'LLM' is not a Kubernetes namespace name")
    pod = name_problem("llm", "X" * 500)
    assert pod is not None
    assert pod.startswith("pod 'XXX")
    assert len(pod) < 300
