"""The shipped fleet-mode Prometheus configs: valid for promtool, and relabeled to `/probe`."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

PROMETHEUS_DIR = Path(__file__).resolve().parents[2] / "prometheus"
FLEET_FILES = ("probe-file-sd.yml", "probe-sharded.yml", "probe-kubernetes-sd.yml")
# Debian's Prometheus build leaves out Kubernetes discovery; its promtool says this.
NO_KUBERNETES_SD = "field kubernetes_sd_configs not found"


def promtool_check(path: Path) -> subprocess.CompletedProcess[str]:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed (Debian package prometheus)")
    return subprocess.run(
        [promtool, "check", "config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def probe_jobs(name: str) -> list[dict[str, Any]]:
    document = yaml.safe_load((PROMETHEUS_DIR / name).read_text())
    return [job for job in document["scrape_configs"] if job.get("metrics_path") == "/probe"]


@pytest.mark.parametrize("name", FLEET_FILES)
def test_fleet_config_is_valid(name: str, tmp_path: Path) -> None:
    """promtool accepts each fleet config and the rule files it loads.

    Where promtool was built without Kubernetes discovery, the Kubernetes config is checked
    with its pod discovery swapped for a static list: everything else, relabeling included.
    """
    path = PROMETHEUS_DIR / name
    result = promtool_check(path)
    if result.returncode != 0 and NO_KUBERNETES_SD in result.stdout + result.stderr:
        document = yaml.safe_load(path.read_text())
        for job in document["scrape_configs"]:
            if job.pop("kubernetes_sd_configs", None) is not None:
                job["static_configs"] = [{"targets": ["10.244.0.5:8000"]}]
        for rule_file in document["rule_files"]:
            shutil.copy(PROMETHEUS_DIR / rule_file, tmp_path / rule_file)
        path = tmp_path / name
        path.write_text(yaml.safe_dump(document))
        result = promtool_check(path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rule files found" in result.stdout


@pytest.mark.parametrize("name", FLEET_FILES)
def test_probe_jobs_use_the_multi_target_relabeling(name: str) -> None:
    """Each /probe job passes the address as `target` and `instance` and scrapes the exporter,
    under a job name StallwatchExporterDown watches."""
    jobs = probe_jobs(name)
    assert jobs
    for job in jobs:
        assert job["job_name"].startswith("stallwatch-exporter")
        assert job["params"] == {"module": ["vllm"]}
        rules = job["relabel_configs"]
        to_param = [r for r in rules if r.get("target_label") == "__param_target"]
        assert to_param == [{"source_labels": ["__address__"], "target_label": "__param_target"}]
        to_instance = [r for r in rules if r.get("target_label") == "instance"]
        assert to_instance == [{"source_labels": ["__param_target"], "target_label": "instance"}]
        last = rules[-1]
        assert last["target_label"] == "__address__"
        assert ":9732" in last["replacement"]


def test_shards_split_by_hashmod_with_one_modulus() -> None:
    """The two shard jobs keep hash 0 and 1 of the same modulus over the same discovery."""
    jobs = probe_jobs("probe-sharded.yml")
    kept = []
    for job in jobs:
        (hashmod,) = [r for r in job["relabel_configs"] if r.get("action") == "hashmod"]
        assert hashmod["modulus"] == len(jobs)
        (keep,) = [r for r in job["relabel_configs"] if r.get("action") == "keep"]
        kept.append(keep["regex"])
    assert sorted(kept) == [str(i) for i in range(len(jobs))]
    assert len({str(job["file_sd_configs"]) for job in jobs}) == 1
    assert len({job["relabel_configs"][-1]["replacement"] for job in jobs}) == len(jobs)


def test_kubernetes_job_selects_pods_by_label_and_port_by_name() -> None:
    """Pods by label, the container port by name, and the pod's namespace and name kept."""
    (job,) = probe_jobs("probe-kubernetes-sd.yml")
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod"
    assert sd["selectors"] == [{"role": "pod", "label": "app.kubernetes.io/name=vllm"}]
    rules = job["relabel_configs"]
    assert {
        "source_labels": ["__meta_kubernetes_pod_container_port_name"],
        "regex": "http",
        "action": "keep",
    } in rules
    targets = {r.get("target_label"): r.get("source_labels") for r in rules}
    assert targets["namespace"] == ["__meta_kubernetes_namespace"]
    assert targets["pod"] == ["__meta_kubernetes_pod_name"]
