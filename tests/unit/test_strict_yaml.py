"""Every config file the exporter and the restarter read goes through the one strict YAML reader."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "stallwatch"
# The parts that read an operator's config files; the face (demo, local stack) reads only the
# repository's own Prometheus and Alertmanager files.
CONFIG_READERS = ("common", "core", "exporter", "restarter")
STRICT_READER = PACKAGE / "common" / "config_files.py"


def _imports_yaml(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "yaml" for a in node.names):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "yaml":
            return True
    return False


def test_only_the_strict_reader_imports_yaml() -> None:
    """No exporter, restarter, core or leaf module but config_files.py imports a YAML parser
    (yaml.safe_load would let a duplicate key through, the last one silently winning)."""
    readers = {
        path
        for part in CONFIG_READERS
        for path in (PACKAGE / part).rglob("*.py")
        if _imports_yaml(path)
    }
    assert readers == {STRICT_READER}
