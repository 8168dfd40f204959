"""The exporter's --web.config.file: the exporter-toolkit format, checked with clear errors."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import bcrypt
import pytest
import yaml

from stallwatch.common.config import ConfigError
from stallwatch.exporter.web_config import BasicAuth, load_web_config

HASH = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=4)).decode()


def write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "web.yml"
    path.write_text(yaml.safe_dump(document))
    return path


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_users_with_bcrypt_hashes_load(tmp_path: Path) -> None:
    """basic_auth_users maps names to bcrypt hashes; no TLS section means plain HTTP."""
    config = load_web_config(write(tmp_path, {"basic_auth_users": {"prometheus": HASH}}))
    assert config.tls is None
    assert dict(config.basic_auth_users) == {"prometheus": HASH}


def test_an_empty_file_means_no_tls_and_no_auth(tmp_path: Path) -> None:
    """An empty web config changes nothing, as in the exporter-toolkit."""
    (tmp_path / "web.yml").write_text("")
    config = load_web_config(tmp_path / "web.yml")
    assert config.tls is None
    assert not config.basic_auth_users


@pytest.mark.parametrize(
    ("document", "field", "words"),
    [
        ({"basic_auth_users": {"prometheus": "s3cret"}}, "basic_auth_users.prometheus", "bcrypt"),
        ({"basic_auth_users": ["prometheus"]}, "basic_auth_users", "mapping"),
        ({"http_server_config": {"http2": True}}, "http_server_config", "not supported"),
        ({"tls_server_config": {"cert_file": "a.crt"}}, "tls_server_config", "no file"),
        ({"tls_server_config": {}}, "tls_server_config", "both required"),
        ({"tls_server_config": {"cert_fil": "a.crt"}}, "tls_server_config.cert_fil", "not"),
    ],
)
def test_bad_files_name_the_file_and_the_field(
    tmp_path: Path, document: object, field: str, words: str
) -> None:
    """A password where a hash belongs, an unknown key or a missing certificate is refused."""
    path = write(tmp_path, document)
    with pytest.raises(ConfigError) as error:
        load_web_config(path)
    assert error.value.source == str(path)
    assert error.value.field.startswith(field)
    assert words in error.value.message


def test_a_missing_file_is_a_clear_error(tmp_path: Path) -> None:
    """A web config path that does not exist is refused, naming it."""
    with pytest.raises(ConfigError, match="cannot read"):
        load_web_config(tmp_path / "absent.yml")


async def test_basic_auth_accepts_the_right_password_only() -> None:
    """The right user and password pass; a wrong password, an unknown user, no header or
    another scheme do not."""
    auth = BasicAuth({"prometheus": HASH})
    assert await auth.allows(basic("prometheus", "s3cret"))
    assert await auth.allows(basic("prometheus", "s3cret"))  # from the cache
    assert not await auth.allows(basic("prometheus", "wrong"))
    assert not await auth.allows(basic("grafana", "s3cret"))
    assert not await auth.allows("")
    assert not await auth.allows("Bearer s3cret")
    assert not await auth.allows("Basic !!!")


async def test_a_2y_hash_from_htpasswd_is_accepted() -> None:
    """Hashes written by htpasswd -B ($2y$) work as the exporter-toolkit's docs suggest."""
    auth = BasicAuth({"prometheus": "$2y$" + HASH.removeprefix("$2b$")})
    assert await auth.allows(basic("prometheus", "s3cret"))


async def test_a_missing_user_is_checked_against_a_hash_of_the_same_cost(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A user name that is not configured is checked by bcrypt against a dummy hash of the same
    cost as a wrong password is, so it is refused no faster (names cannot be found by timing);
    the costs are compared, not timed, so a loaded machine cannot fail it."""
    auth = BasicAuth({"prometheus": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(rounds=8)).decode()})
    checked: list[bytes] = []
    real = bcrypt.checkpw

    def counting(password: bytes, hashed: bytes) -> bool:
        checked.append(hashed)
        return real(password, hashed)

    monkeypatch.setattr(bcrypt, "checkpw", counting)
    assert not await auth.allows(basic("prometheus", "wrong"))
    assert not await auth.allows(basic("grafana", "wrong"))
    wrong_password, missing_user = checked
    assert wrong_password[:7] == missing_user[:7] == b"$2b$08$"  # the same algorithm and cost
    assert wrong_password != missing_user


async def test_passwords_log_in_up_to_72_bytes_and_a_longer_one_is_told_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A 72-byte password logs in; 73 bytes never does (bcrypt's limit), and the log says why
    once for that user."""
    password = "p" * 72
    auth = BasicAuth({"prometheus": bcrypt.hashpw(password.encode(), bcrypt.gensalt(4)).decode()})
    assert await auth.allows(basic("prometheus", password))
    with caplog.at_level(logging.WARNING, logger="stallwatch.exporter"):
        assert not await auth.allows(basic("prometheus", password + "p"))
        assert not await auth.allows(basic("prometheus", password + "p"))
    told = [r.getMessage() for r in caplog.records if "at most 72 bytes" in r.getMessage()]
    assert len(told) == 1
    assert "'prometheus' sent a password of 73 bytes" in told[0]


def test_a_user_listed_twice_is_refused_naming_the_line(tmp_path: Path) -> None:
    """The web config is read with the strict loader: a second entry of a user is an error,
    not the last one silently winning."""
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prometheus: '{HASH}'\n  prometheus: '{HASH}'\n")
    with pytest.raises(ConfigError) as error:
        load_web_config(path)
    assert error.value.source == str(path)
    assert error.value.field == "basic_auth_users.prometheus"
    assert "duplicate key (first on line 2)" in error.value.message


@pytest.mark.parametrize(
    "hashed",
    [
        "$2b$10$",  # cut short
        HASH[:-1],  # one character short
        HASH + "x",  # one too many
        "$2b$99$" + HASH[7:],  # no such cost
        "$2b$03$" + HASH[7:],  # below bcrypt's minimum cost
        HASH[:-1] + "!",  # not bcrypt's alphabet
        "$2x$" + HASH[4:],  # not a bcrypt variant
    ],
    ids=["cut", "short", "long", "cost-99", "cost-03", "alphabet", "variant"],
)
def test_hashes_bcrypt_cannot_use_are_refused_at_load(tmp_path: Path, hashed: str) -> None:
    """Each hash is checked at load (and so by --config.check): one bcrypt cannot use is an
    error naming the user, not a user that can never log in."""
    with pytest.raises(ConfigError) as error:
        load_web_config(write(tmp_path, {"basic_auth_users": {"prometheus": hashed}}))
    assert error.value.field == "basic_auth_users.prometheus"
    assert "bcrypt" in error.value.message
