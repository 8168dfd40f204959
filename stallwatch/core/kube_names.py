"""Which alert labels can name a pod at all: the API server's own name rules, checked before any
API call. Pure.

A pod's name is a DNS-1123 subdomain and a namespace's a DNS-1123 label
(k8s.io/apimachinery/pkg/util/validation: IsDNS1123Subdomain, IsDNS1123Label; the API server
validates pods with ValidatePodName and namespaces with ValidateNamespaceName). Anything else
in a request path means something other than a pod: `…/pods/.` is normalised to the
namespace's pod list, `…/pods/..` to the Namespace itself, and a `/` names a subresource.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Literal

from stallwatch.common.kubernetes_config import PodRule

INVALID_POD_NAME: Literal["invalid_pod_name"] = "invalid_pod_name"
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN_MAX = 253
_LABEL = "[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS1123_LABEL = re.compile(_LABEL)
_DNS1123_SUBDOMAIN = re.compile(rf"{_LABEL}(\.{_LABEL})*")
# How much of a refused name a detail repeats.
_SHOWN = 80


def is_pod_name(name: str) -> bool:
    """Whether the API server accepts `name` as a pod's name (a DNS-1123 subdomain)."""
    return len(name) <= DNS1123_SUBDOMAIN_MAX and _DNS1123_SUBDOMAIN.fullmatch(name) is not None


def is_namespace_name(name: str) -> bool:
    """Whether the API server accepts `name` as a namespace's name (a DNS-1123 label)."""
    return len(name) <= DNS1123_LABEL_MAX and _DNS1123_LABEL.fullmatch(name) is not None


def _shown(name: str) -> str:
    return repr(name if len(name) <= _SHOWN else name[:_SHOWN] + "...")


def name_problem(namespace: str, pod: str) -> str | None:
    """Why `namespace` and `pod` name no pod, or None when both are valid names."""
    if not is_namespace_name(namespace):
        return (
            f"namespace {_shown(namespace)} is not a Kubernetes namespace name (a DNS-1123"
            f" label: at most {DNS1123_LABEL_MAX} lower-case letters, digits and '-', starting"
            " and ending with a letter or digit)"
        )
    if not is_pod_name(pod):
        return (
            f"pod {_shown(pod)} is not a Kubernetes pod name (a DNS-1123 subdomain: at most"
            f" {DNS1123_SUBDOMAIN_MAX} characters, dot-separated parts of lower-case letters,"
            " digits and '-', each starting and ending with a letter or digit)"
        )
    return None


def invalid_pod_names(rules: Sequence[PodRule], labels: Mapping[str, str]) -> str | None:
    """Why an alert's labels name no pod for some rule, or None.

    Each rule reads the pod from its own `namespace_label` and `pod_label`; an alert that
    carries both for some rule, and whose values are no Kubernetes names, is refused whatever
    the rules would say of it.
    """
    for rule in rules:
        namespace = labels.get(rule.namespace_label, "")
        pod = labels.get(rule.pod_label, "")
        if namespace and pod:
            problem = name_problem(namespace, pod)
            if problem is not None:
                return problem
    return None
