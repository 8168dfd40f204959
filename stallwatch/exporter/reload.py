"""Whether the exporter's last configuration load or reload succeeded, and when one last did."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class ReloadStatus:
    successful: bool = True
    last_success_at: float = field(default_factory=time.time)
