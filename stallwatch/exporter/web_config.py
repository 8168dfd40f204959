"""The exporter's `--web.config.file`: TLS and basic auth for its own endpoint, in the format of
the Prometheus exporter-toolkit (`tls_server_config`, `basic_auth_users` with bcrypt hashes).

Read with the config files' strict YAML (a user listed twice is an error, not the last one
winning), and every hash is checked with bcrypt at load. A password is at most 72 bytes (bcrypt's
limit: a longer one can never log in). A user name that is not configured is checked against a
dummy hash of the same cost, so a wrong name takes as long as a wrong password.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import re
import secrets
import ssl
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from aiohttp import web

from stallwatch.common.config import ConfigError
from stallwatch.common.config_files import load_yaml_mapping

CLIENT_AUTH_TYPES = {
    "NoClientCert": ssl.CERT_NONE,
    "RequestClientCert": ssl.CERT_OPTIONAL,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
TLS_VERSIONS = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
_TLS_KEYS = {"cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version"}
_TOP_KEYS = {"tls_server_config", "basic_auth_users"}
# Checking a bcrypt hash costs tens of milliseconds on purpose; a scrape every few seconds with
# the same credentials would pay it each time, so recent successes are remembered (by a digest
# of the password, never the password itself), as the exporter-toolkit does.
_VERIFIED_CACHE_SIZE = 64
log = logging.getLogger("stallwatch.exporter")
REALM = "stallwatch"
# A bcrypt hash as bcrypt writes it: $2a$, $2b$ or $2y$, a cost of 04 to 31, then 22 characters
# of salt and 31 of hash in bcrypt's base64 alphabet.
BCRYPT_HASH = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
# bcrypt reads at most this many bytes of a password; bcrypt 5 refuses longer ones.
MAX_PASSWORD_BYTES = 72


@dataclass(frozen=True)
class TlsServerConfig:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"


@dataclass(frozen=True)
class WebConfig:
    """TLS for the listener (None: plain HTTP) and users allowed in (empty: no auth)."""

    tls: TlsServerConfig | None = None
    basic_auth_users: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def load_web_config(path: Path) -> WebConfig:
    """Read and check the web config file; relative paths are taken next to it."""
    return web_config_from_mapping(load_yaml_mapping(path), str(path), path.parent)


def web_config_from_mapping(document: Any, source: str, base: Path) -> WebConfig:
    if not isinstance(document, dict):
        raise ConfigError(source, "", "expected a mapping at the top level")
    unknown = set(document) - _TOP_KEYS
    if unknown:
        raise ConfigError(
            source,
            sorted(unknown)[0],
            f"not supported here (supported: {', '.join(sorted(_TOP_KEYS))})",
        )
    tls = None
    if document.get("tls_server_config") is not None:
        tls = _tls(document["tls_server_config"], source, base)
    users = document.get("basic_auth_users") or {}
    if not isinstance(users, dict):
        raise ConfigError(source, "basic_auth_users", "expected a mapping of user: bcrypt hash")
    if users:
        _require_bcrypt(source)
    for user, hashed in users.items():
        where = f"basic_auth_users.{user}"
        if not isinstance(user, str) or not user or ":" in user:
            raise ConfigError(source, where, "a user name must be a non-empty string without ':'")
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise ConfigError(
                source, where, "expected a bcrypt hash ($2a$, $2b$ or $2y$), not a password"
            )
        problem = _hash_problem(hashed)
        if problem:
            raise ConfigError(source, where, problem)
    return WebConfig(tls, MappingProxyType(dict(users)))


def _hash_problem(hashed: str) -> str:
    """Why bcrypt cannot check passwords against `hashed` ("" when it can)."""
    if not BCRYPT_HASH.fullmatch(hashed):
        return (
            "not a bcrypt hash bcrypt can use (expected $2b$, $2a$ or $2y$, a cost from 04 to 31,"
            ' then 53 characters of ./A-Za-z0-9, as `htpasswd -nBC 10 ""` writes it)'
        )
    import bcrypt

    try:
        bcrypt.checkpw(b"", hashed.encode())
    except ValueError as error:
        return f"bcrypt cannot use this hash: {error}"
    return ""


def _tls(section: Any, source: str, base: Path) -> TlsServerConfig:
    if not isinstance(section, dict):
        raise ConfigError(source, "tls_server_config", "expected a mapping")
    unknown = set(section) - _TLS_KEYS
    if unknown:
        raise ConfigError(source, f"tls_server_config.{sorted(unknown)[0]}", "not supported")

    def file(name: str) -> Path | None:
        value = section.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigError(source, f"tls_server_config.{name}", "expected a file path")
        path = base / value
        if not path.is_file():
            raise ConfigError(source, f"tls_server_config.{name}", f"no file at {path}")
        return path

    cert_file, key_file = file("cert_file"), file("key_file")
    if cert_file is None or key_file is None:
        raise ConfigError(source, "tls_server_config", "cert_file and key_file are both required")
    client_auth = section.get("client_auth_type", "NoClientCert")
    if client_auth not in CLIENT_AUTH_TYPES:
        raise ConfigError(
            source,
            "tls_server_config.client_auth_type",
            f"expected one of {', '.join(CLIENT_AUTH_TYPES)}, got {client_auth!r}",
        )
    client_ca = file("client_ca_file")
    if client_auth != "NoClientCert" and client_auth != "RequestClientCert" and not client_ca:
        raise ConfigError(
            source, "tls_server_config.client_ca_file", f"required with {client_auth}"
        )
    min_version = section.get("min_version", "TLS12")
    if min_version not in TLS_VERSIONS:
        raise ConfigError(
            source,
            "tls_server_config.min_version",
            f"expected one of {', '.join(TLS_VERSIONS)}, got {min_version!r}",
        )
    tls = TlsServerConfig(cert_file, key_file, client_auth, client_ca, min_version)
    try:
        ssl_context(tls)
    except (ssl.SSLError, OSError) as error:
        raise ConfigError(source, "tls_server_config", f"cannot load: {error}") from None
    return tls


def _require_bcrypt(source: str) -> None:
    try:
        import bcrypt  # noqa: F401
    except ImportError:
        raise ConfigError(
            source,
            "basic_auth_users",
            "checking bcrypt hashes needs the bcrypt package: pip install bcrypt (or the "
            "'web' extra: pip install 'stallwatch[web]', from a checkout '.[web]')",
        ) from None


def ssl_context(tls: TlsServerConfig) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = TLS_VERSIONS[tls.min_version]
    context.load_cert_chain(tls.cert_file, tls.key_file)
    context.verify_mode = CLIENT_AUTH_TYPES[tls.client_auth_type]
    if tls.client_ca_file is not None:
        context.load_verify_locations(tls.client_ca_file)
    return context


class BasicAuth:
    """Checks `Authorization: Basic` against the configured bcrypt hashes."""

    def __init__(self, users: Mapping[str, str]) -> None:
        self.users = users
        self._verified: OrderedDict[tuple[str, bytes], None] = OrderedDict()
        self._dummy = _dummy_hash(users.values()) if users else ""
        self._told_too_long: set[str] = set()

    async def allows(self, header: str) -> bool:
        scheme, _, encoded = header.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        hashed = self.users.get(user)
        if not sep:
            return False
        if hashed is None:  # as long as a wrong password: user names cannot be found by timing
            await asyncio.to_thread(_bcrypt_matches, password, self._dummy)
            return False
        size = len(password.encode())
        if size > MAX_PASSWORD_BYTES and user not in self._told_too_long:
            self._told_too_long.add(user)  # once per user: a scrape every few seconds repeats it
            log.warning(
                "basic auth: user %r sent a password of %d bytes, refused: bcrypt reads at most"
                " %d bytes, so it can never log in; give it a password of at most %d bytes",
                user,
                size,
                MAX_PASSWORD_BYTES,
                MAX_PASSWORD_BYTES,
            )
        key = (user, hmac.digest(hashed.encode(), password.encode(), hashlib.sha256))
        if key in self._verified:
            self._verified.move_to_end(key)
            return True
        if not await asyncio.to_thread(_bcrypt_matches, password, hashed):
            return False
        self._verified[key] = None
        if len(self._verified) > _VERIFIED_CACHE_SIZE:
            self._verified.popitem(last=False)
        return True

    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        if not await self.allows(request.headers.get("Authorization", "")):
            return web.Response(
                status=401,
                text="Unauthorized\n",
                headers={"WWW-Authenticate": f'Basic realm="{REALM}"'},
            )
        return await handler(request)


def _dummy_hash(hashes: Iterable[str]) -> str:
    """A hash of a random password at the highest cost among `hashes`: what a user name that is
    not configured is checked against."""
    import bcrypt

    costs = [int(h[4:6]) for h in hashes if BCRYPT_HASH.fullmatch(h)]
    salt = bcrypt.gensalt(rounds=max(costs, default=10))
    return str(bcrypt.hashpw(secrets.token_hex(16).encode(), salt).decode())


def _bcrypt_matches(password: str, hashed: str) -> bool:
    import bcrypt

    secret = password.encode()
    try:
        # bcrypt reads at most 72 bytes and bcrypt 5 refuses more: a longer password never
        # logs in, and is checked (cut to 72) anyway, so it takes as long as any other.
        matches = bool(bcrypt.checkpw(secret[:MAX_PASSWORD_BYTES], hashed.encode()))
    except ValueError:  # a malformed hash allows nobody
        return False
    return matches and len(secret) <= MAX_PASSWORD_BYTES


def protect(app: web.Application, web_config: WebConfig | None) -> None:
    """Put basic auth in front of every endpoint of `app` (before it starts), if configured."""
    if web_config is not None and web_config.basic_auth_users:
        app.middlewares.append(BasicAuth(web_config.basic_auth_users).middleware)


def server_ssl_context(web_config: WebConfig | None) -> ssl.SSLContext | None:
    if web_config is None or web_config.tls is None:
        return None
    return ssl_context(web_config.tls)


def describe(web_config: WebConfig) -> str:
    tls = "TLS" if web_config.tls else "plain HTTP"
    users = len(web_config.basic_auth_users)
    if not users:
        return f"{tls}, no auth"
    return f"{tls}, basic auth ({users} user{'' if users == 1 else 's'})"
