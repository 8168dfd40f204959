"""The exporter in `/probe` mode, in-process: its config, a running service, one probe."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from stallwatch.common.exporter_config import ExporterConfig, exporter_config_from_mapping
from stallwatch.exporter.app import running_exporter
from stallwatch.exporter.service import ExporterService


def config(modules: dict[str, Any], **top: Any) -> ExporterConfig:
    return exporter_config_from_mapping({"modules": modules, **top}, "exporter.yml")


@contextlib.asynccontextmanager
async def exporter(cfg: ExporterConfig) -> AsyncIterator[tuple[ExporterService, str]]:
    async with running_exporter(cfg, Path("exporter.yml"), port=0) as running:
        yield running


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def value(text: str, name: str, **labels: str) -> float | None:
    return samples(text).get((name, tuple(sorted(labels.items()))))


async def probe(
    session: aiohttp.ClientSession, url: str, target: str, module: str = "m"
) -> tuple[int, str]:
    async with session.get(f"{url}/probe", params={"target": target, "module": module}) as r:
        return r.status, await r.text()
