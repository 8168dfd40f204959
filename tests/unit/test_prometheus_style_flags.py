"""The Prometheus ecosystem's spellings work as aliases: --web.listen-address, --log.level,
--log.format; every component answers --version; the exporter serves /-/ready."""

from __future__ import annotations

import argparse
from pathlib import Path

import aiohttp
import pytest

from stallwatch import __version__
from stallwatch.cli import build_parser
from stallwatch.common.exporter_config import ExporterConfig
from stallwatch.exporter.app import running_exporter
from tests.support.exporter import target


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [
        (("--listen", "127.0.0.1:1"), ("--web.listen-address", "127.0.0.1:1")),
        (("--log-level", "debug"), ("--log.level", "debug")),
        (("--log-format", "json"), ("--log.format", "json")),
        (("--web.config.file", "w.yml"), ("--web.config.file", "w.yml")),
    ],
)
def test_the_exporter_takes_the_prometheus_spellings(
    ours: tuple[str, str], theirs: tuple[str, str]
) -> None:
    """Each Prometheus-style flag sets what its stallwatch spelling sets."""
    assert vars(parse("exporter", "--config", "e.yml", *theirs)) == vars(
        parse("exporter", "--config", "e.yml", *ours)
    )


@pytest.mark.parametrize("component", ["restarter", "sim"])
def test_the_log_aliases_work_on_every_component(component: str) -> None:
    """--log.level and --log.format work on the restarter and the simulator too."""
    args = parse(component, "--log.level", "error", "--log.format", "logfmt")
    assert (args.log_level, args.log_format) == ("error", "logfmt")


def test_a_bad_log_level_is_still_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """The alias keeps the choices: --log.level loud is a usage error naming the choices."""
    with pytest.raises(SystemExit) as raised:
        parse("exporter", "--config", "e.yml", "--log.level", "loud")
    assert raised.value.code == 64
    assert "debug" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [(), ("exporter",), ("restarter",)])
def test_version_is_answered_everywhere(
    argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """`stallwatch --version`, `stallwatch exporter --version` and `stallwatch restarter
    --version` print the version and exit 0, without a config."""
    with pytest.raises(SystemExit) as raised:
        parse(*argv, "--version")
    assert raised.value.code == 0
    assert capsys.readouterr().out.strip() == f"stallwatch {__version__}"


async def test_the_exporter_answers_ready(tmp_path: Path) -> None:
    """GET /-/ready answers 200 on a running exporter, as /-/healthy does."""
    config = ExporterConfig(
        targets=(target("gpu1", "http://127.0.0.1:9"),), listen_host="127.0.0.1", listen_port=0
    )
    async with (
        running_exporter(config, tmp_path / "x.yml") as (_, url),
        aiohttp.ClientSession() as session,
    ):
        for path in ("/-/ready", "/-/healthy"):
            async with session.get(url + path) as response:
                assert response.status == 200
                assert await response.text() == "ok\n"
        async with session.get(url + "/-/readyz") as response:
            assert response.status == 404
