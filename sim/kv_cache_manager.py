"""vLLM v1's KV cache manager for one worker: prefix lookup, slot allocation, caching at schedule time, free.

Mirrors `vllm/v1/core/kv_cache_manager.py` with one full-attention group
(`single_type_kv_cache_manager.FullAttentionManager`), on top of `sim.block_pool.BlockPool`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import astuple, dataclass

from sim.block_pool import BlockHash, BlockPool
from sim.request import RequestState


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(slots=True)
class PrefixCacheStats:
    """vLLM's `PrefixCacheStats`: counters in requests and tokens, summed across steps and workers.

    `queries` counts every prompt token looked up (last token included), `hits` the tokens found cached.
    Lookups of re-admitted preempted requests go to the `preempted_*` counters, which vLLM does not export.
    """

    requests: int = 0
    queries: int = 0
    hits: int = 0
    preempted_requests: int = 0
    preempted_queries: int = 0
    preempted_hits: int = 0

    def record(self, num_tokens: int, num_hit_tokens: int, *, preempted: bool) -> None:
        if preempted:
            self.preempted_requests += 1
            self.preempted_queries += num_tokens
            self.preempted_hits += num_hit_tokens
        else:
            self.requests += 1
            self.queries += num_tokens
            self.hits += num_hit_tokens

    def copy(self) -> PrefixCacheStats:
        return PrefixCacheStats(*astuple(self))

    def _combine(self, other: PrefixCacheStats, sign: int) -> PrefixCacheStats:
        return PrefixCacheStats(*(a + sign * b for a, b in zip(astuple(self), astuple(other))))

    def plus(self, other: PrefixCacheStats) -> PrefixCacheStats:
        return self._combine(other, 1)

    def minus(self, other: PrefixCacheStats) -> PrefixCacheStats:
        return self._combine(other, -1)


class KVCacheManager:
    """Prefix cache of one worker, `num_blocks` blocks of `block_size` tokens (block 0 is the null block).

    Contract, as in vLLM:
    * `find_longest_cache_hit` is a pure lookup: the longest run of cached blocks from block 0, over at most
      `(num_tokens - 1) // block_size` blocks, stopping at the first miss. It locks and touches nothing.
    * `allocate_slots` either fails and changes nothing, or touches the hit blocks (pulling them out of the free
      queue), pops new blocks from the queue head (lazy eviction) and registers every block that the scheduled
      tokens fill (caching at schedule time: a request scheduled later in the same step already hits them).
    * `free` releases a request's blocks tail first, so a cached chain is evicted from its end.
    """

    def __init__(
        self,
        *,
        num_blocks: int,
        block_size: int,
        max_model_len: int,
        unhashed_to_head: bool = True,
        free_tail_first: bool = True,
    ) -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.free_tail_first = free_tail_first
        self.pool = BlockPool(num_blocks, unhashed_to_head=unhashed_to_head)
        self.stats = PrefixCacheStats()

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self) -> float:
        """vLLM's `kv_cache_usage_perc`: evictable cached blocks count as free."""
        return 1.0 - self.pool.num_free_blocks / self.pool.num_usable_blocks

    def cached_mask(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        """Whether each hash is cached; for routers. Changes no recency (peek is not touch)."""
        return self.pool.cached_mask(block_hashes)

    def find_longest_cache_hit(self, state: RequestState) -> list[int]:
        # NOTE: a full hit still recomputes the last token (its logits are needed), so hits are capped at
        # num_tokens - 1 and rounded down to whole blocks: a block-aligned resend recomputes its last block.
        max_hit_blocks = (state.num_tokens - 1) // self.block_size
        found = self.pool.lookup(state.block_hashes(0, max_hit_blocks))
        try:
            return found[: found.index(None)]  # the run stops at the first miss
        except ValueError:
            return found

    def _num_evictable(self, hit_blocks: Sequence[int]) -> int:
        """Hit blocks sitting in the free queue: touching them takes them out of it."""
        return list(map(self.pool.ref_counts.__getitem__, hit_blocks)).count(0)

    def num_blocks_to_admit(self, state: RequestState, hit_blocks: Sequence[int]) -> int:
        """Free blocks a waiting request needs for its whole prompt (vLLM >= 0.19 `full_sequence_must_fit`)."""
        return (cdiv(state.num_tokens, self.block_size) - len(state.block_ids) - len(hit_blocks)
                + self._num_evictable(hit_blocks))

    def allocate_slots(
        self,
        state: RequestState,
        num_new_tokens: int,
        hit_blocks: Sequence[int] = (),
        *,
        full_sequence_must_fit: bool = False,
    ) -> bool:
        """Give `state` slots for `num_new_tokens` more tokens after its computed and hit tokens; False if they do not fit."""
        pool = self.pool
        B = self.block_size
        if not hit_blocks and not full_sequence_must_fit:
            # NOTE: the common decode case, same outcome as the general path: the slots exist already.
            end = state.num_computed_tokens + num_new_tokens
            if end <= len(state.block_ids) * B and end <= self.max_model_len:
                self.cache_full_blocks(state, min(end, state.num_tokens))
                return True
        num_hit_tokens = len(hit_blocks) * B
        num_computed = state.num_computed_tokens + num_hit_tokens
        num_tokens_need_slot = min(num_computed + num_new_tokens, self.max_model_len)
        num_new_blocks = cdiv(num_tokens_need_slot, B) - len(state.block_ids) - len(hit_blocks)
        num_evictable_hits = self._num_evictable(hit_blocks) if hit_blocks else 0
        free = pool.num_free_blocks
        if full_sequence_must_fit and (cdiv(state.num_tokens, B) - len(state.block_ids) - len(hit_blocks)
                                       + num_evictable_hits) > free:
            return False
        if max(num_new_blocks, 0) + num_evictable_hits > free:
            return False
        if hit_blocks:
            pool.touch(hit_blocks)
            state.block_ids.extend(hit_blocks)
            # NOTE: hit blocks already carry their hashes; caching resumes after them.
            state.num_cached_blocks = max(state.num_cached_blocks, len(state.block_ids))
        num_full_blocks = min(num_computed + num_new_tokens, state.num_tokens) // B
        if num_new_blocks > 0:
            first_new = len(state.block_ids)
            if state.num_cached_blocks >= first_new and num_full_blocks > first_new:
                # NOTE: the new blocks that the scheduled tokens fill are hashed in the allocation pass itself.
                n = min(num_new_blocks, num_full_blocks - first_new)
                state.block_ids.extend(pool.get_new_blocks(num_new_blocks, state.block_hashes(first_new, first_new + n)))
                state.num_cached_blocks = first_new + n
            else:
                state.block_ids.extend(pool.get_new_blocks(num_new_blocks))
        self.cache_full_blocks(state, min(num_computed + num_new_tokens, state.num_tokens))
        return True

    def cache_full_blocks(self, state: RequestState, num_tokens: int) -> None:
        """Register the hashes of every block fully covered by the first `num_tokens` tokens of `state`."""
        num_full_blocks = num_tokens // self.block_size
        start = state.num_cached_blocks
        if num_full_blocks <= start:
            return
        self.pool.cache_blocks(state.block_ids[start:num_full_blocks], state.block_hashes(start, num_full_blocks))
        state.num_cached_blocks = num_full_blocks

    def free(self, state: RequestState) -> None:
        """Release every block of `state`, tail block first (vLLM's reverse-order free).

        `free_tail_first=False` frees head first instead: the naive LRU that no vLLM release implements, kept as
        an ablation because it shows how much the free order matters (a prefix is then evicted from its root).
        """
        self.pool.free(reversed(state.block_ids) if self.free_tail_first else state.block_ids)
        state.block_ids = []
        state.num_cached_blocks = 0
