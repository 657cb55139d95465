"""llm-d's approximate prefix producer (`approx-prefix-cache-producer`), shared by the llm-d router (`policies/llm_d.py`,
`prefix_cache: approximate` and the prefix-cache-affinity-filter) and llm-d's P/D router's prefix-based decider
(`policies/llm_d_pd.py`): what llm-d believes each pod holds, from the requests it routed there.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from sim.routing.interface import ClusterView
from sim.routing.routing_history import RoutingHistory
from sim.workloads.request import Request

class ApproxPrefixIndex:
    """llm-d's approximate prefix producer: per-pod LRUs of the routed requests' G-token block hashes.

    `keys(request)`: the chained hash at the end of each full G-token block (every (G/B)-th request block hash),
    then one key of the request's own for a partial last block, at most `max_blocks` in all. `match_blocks` walks
    them and stops at the first key no pod holds; every holder of each key before that counts it.
    """

    mode = "approximate"

    def __init__(self, view: ClusterView, tokens_per_key: int, max_blocks: int | None, capacity_keys: int) -> None:
        B = view.block_size
        if tokens_per_key % B:
            raise ValueError(f"approximate block size {tokens_per_key} tokens must be a multiple of the requests' "
                             f"block size {B} (block_size_tokens / min_block_size_tokens)")
        self._view = view
        self.tokens_per_key = tokens_per_key
        self._step = tokens_per_key // B
        self._max_blocks = max_blocks
        self.history = RoutingHistory(view.num_workers, capacity_keys=capacity_keys, per_worker=True,
                                      leaves_first=False)
        self._last: tuple[int, list[int], int] | None = None

    @classmethod
    def for_options(cls, view: ClusterView, o: Any) -> ApproxPrefixIndex:
        """The producer over `view` as the llm-d options `o` configure it (`LlmdOptions`, not imported: llm_d imports
        this module): G = the engine's block size when `auto_tune` and the engine reports one, else
        `block_size_tokens`, at least `min_block_size_tokens`; at most `max_prefix_tokens_to_match // G` keys (else
        `max_prefix_blocks_to_match`; both 0: the whole prompt); per pod an LRU of the engine's reported block count
        when `auto_tune`, else `lru_capacity_per_server` keys."""
        engine_block = view.cache_block_size() if o.auto_tune else 0
        G = max(engine_block if engine_block > 0 else o.block_size_tokens, o.min_block_size_tokens)
        if o.max_prefix_tokens_to_match > 0:
            max_blocks = o.max_prefix_tokens_to_match // G
        else:
            max_blocks = o.max_prefix_blocks_to_match or None  # both caps 0: the whole prompt
        reported = view.cache_num_blocks(0) if o.auto_tune else 0
        capacity = reported if reported > 0 else o.lru_capacity_per_server
        return cls(view, G, max_blocks, capacity)

    def keys(self, request: Request) -> list[Hashable]:
        m = self._step
        keys: list[Hashable] = list(request.block_hashes[m - 1::m])
        if request.prompt_tokens % self.tokens_per_key:
            keys.append(("llm-d-partial-block", request.request_id))
        return keys[: self._max_blocks]

    def match_blocks(self, request: Request) -> tuple[list[int], int]:
        """Per worker the matched blocks, and the request's total blocks (cached per request)."""
        last = self._last
        if last is not None and last[0] == request.request_id:
            return last[1], last[2]
        keys = self.keys(request)
        counts = self.history.index.leading_counts(keys)
        self._last = (request.request_id, counts, len(keys))
        return counts, len(keys)

    def match_tokens(self, request: Request) -> list[int]:
        counts, _ = self.match_blocks(request)
        t, n = self.tokens_per_key, request.prompt_tokens
        return [min(c * t, n) for c in counts]

    def record(self, request: Request, worker: int) -> None:
        self.history.record(self.keys(request), worker, self._view.now_s)
        self._last = None

    def remove_worker(self, worker: int) -> None:
        """The pod's LRU goes with it (kvsim: its slot's entries; a new pod starts with none)."""
        self.history.remove_worker(worker)
        self._last = None
