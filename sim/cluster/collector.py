"""The garbage collector's pace while a simulation runs.

A replay keeps hundreds of thousands of container objects alive (requests in flight, cache trees, the reuse
ledger's trie, SimPy's events) and allocates and drops millions more, almost none of them in reference cycles. At
Python's default pace (a young-generation collection every 700 net allocations) the collector traverses the
survivors again and again: 10-14 % of a Mooncake-trace replay here (`benchmarks/speed/replay_speed.py`), for no
memory returned (peak RSS the same with the collector off). `fewer_collections` collects young objects every
50,000 allocations instead, for the simulation only: the same objects, the same results (nothing in kvsim depends on
when a cycle is collected), and at most that many objects of cyclic garbage waiting at any time.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

SIMULATION_THRESHOLDS = (50_000, 20, 100)
"""`gc.set_threshold` during a simulation: young collections every 50,000 net allocations, a middle one every 20
young ones, an old one every 100 middle ones (and, as always, only once the old generation has grown by a quarter)."""


@contextmanager
def fewer_collections() -> Iterator[None]:
    """Raise the collector's thresholds to at least `SIMULATION_THRESHOLDS` for the block, then restore them."""
    before = gc.get_threshold()
    gc.set_threshold(*(max(now, during) for now, during in zip(before, SIMULATION_THRESHOLDS)))
    try:
        yield
    finally:
        gc.set_threshold(*before)
