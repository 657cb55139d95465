"""The blocks of a worker's in-flight requests, as a router tracks them (Dynamo's active-sequence tracking)."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from itertools import repeat
from operator import add, sub

from sim.routing.prefix_index import held_prefix
from sim.workloads.request import BlockHash


class ActiveBlocks:
    """Block hash -> how many of one worker's in-flight requests hold it.

    Invariant: prefix-closed (a union of whole prompts' chained hashes: whoever holds a block holds its parent), so
    the hashes of a request already active are a leading run of its `block_hashes`, found by binary search, and
    the ones a completion drops to zero are a suffix.
    """

    __slots__ = ("_counts",)

    def __init__(self) -> None:
        self._counts: dict[BlockHash, int] = {}

    def __len__(self) -> int:
        """Distinct blocks held by the in-flight requests."""
        return len(self._counts)

    def held(self, hashes: Sequence[BlockHash]) -> int:
        """Leading blocks of `hashes` some in-flight request already holds."""
        return held_prefix(self._counts, hashes)

    def add(self, hashes: Sequence[BlockHash]) -> None:
        """One more in-flight request holds `hashes` (a request's chained hashes are distinct)."""
        counts = self._counts
        # NOTE: ref counts +1 for every hash in C-level calls.
        counts.update(zip(hashes, map(add, map(counts.get, hashes, repeat(0)), repeat(1))))

    def remove(self, hashes: Sequence[BlockHash]) -> None:
        """The in-flight request holding `hashes` completed."""
        counts = self._counts
        left = list(map(sub, map(counts.__getitem__, hashes), repeat(1)))
        # NOTE: counts never rise along a chain, so the hashes that drop to zero are a suffix: keep the rest, pop
        # that suffix, both in C-level loops.
        k = bytes(map(bool, left)).find(0)
        if k < 0:
            k = len(hashes)
        counts.update(zip(hashes[:k], left[:k]))
        deque(map(counts.pop, hashes[k:]), maxlen=0)
