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
from stallwatch.common.config import ConfigError
from stallwatch.common.exporter_config import exporter_config_from_mapping


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


@pytest.mark.parametrize("entry", ["fd00::5:8000", "::1:9000", "fe80::1:2:80"])
def test_an_unbracketed_ipv6_address_ending_like_a_port_is_ambiguous(entry: str) -> None:
    """`fd00::5:8000` is refused, saying how to write the port and the every-port forms."""
    address, port = entry.rsplit(":", 1)
    with pytest.raises(AllowRuleError, match="ambiguous") as raised:
        parse_allow_rule(entry)
    assert f"[{address}]:{port} for that port" in str(raised.value)
    assert f"{address} for every port" in str(raised.value)


@pytest.mark.parametrize(
    ("entry", "port"),
    [
        ("fd00::5", "*"),
        ("::1", "*"),
        ("fd00::8000", "*"),
        ("[fd00::5:8000]", "*"),
        ("2001:db8:0:0:0:0:0:8000", "*"),
        ("fd00::/64", "*"),
        ("fd00::5:0", "*"),
        ("[fd00::5]:8000", "8000"),
    ],
)
def test_ipv6_entries_that_read_one_way_are_accepted(entry: str, port: str) -> None:
    """Unbracketed addresses that cannot be address:port, and bracketed ones, still load."""
    assert parse_allow_rule(entry).port_glob == port


def test_the_exporter_config_refuses_the_ambiguous_entry_naming_file_and_field() -> None:
    """At config load the error names the file and the module's allow entry."""
    modules = {"m": {"allow": ["127.0.0.1", "fd00::5:8000"]}}
    with pytest.raises(ConfigError) as raised:
        exporter_config_from_mapping({"modules": modules}, "exporter.yml")
    message = str(raised.value)
    assert message.startswith("exporter.yml: modules.m.allow[1]: ")
    assert "[fd00::5]:8000" in message
