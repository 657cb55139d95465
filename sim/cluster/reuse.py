"""Reuse available and reuse captured by routing: what infinite caches would hit on the same stream."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import repeat
from operator import or_

from sim.routing.prefix_index import held_prefix


class _WorkerView:
    """Membership of one worker's bit in a `key -> worker bitmask` dict (what `held_prefix` asks with `in`)."""

    __slots__ = ("_get", "_bit")

    def __init__(self, masks: dict[Hashable, int], worker: int) -> None:
        self._get = masks.get
        self._bit = 1 << worker

    def __contains__(self, key: Hashable) -> bool:
        return bool(self._get(key, 0) & self._bit)


class ReuseLedger:
    """For each dispatched request, the prompt tokens that would be hits

    * `available`: in one infinite cache shared by the whole cluster (every earlier request's blocks), and
    * `captured`: in an infinite cache on the worker the router chose (the earlier requests sent there),

    in whole blocks of the stream and capped, as the engines cap a hit, at `prompt_tokens - 1`. Beside the hit the
    finite caches deliver, they tell routing apart from memory: available - captured is lost by routing, captured
    - delivered by memory (and by requests in flight together, whose blocks are not cached yet). Warm-ups count as
    history. A block counts from its request's dispatch, so in-flight duplicates count as reuse (an upper bound).

    One dict `block hash -> bitmask of the workers sent it` holds both: the shared cache is its keys.
    """

    def __init__(self, num_workers: int, block_size: int) -> None:
        self.block_size = block_size
        self._masks: dict[Hashable, int] = {}
        self._views = [_WorkerView(self._masks, w) for w in range(num_workers)]

    def dispatch(self, hashes: Sequence[Hashable], prompt_tokens: int, worker: int) -> tuple[int, int]:
        """(available, captured) tokens of a request with these block hashes, sent to `worker`; then records it.
        `hashes` may run past the prompt (`sim.workloads.request.computed_block_hashes`: a session's outputs, which
        later prompts resend); the hit is over the prompt's blocks only."""
        cap = (prompt_tokens - 1) // self.block_size
        masks, bit = self._masks, 1 << worker
        in_shared = held_prefix(masks, hashes)
        in_mine = held_prefix(self._views[worker], hashes[:in_shared])
        # NOTE: C-level updates: this worker's bit onto the blocks others hold, then the blocks nobody held yet.
        seen = hashes[in_mine:in_shared]
        masks.update(zip(seen, map(or_, map(masks.__getitem__, seen), repeat(bit))))
        masks.update(zip(hashes[in_shared:], repeat(bit)))
        return min(in_shared, cap) * self.block_size, min(in_mine, cap) * self.block_size

