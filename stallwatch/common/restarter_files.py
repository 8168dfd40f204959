"""The files a restarter config names (token, TLS pair, journal, programs, kubeconfig).

Relative paths are taken relative to the directory of the configuration file, so a config and
its secrets can move together; each is checked on disk as the config loads.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from stallwatch.common.config import Section, quoted


class RestarterFiles:
    """Paths of the config file, resolved next to it and checked on disk."""

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir

    def path(self, section: Section, key: str) -> str:
        return str(self.base_dir / Path(section.string(key, required=True)).expanduser())

    def existing_file(self, section: Section, key: str) -> str | None:
        if not section.has(key):
            return None
        resolved = self.path(section, key)
        if not Path(resolved).is_file():
            raise section.error(key, f"file not found: {section.raw(key)}")
        return resolved

    def secret(self, section: Section, key: str) -> str | None:
        """A file only its owner's group may read and only its owner may write."""
        resolved = self.existing_file(section, key)
        if resolved is None:
            return None
        mode = stat.S_IMODE(Path(resolved).stat().st_mode)
        if mode & (stat.S_IROTH | stat.S_IWOTH | stat.S_IWGRP):
            raise section.error(
                key,
                f"{section.raw(key)} has mode {mode:04o}: a secret must not be readable by "
                "every user nor writable by its group (chmod 600, or 640 to share it with a group)",
            )
        return resolved

    def token(self, section: Section, key: str) -> str | None:
        resolved = self.secret(section, key)
        if resolved is None:
            return None
        name = section.raw(key)
        try:
            token = Path(resolved).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as error:
            raise section.error(key, f"cannot read {name}: {error}") from None
        if not token:
            raise section.error(key, f"{name} is empty")
        if any(ch.isspace() for ch in token) or not token.isascii():
            raise section.error(key, f"{name} must hold one token of printable ASCII characters")
        return token

    def program(self, section: Section, name: str) -> str:
        """argv[0] as it will be run: a path (relative ones next to the config) that is an
        executable file, or a name found on the PATH now, as it would be at restart time."""
        if "/" not in name:
            if shutil.which(name) is None:
                raise section.error("argv", f"program {quoted(name)} not found on the PATH")
            return name
        resolved = self.base_dir / Path(name).expanduser()
        if not resolved.is_file():
            raise section.error("argv", f"program not found: {name}")
        if not os.access(resolved, os.X_OK):
            raise section.error("argv", f"{name} is not executable (chmod +x)")
        return str(resolved)

    def journal(self, section: Section, key: str) -> str:
        resolved = Path(self.path(section, key))
        if resolved.is_dir():
            raise section.error(key, f"{resolved} is a directory, not a journal file")
        for parent in resolved.parents:
            if parent.exists():
                if not parent.is_dir():
                    raise section.error(key, f"{parent} is a file, not a directory")
                break
        return str(resolved)
