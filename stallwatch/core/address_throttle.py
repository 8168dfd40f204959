"""When to log what a client did wrong again: at most one line per client address per interval.

The restarter's failed authentications and both components' malformed requests are logged
through it (pure; `now` is passed in)."""

from __future__ import annotations

from dataclasses import dataclass, field

# A client that errs again and again is logged once a minute, with how many were not logged.
DEFAULT_INTERVAL_SECONDS = 60.0
# Addresses remembered at most; past this, those not logged within the interval are forgotten
# (a flood from many addresses cannot grow the table without bound).
MAX_CLIENTS = 4096


@dataclass
class _Client:
    logged_at: float
    suppressed: int = 0


@dataclass
class AddressThrottle:
    """Decide, per client address, whether its latest failure is logged now."""

    interval: float = DEFAULT_INTERVAL_SECONDS
    max_clients: int = MAX_CLIENTS
    _clients: dict[str, _Client] = field(default_factory=dict)

    def failure(self, client: str, now: float) -> int | None:
        """Note a failure by `client`: the number of its failures not logged since its last
        line when this one is to be logged, None when it is to be suppressed."""
        known = self._clients.get(client)
        if known is not None and now - known.logged_at < self.interval:
            known.suppressed += 1
            return None
        suppressed = 0 if known is None else known.suppressed
        if known is None and len(self._clients) >= self.max_clients:
            self._forget_quiet_clients(now)
        self._clients[client] = _Client(logged_at=now)
        return suppressed

    def _forget_quiet_clients(self, now: float) -> None:
        quiet = [name for name, c in self._clients.items() if now - c.logged_at >= self.interval]
        for name in quiet:
            del self._clients[name]
        if len(self._clients) >= self.max_clients:  # all recent: drop the oldest
            oldest = min(self._clients, key=lambda name: self._clients[name].logged_at)
            del self._clients[oldest]
