"""Reuse available and reuse captured by routing: what infinite caches would hit on the same stream."""

from __future__ import annotations

from collections.abc import Hashable, Sequence


def held_prefix(held, hashes: Sequence[Hashable]) -> int:
    """Leading `hashes` in `held` (anything with `in`), for a prefix-closed `held`: one where a chained hash is
    present only if every hash before it on its chain is (a union of whole prompts' hashes is). Membership is then
    monotone along `hashes`, and a binary search finds the edge in O(log n) lookups."""
    lo, hi = 0, len(hashes)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if hashes[mid - 1] in held:
            lo = mid
        else:
            hi = mid - 1
    return lo


class ReuseLedger:
    """For each dispatched request, the prompt tokens that would be hits

    * `available`: in one infinite cache shared by the whole cluster (every earlier request's blocks), and
    * `captured`: in an infinite cache on the worker the router chose (the earlier requests sent there),

    in whole blocks of the stream and capped, as the engines cap a hit, at `prompt_tokens - 1`. Beside the hit the
    finite caches deliver, they tell routing apart from memory: available - captured is lost by routing, captured
    - delivered by memory (and by requests in flight together, whose blocks are not cached yet). Warm-ups count as
    history. A block counts from its request's dispatch, so in-flight duplicates count as reuse (an upper bound).
    """

    def __init__(self, num_workers: int, block_size: int) -> None:
        self.block_size = block_size
        self._per_worker: list[set[Hashable]] = [set() for _ in range(num_workers)]

    def dispatch(self, hashes: Sequence[Hashable], prompt_tokens: int, worker: int) -> tuple[int, int]:
        """(available, captured) tokens of a request with these block hashes, sent to `worker`; then records it."""
        cap = (prompt_tokens - 1) // self.block_size
        # NOTE: the shared cache is the union of the per-worker ones, and a union of prefix-closed sets has, as its
        # leading run, the longest of theirs: no set of its own is needed.
        runs = [held_prefix(held, hashes) for held in self._per_worker]
        in_mine = runs[worker]
        self._per_worker[worker].update(hashes[in_mine:])  # the first in_mine are there already
        return min(max(runs), cap) * self.block_size, min(in_mine, cap) * self.block_size
