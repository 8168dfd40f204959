"""stallwatch: keep LLM model servers up without using what the health check guards."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("stallwatch")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"

USER_AGENT = f"stallwatch/{__version__}"
