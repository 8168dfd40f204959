"""The exporter's own endpoint behind TLS and basic auth (--web.config.file), on loopback."""

from __future__ import annotations

import base64
import ssl
import subprocess
import sys
from pathlib import Path

import aiohttp
import bcrypt
import pytest
import yaml

from stallwatch.common.exporter_config import ExporterConfig
from stallwatch.exporter.app import running_exporter
from stallwatch.exporter.web_config import load_web_config
from tests.support.exporter import target

PASSWORD = "scrape-me"


def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "exporter.crt", tmp_path / "exporter.key"
    result = subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
         "-keyout", str(key), "-out", str(cert)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    return cert, key


def write_web_config(tmp_path: Path, *, tls: bool = True) -> Path:
    document: dict[str, object] = {
        "basic_auth_users": {
            "prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        }
    }
    if tls:
        self_signed(tmp_path)
        # Relative paths are taken next to the web config file.
        document["tls_server_config"] = {"cert_file": "exporter.crt", "key_file": "exporter.key"}
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(document))
    return path


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def exporter_config() -> ExporterConfig:
    # A target nobody answers: the endpoint serves its metrics all the same.
    return ExporterConfig(
        targets=(target("gpu1", "http://127.0.0.1:9"),), listen_host="127.0.0.1", listen_port=0
    )


async def test_tls_and_basic_auth_guard_every_endpoint(tmp_path: Path) -> None:
    """Over HTTPS with the configured CA: no or wrong credentials get 401 with a Basic
    challenge, the right ones get the metrics; plain HTTP to the port gets nothing."""
    web_config = load_web_config(write_web_config(tmp_path))
    trust = ssl.create_default_context(cafile=str(tmp_path / "exporter.crt"))
    async with (
        running_exporter(exporter_config(), tmp_path / "x.yml", web_config=web_config) as (
            _,
            url,
        ),
        aiohttp.ClientSession() as session,
    ):
        assert url.startswith("https://127.0.0.1:")
        for path in ("/metrics", "/", "/-/healthy"):
            async with session.get(url + path, ssl=trust) as response:
                assert response.status == 401
                assert response.headers["WWW-Authenticate"].startswith("Basic realm=")
        async with session.get(
            url + "/metrics", ssl=trust, headers=basic("prometheus", "wrong")
        ) as response:
            assert response.status == 401
        async with session.get(
            url + "/metrics", ssl=trust, headers=basic("prometheus", PASSWORD)
        ) as response:
            assert response.status == 200
            assert "stallwatch_target_info" in await response.text()
        with pytest.raises(aiohttp.ClientError):
            async with session.get(url.replace("https://", "http://") + "/metrics") as response:
                await response.read()


async def test_basic_auth_without_tls(tmp_path: Path) -> None:
    """basic_auth_users alone guards a plain-HTTP endpoint."""
    web_config = load_web_config(write_web_config(tmp_path, tls=False))
    async with (
        running_exporter(exporter_config(), tmp_path / "x.yml", web_config=web_config) as (
            _,
            url,
        ),
        aiohttp.ClientSession() as session,
    ):
        assert url.startswith("http://")
        async with session.get(url + "/metrics") as response:
            assert response.status == 401
        async with session.get(url + "/metrics", headers=basic("prometheus", PASSWORD)) as response:
            assert response.status == 200


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "stallwatch", "exporter", *args],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def test_config_check_reads_the_web_config(tmp_path: Path) -> None:
    """--config.check with --web.config.file says TLS and basic auth; a password where a hash
    belongs fails the check with the file and the field named."""
    config = tmp_path / "exporter.yml"
    config.write_text(yaml.safe_dump({"targets": [{"name": "gpu1", "url": "http://127.0.0.1:9"}]}))
    good = run_cli(
        "--config",
        str(config),
        "--web.config.file",
        str(write_web_config(tmp_path)),
        "--config.check",
    )
    assert good.returncode == 0, good.stderr
    assert "TLS, basic auth (1 user)" in good.stdout
    bad = tmp_path / "bad-web.yml"
    bad.write_text(yaml.safe_dump({"basic_auth_users": {"prometheus": PASSWORD}}))
    refused = run_cli("--config", str(config), "--web.config.file", str(bad), "--config.check")
    assert refused.returncode == 1
    assert f"{bad}: basic_auth_users.prometheus" in refused.stderr
