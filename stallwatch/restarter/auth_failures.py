"""When to log a failed authentication: at most one line per client address per interval."""

from __future__ import annotations

from stallwatch.core.address_throttle import AddressThrottle


class AuthFailureLog(AddressThrottle):
    """Decide, per client address, whether a failed authentication is logged now."""
