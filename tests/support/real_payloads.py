"""Where the captured real `/metrics` payloads live: `tests/testdata/real-metrics/`."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
REAL_METRICS = REPO_ROOT / "tests" / "testdata" / "real-metrics"


def real_payload(name: str) -> str:
    """The text of one captured payload; a missing file is an error, never a skip."""
    path = REAL_METRICS / name
    if not path.is_file():
        raise FileNotFoundError(
            f"captured payload {path} is missing (see tests/testdata/real-metrics/README.md)"
        )
    return path.read_text(encoding="utf-8")
