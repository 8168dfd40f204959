"""The restarter's metric table in docs/restarter.md names exactly the families it publishes."""

from __future__ import annotations

import re
from pathlib import Path

from stallwatch.common.kubernetes_config import KubernetesSettings
from stallwatch.common.restarter_config import CommandAction, RestarterConfig, Target
from stallwatch.restarter.app import RESTARTER_KEY, build_app

DOCS = Path(__file__).resolve().parents[2] / "docs"
ROW = re.compile(r"^\| `(stallwatch_restarter_[a-z_]+)")


def documented(page: str) -> set[str]:
    """The metric names the page's table rows start with (labels left out)."""
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    return {m.group(1) for line in lines if (m := ROW.match(line))}


def published(config: RestarterConfig, tmp_path: Path) -> set[str]:
    """The families the restarter's registry holds, named as they are scraped."""
    app = build_app(config)
    registry = app[RESTARTER_KEY].metrics.registry
    names = set()
    for family in registry.collect():
        names.add(family.name + ("_total" if family.type == "counter" else ""))
    app[RESTARTER_KEY].journal.close()
    return names


def test_the_docs_table_names_every_restarter_family(tmp_path: Path) -> None:
    """Every family the restarter publishes (Kubernetes ones included) has a row, and every
    row names a family it publishes."""
    target = Target("gpu1", "http://127.0.0.1:9/metrics", CommandAction(argv=("true",)))
    config = RestarterConfig(
        targets=(target,),
        journal=str(tmp_path / "journal.sqlite"),
        insecure_no_auth=True,
        kubernetes=KubernetesSettings(),
    )
    assert published(config, tmp_path) == documented("restarter.md")


EXPORTER_ROW = re.compile(r"^\| `stallwatch_")
NAME = re.compile(r"`(stallwatch_[a-z_]+)")
# Published until 0.3 under the names before 0.2 (docs/exporter.md says so beside the table).
DEPRECATED = {"stallwatch_probe_requests_total", "stallwatch_probe_failures_total"}


def test_the_docs_table_names_every_exporter_family_a_target_publishes() -> None:
    """Every family a target and the process publish on /metrics has a row in
    docs/exporter.md's table, and every row names one."""
    from stallwatch.common.exporter_config import ExporterConfig, TargetConfig
    from stallwatch.core.history import TargetHistory
    from stallwatch.exporter.collector import ExporterProcessCollector, TargetCollector
    from stallwatch.exporter.reload import ReloadStatus

    config = ExporterConfig(targets=(TargetConfig(name="gpu1", url="http://127.0.0.1:9"),))
    families = [
        *TargetCollector(lambda: config, lambda: {"gpu1": TargetHistory()}).collect(),
        *ExporterProcessCollector(lambda: ReloadStatus()).collect(),
    ]
    names = {f.name + ("_total" if f.type == "counter" else "") for f in families}
    lines = (DOCS / "exporter.md").read_text(encoding="utf-8").splitlines()
    documented_names = {
        name
        for line in lines
        if EXPORTER_ROW.match(line)
        for name in NAME.findall(line.split("|")[1])
    }
    assert names - DEPRECATED == documented_names
