"""The local stack's errors: a process that does not start or answer, a missing binary or file."""

from __future__ import annotations


class LocalStackError(RuntimeError):
    """A process of the stack failed to start or answer, or a config file is not as expected."""


class MissingBinaryError(LocalStackError):
    """A Prometheus or Alertmanager binary is not installed."""


class ProjectFilesNotFoundError(LocalStackError):
    """The project's prometheus/ and alertmanager/ files are not where a checkout has them."""
