"""The `/probe` allow-list: target parameters parsed, entries parsed, and matched (tables)."""

from __future__ import annotations

import pytest

from stallwatch.common.allowlist import (
    AllowRuleError,
    TargetError,
    allowed,
    parse_allow_rule,
    parse_target,
)


@pytest.mark.parametrize(
    ("text", "url", "host", "port"),
    [
        ("127.0.0.1:8000", "http://127.0.0.1:8000", "127.0.0.1", 8000),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000", "127.0.0.1", 8000),
        ("https://VLLM.example:8443/base/", "https://vllm.example:8443/base", "vllm.example", 8443),
        ("http://vllm-0.svc", "http://vllm-0.svc:80", "vllm-0.svc", 80),
        ("[::1]:8000", "http://[::1]:8000", "::1", 8000),
    ],
)
def test_targets_parse_to_a_base_url(text: str, url: str, host: str, port: int) -> None:
    """A bare host:port means http; the URL is normalised (lower-case host, explicit port)."""
    target = parse_target(text)
    assert (target.url, target.host, target.port) == (url, host, port)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "ftp://127.0.0.1:21",
        "file:///etc/passwd",
        "http://user:pw@127.0.0.1:8000",
        "http://127.0.0.1:8000/?x=1",
        "http://127.0.0.1:8000/#frag",
        "127.0.0.1:notaport",
        "127.0.0.1:0",
        "http://:8000",
    ],
)
def test_bad_targets_are_refused(text: str) -> None:
    """Anything but an http(s) server address without user info, query or fragment is refused."""
    with pytest.raises(TargetError):
        parse_target(text)


ALLOW = (
    "10.0.0.0/8:8000",
    "127.0.0.1",
    "*.vllm.svc.cluster.local:80*",
    "[::1]:9000",
    "fd00::/8",
)


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("10.1.2.3:8000", True),
        ("10.1.2.3:8001", False),  # network allowed, port not
        ("11.1.2.3:8000", False),
        ("127.0.0.1:1234", True),  # no port in the rule: any port
        ("127.0.0.2:1234", False),
        ("vllm-0.vllm.svc.cluster.local:8000", True),
        ("vllm-0.vllm.svc.cluster.local:9000", False),
        ("evil.example:8000", False),
        ("vllm.svc.cluster.local.evil.example:8000", False),
        ("[::1]:9000", True),
        ("[::1]:9001", False),
        ("[fd00::5]:1", True),
        ("localhost:8000", False),  # a name never matches a network rule: nothing is resolved
    ],
)
def test_targets_match_the_allow_list(target: str, expected: bool) -> None:
    """Host globs match the host as written, CIDRs match literal addresses, ports must match."""
    rules = tuple(parse_allow_rule(entry) for entry in ALLOW)
    assert allowed(parse_target(target), rules) is expected


def test_an_empty_allow_list_allows_nothing() -> None:
    """No rule, no read."""
    assert not allowed(parse_target("127.0.0.1:8000"), ())


@pytest.mark.parametrize(
    "entry", ["", "10.0.0.0/8:http", "fe80::zz:80", "[::1", "[::1]x", "host/path", "a@b:80", "h:"]
)
def test_bad_allow_entries_are_refused(entry: str) -> None:
    """An entry that is neither a CIDR nor a host[:port] pattern is an error, not a no-op."""
    with pytest.raises(AllowRuleError):
        parse_allow_rule(entry)
