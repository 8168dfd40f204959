"""Extract the vLLM metric families from captured `/metrics` payloads into a JSON data file.

Run once when a new vLLM version is captured:

    python -m stallwatch.simulator.extract_families OUT.json PAYLOAD.txt [PAYLOAD.txt ...]

For each `vllm:` family (in payload order) it records the type, HELP text, label names,
the values of the one extra label that some families carry (`finished_reason`, `source`,
`reason`, `sleep_state`), the histogram bucket bounds, and for info-style gauges the
full label set. The simulator renders its payload from that file.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

ENGINE_LABELS = ("engine", "model_name")
INFO_FAMILIES = ("vllm:cache_config_info",)


def extract(payloads: list[str]) -> list[dict[str, Any]]:
    """Return the family descriptions found in the payloads, in first-seen order."""
    families: dict[str, dict[str, Any]] = {}
    for text in payloads:
        for family in text_string_to_metric_families(text):
            if not family.name.startswith("vllm:") or (
                family.type == "gauge" and (family.name.endswith("_created"))
            ):
                continue
            entry = families.setdefault(
                family.name,
                {
                    "name": family.name,
                    "type": family.type,
                    "help": family.documentation,
                    "labels": [],
                    "extra_label": None,
                    "extra_values": [],
                    "buckets": [],
                    "info_labels": None,
                },
            )
            for sample in family.samples:
                names = [n for n in sample.labels if n != "le"]
                for name in names:
                    if name not in entry["labels"]:
                        entry["labels"].append(name)
                extra = [n for n in names if n not in ENGINE_LABELS]
                if family.name in INFO_FAMILIES:
                    entry["info_labels"] = {
                        k: v for k, v in sample.labels.items() if k not in ENGINE_LABELS
                    }
                    continue
                if len(extra) == 1:
                    entry["extra_label"] = extra[0]
                    value = sample.labels[extra[0]]
                    if value not in entry["extra_values"]:
                        entry["extra_values"].append(value)
                if sample.name.endswith("_bucket"):
                    bound = float(sample.labels["le"])
                    if bound != float("inf") and bound not in entry["buckets"]:
                        entry["buckets"].append(bound)
    return list(families.values())


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out, *inputs = argv
    families = extract([Path(p).read_text(encoding="utf-8") for p in inputs])
    Path(out).write_text(json.dumps(families, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(families)} families to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
