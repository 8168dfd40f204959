"""Which addresses `/probe` may read: the target parameter parsed, and matched to an allow-list.

Pure: no name is resolved and nothing is sent. A CIDR rule matches only a target written as an
IP address; a host rule matches the host as written (a glob such as `*.svc.cluster.local`), so
a name that DNS maps into a forbidden network is still refused unless a host rule names it.
"""

from __future__ import annotations

import fnmatch
import ipaddress
from dataclasses import dataclass
from urllib.parse import urlsplit

from stallwatch.common.config import netloc, quoted

DEFAULT_PORTS = {"http": 80, "https": 443}


class TargetError(ValueError):
    """A `target` parameter that is not a server address."""


class AllowRuleError(ValueError):
    """An allow-list entry that is neither a CIDR nor a `host[:port]` pattern."""


@dataclass(frozen=True)
class ProbeTarget:
    """A server named by a `/probe?target=` parameter: its base URL, host and port."""

    url: str
    host: str
    port: int


@dataclass(frozen=True)
class AllowRule:
    """One allow-list entry: a network, or a host glob; either with an optional port (glob)."""

    text: str
    network: ipaddress.IPv4Network | ipaddress.IPv6Network | None
    host_glob: str
    port_glob: str

    def matches(self, target: ProbeTarget) -> bool:
        if not fnmatch.fnmatchcase(str(target.port), self.port_glob):
            return False
        if self.network is not None:
            address = _ip(target.host)
            return address is not None and address in self.network
        return fnmatch.fnmatchcase(target.host.lower(), self.host_glob)


def _ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def parse_target(text: str) -> ProbeTarget:
    """`host:port`, `[v6]:port` or an `http(s)://host[:port][/base]` URL, as a ProbeTarget.

    A bare `host:port` (what Prometheus service discovery puts in `__address__`) means
    `http://host:port`. User info, a query or a fragment are refused: none belongs in a base URL.
    """
    text = text.strip()
    if not text:
        raise TargetError("empty target")
    url = text if "://" in text else f"http://{text}"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise TargetError(f"not a server address ({error}): {quoted(text)}") from None
    if parts.scheme not in DEFAULT_PORTS:
        raise TargetError(f"only http and https targets are read, got {quoted(text)}")
    if not parts.hostname:
        raise TargetError(f"no host in {quoted(text)}")
    if parts.username is not None or parts.password is not None:
        raise TargetError(f"user info is not allowed in a target: {quoted(text)}")
    if parts.query or parts.fragment:
        raise TargetError(f"a target has no query or fragment: {quoted(text)}")
    if port == 0:
        raise TargetError(f"port 0 in {quoted(text)}")
    host = parts.hostname.lower()
    port = port if port is not None else DEFAULT_PORTS[parts.scheme]
    base = f"{parts.scheme}://{netloc(host, port)}{parts.path.rstrip('/')}"
    return ProbeTarget(url=base, host=host, port=port)


def parse_allow_rule(text: str) -> AllowRule:
    """`10.0.0.0/8`, `10.0.0.0/8:8000`, `127.0.0.1`, `*.svc.cluster.local:8*`, `[::1]:8000`.

    An IPv6 address with a port is written in brackets; one without brackets whose last group
    could be a port (`fd00::5:8000`) is refused as ambiguous, not read as every port.
    """
    entry = text.strip()
    if not entry:
        raise AllowRuleError("an empty allow-list entry")
    host_part, port_glob = entry, "*"
    if entry.startswith("["):
        close = entry.find("]")
        if close < 0:
            raise AllowRuleError(f"unclosed [ in {quoted(entry)}")
        host_part, rest = entry[1:close], entry[close + 1 :]
        if rest:
            if not rest.startswith(":") or not rest[1:]:
                raise AllowRuleError(f"expected [address]:port, got {quoted(entry)}")
            port_glob = rest[1:]
    elif entry.count(":") == 1:
        host_part, port_glob = entry.split(":")
    elif entry.count(":") > 1 and not _is_network(entry):
        raise AllowRuleError(
            f"write an IPv6 address in brackets, e.g. [::1]:8000, got {quoted(entry)}"
        )
    elif (split := _address_and_port(entry)) is not None:
        address, port = split
        raise AllowRuleError(
            f"{quoted(entry)} is ambiguous: the IPv6 address {entry} on every port, or {address} on"
            f" port {port}? Write [{address}]:{port} for that port, {address} for every port of"
            f" {address}, or [{entry}] for every port of {entry}"
        )
    if not port_glob or not all(c.isdigit() or c in "*?[]-" for c in port_glob):
        raise AllowRuleError(f"the port must be a number or a glob like 80*, got {quoted(entry)}")
    if _is_network(host_part):
        network = ipaddress.ip_network(host_part, strict=False)
        return AllowRule(entry, network, "", port_glob)
    if not host_part or any(c in host_part for c in "/@ "):
        raise AllowRuleError(f"expected a CIDR or a host name pattern, got {quoted(entry)}")
    return AllowRule(entry, None, host_part.lower(), port_glob)


def _address_and_port(entry: str) -> tuple[str, str] | None:
    """The (address, port) an unbracketed IPv6 address such as `fd00::5:8000` could also be
    read as, or None when it can be read only one way (`fd00::5`, `::1`, a full address)."""
    if "/" in entry or entry.count(":") < 2:
        return None
    address, _, last = entry.rpartition(":")
    if not last.isdigit() or not 1 <= int(last) <= 65535:
        return None
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return None
    return address, last


def _is_network(text: str) -> bool:
    try:
        ipaddress.ip_network(text, strict=False)
    except ValueError:
        return False
    return True


def allowed(target: ProbeTarget, rules: tuple[AllowRule, ...]) -> bool:
    """Whether any rule lets `/probe` read `target` (an empty list allows nothing)."""
    return any(rule.matches(target) for rule in rules)
