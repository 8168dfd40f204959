"""Python's cyclic garbage collector, set for a service whose garbage is not cyclic.

A read allocates a few hundred container objects (the reading, its samples, the next history,
the answer's parts) and reference counting frees nearly all of them as soon as the next read
replaces them. The collector's defaults still walk the youngest objects every 700 allocations,
promote what is alive at that moment, and walk every object the process holds each time the
old ones have grown by a quarter: at thousands of targets, whose state is replaced at every
read, that full walk came several times a minute and held the event loop for over 100 ms
(docs/exporter.md, "Garbage collection"). Collecting the youngest objects every
YOUNG_COLLECTION_THRESHOLD allocations instead lets most of them die young, as they do, and
leaves the old generations rarely touched; what the process loaded to start (modules, tables,
the config) is set aside for good, so a full collection does not walk it again.
"""

from __future__ import annotations

import gc

YOUNG_COLLECTION_THRESHOLD = 10_000


def set_for_service() -> None:
    """Freeze what is loaded now and collect the youngest generation less often."""
    gc.collect()
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_COLLECTION_THRESHOLD, middle, oldest)
