"""The garbage collector's pace while a simulation runs.

A replay keeps hundreds of thousands of container objects alive (requests in flight, cache trees, the reuse
ledger's trie, SimPy's events) and allocates and drops millions more, almost none of them in reference cycles. At
Python's default pace (a young-generation collection every 700 net allocations) the collector traverses the
survivors again and again: 10-14 % of a Mooncake-trace replay here (`benchmarks/speed/replay_speed.py`), for no
memory returned (peak RSS the same with the collector off). `fewer_collections` collects young objects every
50,000 allocations instead, for the simulation only: the same objects, the same results (nothing in kvsim depends on
when a cycle is collected), and at most that many objects of cyclic garbage waiting at any time.

A `kvsim` command is one short process, and there the default pace outside the simulation cost as much again
(`command_collections`; CPU seconds of the collector in a Mooncake conversation replay, SGLang, round robin): once
the simulation restored it, the next allocations ran a full collection over everything the run left alive (the
reuse ledger's trie, the trees, the records: 0.35 s), on top of 0.37 s of young and middle collections during
imports, reading and simulating. A command keeps a slower pace throughout, moves its survivors to the old generation
untraversed when it ends, and its process freezes what is alive at exit (else the interpreter's exit would run the
full collection instead: 0.5 s): 0.17 s in all.
"""

from __future__ import annotations

import atexit
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


COMMAND_THRESHOLDS = (200_000, 50, 100)
"""`gc.set_threshold` during a command: as `SIMULATION_THRESHOLDS`, but a middle collection (which traverses every
object that survived a young one since the last, up to millions in a replay: ~0.2 s each) only every 10 million net
allocations; a command's process ends soon after its simulation."""


@contextmanager
def command_collections() -> Iterator[None]:
    """The collector's pace for a whole command (imports, reading, simulating, writing: `COMMAND_THRESHOLDS`, raised
    and restored as `fewer_collections` does), and `gc.freeze()` at the process's exit: the interpreter's last
    collection then skips every object alive, which the exit frees by reference counts anyway (only a cycle among
    them is left to the operating system, as at any exit). A test process that runs commands freezes at its end."""
    global _freeze_at_exit
    if not _freeze_at_exit:
        atexit.register(gc.freeze)
        _freeze_at_exit = True
    before = gc.get_threshold()
    gc.set_threshold(*(max(now, during) for now, during in zip(before, COMMAND_THRESHOLDS)))
    try:
        yield
    finally:
        # NOTE: up to 200,000 young objects are pending at the end; at the restored pace the next allocation would
        # traverse them all (~0.1 s after a replay). Freezing then unfreezing moves every object to the old
        # generation without traversing any (two list splices), where the next full collection finds them.
        gc.freeze()
        gc.unfreeze()
        gc.set_threshold(*before)


_freeze_at_exit = False
"""Whether `command_collections` registered the exit's `gc.freeze` (once per process)."""
