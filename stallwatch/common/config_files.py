"""Config files on disk: strict YAML into the exporter's and the restarter's config.

The only module of the dialect that imports a YAML parser. It refuses what a plain
`yaml.safe_load` lets through silently: a key given twice (the last one would win), keys
that are not strings (null, numbers, lists), text that is not valid Unicode (a lone surrogate)
and aliases that expand to far more than the file holds. Every loader error (a control
character, bad syntax, a value that cannot be built) is one ConfigError line with the file and,
where the parser knows it, the position.
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


# Through aliases a document can stand for far more values than it holds (500 bytes of nested
# aliases stand for billions). A document may stand for at most this many values more than it
# holds: room for merge keys (`<<: *defaults`) in thousands of targets, none for a bomb.
MAX_ALIAS_EXPANSION = 100_000

EMPTY_ON_RELOAD = (
    "the file is empty (no document, or only comments): refused on reload, the running config "
    "is kept (a file read in the middle of its write?); to watch no targets, say so: targets: []"
)


def _escaped(text: str) -> str:
    """`text` safe to print whatever it holds (a lone surrogate cannot be encoded as UTF-8)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _check_text(text: str, source: str, field: str, line: int, what: str) -> None:
    """Refuse a string that is not valid Unicode (a lone surrogate), naming the field."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        code = ord(text[error.start])
        raise ConfigError(
            source,
            _escaped(field) or "(top level)",
            f"line {line}: {what} is not valid Unicode: a lone surrogate U+{code:04X} at "
            f"character {error.start + 1} (two \\u escapes of a pair, as JSON writes an emoji, "
            "are two halves in YAML: write the character itself, or one \\U00XXXXXX escape)",
        ) from None


def _check_keys(node: yaml.Node, source: str, path: str, seen: set[int]) -> None:
    """Refuse duplicate and non-string keys and text that is not valid Unicode anywhere under
    `node`, naming path and line."""
    if id(node) in seen:  # an alias of a node already checked
        return
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        _check_text(str(node.value), source, path, node.start_mark.line + 1, "the value")
    elif isinstance(node, yaml.SequenceNode):
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
                    f"line {line}: key {_escaped(str(shown or 'null'))[:80]} is not a string"
                    " (quote it if it is meant as one)",
                )
            key = str(key_node.value)
            field = f"{path}.{key}" if path else key
            _check_text(key, source, field, line, "the key")
            if key in first_line:
                raise ConfigError(
                    source, field, f"line {line}: duplicate key (first on line {first_line[key]})"
                )
            first_line[key] = line
            _check_keys(value_node, source, field, seen)


def _expansion(node: yaml.Node, sizes: dict[int, int]) -> int:
    """How many values `node` stands for once every alias under it is expanded (-1: in the
    making, an alias of a node inside itself)."""
    known = sizes.get(id(node))
    if known is not None:
        if known < 0:
            raise ValueError("an alias refers to a node that holds it")
        return known
    sizes[id(node)] = -1
    size = 1
    if isinstance(node, yaml.SequenceNode):
        size += sum(_expansion(item, sizes) for item in node.value)
    elif isinstance(node, yaml.MappingNode):
        size += sum(_expansion(k, sizes) + _expansion(v, sizes) for k, v in node.value)
    sizes[id(node)] = size
    return size


def _check_aliases(node: yaml.Node, source: str) -> None:
    """Refuse a document whose aliases make it stand for far more values than it holds."""
    sizes: dict[int, int] = {}
    try:
        expanded = _expansion(node, sizes)
    except ValueError as error:
        raise ConfigError(source, "", f"not usable YAML: {error}") from None
    if expanded - len(sizes) > MAX_ALIAS_EXPANSION:
        raise ConfigError(
            source,
            "",
            f"its aliases (*name) make its {len(sizes)} values stand for more than "
            f"{MAX_ALIAS_EXPANSION} more: refused (an alias bomb?); write the values out",
        )


def _position(text: str, index: int) -> str:
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return f"line {line}, column {column}"


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def load_yaml_mapping(path: Path, *, empty_allowed: bool = True) -> dict[str, Any]:
    """The top-level mapping of a YAML file; every problem is a ConfigError naming the file,
    on one line with the position where the file says it (never a traceback)."""
    source = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise ConfigError(source, "", f"cannot read: {reason}") from None
    try:
        loader = yaml.SafeLoader(text)  # checks every character first
    except yaml.reader.ReaderError as error:
        character = f"U+{error.character:04X}" if isinstance(error.character, int) else "?"
        raise ConfigError(
            source,
            "",
            f"not valid YAML: {_position(text, error.position)}: character {character} is not "
            "allowed in a YAML file (a control character; in a double-quoted string write it "
            "as an escape)",
        ) from None
    loader.name = source
    try:
        node = loader.get_single_node()
        if node is not None:
            _check_keys(node, source, "", set())
            _check_aliases(node, source)
        data = loader.construct_document(node) if node is not None else None
    except ConfigError:
        raise
    except yaml.MarkedYAMLError as error:
        mark = error.problem_mark
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = _one_line(error.problem or error.context or "unreadable")
        raise ConfigError(source, "", f"not valid YAML: {where}{problem}") from None
    except yaml.YAMLError as error:
        raise ConfigError(source, "", f"not valid YAML: {_one_line(error)}") from None
    except RecursionError:
        raise ConfigError(source, "", "not usable YAML: nested too deeply") from None
    except (ValueError, TypeError, OverflowError) as error:
        raise ConfigError(
            source, "", f"not usable YAML: a value cannot be read: {_one_line(error)}"
        ) from None
    finally:
        loader.dispose()
    if data is None:
        if not empty_allowed:
            raise ConfigError(source, "", EMPTY_ON_RELOAD)
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            source, "", f"expected a mapping at the top level, got {type(data).__name__}"
        )
    return data


def empty_on_reload(path: Path) -> str | None:
    """What `--config.check` warns of a file a start takes and a reload refuses (None: none)."""
    try:
        load_yaml_mapping(path, empty_allowed=False)
    except ConfigError as error:
        if EMPTY_ON_RELOAD in str(error):
            return f"{path}: {EMPTY_ON_RELOAD}"
    return None


def load_exporter_config(path: Path, *, reloading: bool = False) -> ExporterConfig:
    """Read and check an exporter config file; raises ConfigError naming the file and field.
    On a reload an empty file is refused (EMPTY_ON_RELOAD)."""
    return exporter_config_from_mapping(
        load_yaml_mapping(path, empty_allowed=not reloading), str(path)
    )


def load_restarter_config(path: str | Path, *, reloading: bool = False) -> RestarterConfig:
    """Read and check a restarter config file, its token, its TLS pair and its journal's place.
    On a reload an empty file is refused (EMPTY_ON_RELOAD)."""
    file = Path(path)
    config = restarter_config_from_mapping(
        load_yaml_mapping(file, empty_allowed=not reloading), str(path), file.resolve().parent
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
