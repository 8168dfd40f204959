"""Where the captured real `/metrics` payloads live: `shared/` beside the repository."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
REAL_METRICS = REPO_ROOT.parent / "shared" / "fixtures" / "real-metrics"


def real_payload(name: str) -> str:
    """The text of one captured payload; a missing file is an error, never a skip."""
    path = REAL_METRICS / name
    if not path.is_file():
        raise FileNotFoundError(
            f"captured payload {path} is missing: the real fixtures live in shared/ beside the repo"
        )
    return path.read_text(encoding="utf-8")
