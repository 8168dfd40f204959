"""The demo's own errors: a story that did not happen, or a SIGTERM that stopped it."""

from __future__ import annotations


class DemoError(RuntimeError):
    """The demo could not run (a component did not start) or its story did not happen."""


class DemoInterrupted(Exception):
    """SIGTERM stopped the demo (everything it started is stopped too)."""
