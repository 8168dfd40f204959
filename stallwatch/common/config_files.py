"""Config files on disk: strict YAML into the exporter's and the restarter's config.

The only module of the dialect that imports a YAML parser. It refuses what a plain
`yaml.safe_load` lets through silently: a key given twice (the last one would win) and keys
that are not strings (null, numbers, lists).
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import yaml

from stallwatch.common.config import ConfigError
from stallwatch.common.exporter_config import ExporterConfig, exporter_config_from_mapping
from stallwatch.common.restarter_config import RestarterConfig, restarter_config_from_mapping

_STRING_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"


def _check_keys(node: yaml.Node, source: str, path: str, seen: set[int]) -> None:
    """Refuse duplicate and non-string keys anywhere under `node`, naming path and line."""
    if id(node) in seen:  # an alias of a node already checked
        return
    seen.add(id(node))
    if isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _check_keys(item, source, f"{path}[{index}]", seen)
    elif isinstance(node, yaml.MappingNode):
        first_line: dict[str, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            if key_node.tag == _MERGE_TAG:
                _check_keys(value_node, source, path, seen)
                continue
            if not isinstance(key_node, yaml.ScalarNode) or key_node.tag != _STRING_TAG:
                shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else "a collection"
                raise ConfigError(
                    source,
                    path or "(top level)",
                    f"line {line}: key {shown or 'null'!s} is not a string"
                    " (quote it if it is meant as one)",
                )
            key = str(key_node.value)
            field = f"{path}.{key}" if path else key
            if key in first_line:
                raise ConfigError(
                    source, field, f"line {line}: duplicate key (first on line {first_line[key]})"
                )
            first_line[key] = line
            _check_keys(value_node, source, field, seen)


def load_yaml_mapping(path: Path) -> dict[str, Any]:
    """The top-level mapping of a YAML file; every problem is a ConfigError naming the file."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ConfigError(source, "", f"cannot read: {reason}") from None
    loader = yaml.SafeLoader(text)
    loader.name = source
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_keys(node, source, "", set())
        data = loader.construct_document(node) if node is not None else {}
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        raise ConfigError(source, "", f"not valid YAML: {where}{error.problem}") from None
    except yaml.YAMLError as error:
        raise ConfigError(source, "", f"not valid YAML: {error}") from None
    finally:
        loader.dispose()
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            source, "", f"expected a mapping at the top level, got {type(data).__name__}"
        )
    return data


def load_exporter_config(path: Path) -> ExporterConfig:
    """Read and check an exporter config file; raises ConfigError naming the file and field."""
    return exporter_config_from_mapping(load_yaml_mapping(path), str(path))


def load_restarter_config(path: str | Path) -> RestarterConfig:
    """Read and check a restarter config file, its token, its TLS pair and its journal's place."""
    file = Path(path)
    config = restarter_config_from_mapping(
        load_yaml_mapping(file), str(path), file.resolve().parent
    )
    if config.tls_cert_file is not None and config.tls_key_file is not None:
        _check_tls_pair(config.source, config.tls_cert_file, config.tls_key_file)
    return config


def _check_tls_pair(source: str, cert: str, key: str) -> None:
    """Load the certificate and key now, so a bad pair is a config error and not a traceback."""
    for field, path, marker, what in (
        ("tls_cert_file", cert, "-----BEGIN CERTIFICATE-----", "PEM certificate"),
        ("tls_key_file", key, "PRIVATE KEY-----", "PEM private key"),
    ):
        try:
            text = Path(path).read_text(encoding="ascii", errors="replace")
        except OSError as error:
            raise ConfigError(source, field, f"cannot read {path}: {error.strerror}") from None
        if marker not in text:
            raise ConfigError(source, field, f"{path} holds no {what}")
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as error:
        reason = error.reason or "unreadable"
        raise ConfigError(
            source, "tls_key_file", f"{key} and {cert} are not a usable pair ({reason})"
        ) from None
