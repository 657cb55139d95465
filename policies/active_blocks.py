"""The blocks of a worker's in-flight requests, as a router tracks them (Dynamo's active-sequence tracking)."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

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
        # NOTE: the leading run already held gains one in a loop (Python 3.11's loop beats map over bound methods);
        # the rest are new, entered at 1 in one C pass.
        held = held_prefix(counts, hashes)
        for h in hashes[:held]:
            counts[h] += 1
        if held < len(hashes):
            counts.update(zip(hashes[held:], repeat(1)))

    def remove(self, hashes: Sequence[BlockHash]) -> None:
        """The in-flight request holding `hashes` completed."""
        counts = self._counts
        # NOTE: counts never rise along a chain, so the hashes this request alone holds (count 1, dropped) are a
        # suffix: its start is found by binary search; the rest lose one.
        lo, hi = 0, len(hashes)
        while lo < hi:
            mid = (lo + hi) // 2
            if counts[hashes[mid]] > 1:
                lo = mid + 1
            else:
                hi = mid
        for h in hashes[:lo]:
            counts[h] -= 1
        for h in hashes[lo:]:
            del counts[h]
