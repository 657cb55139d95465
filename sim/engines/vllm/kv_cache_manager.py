"""vLLM v1's KV cache manager for one worker: prefix lookup, slot allocation, caching at schedule time, free.

Mirrors `vllm/v1/core/kv_cache_manager.py` with one full-attention group
(`single_type_kv_cache_manager.FullAttentionManager`), on top of `sim.engines.vllm.block_pool.BlockPool`.
"""

from __future__ import annotations

from collections.abc import Sequence

from sim.engines.event_feed import EventFeed
from sim.engines.interface import CacheListener, PrefixCacheStats
from sim.engines.vllm.block_pool import BlockPool
from sim.engines.vllm.math_utils import cdiv
from sim.engines.vllm.request_state import RequestState
from sim.workloads.request import BlockHash, Request


class KVCacheManager:
    """Prefix cache of one worker, `num_blocks` blocks of `block_size` tokens (block 0 is the null block).

    Contract, as in vLLM:
    * `find_longest_cache_hit` is a pure lookup: the longest run of cached blocks from block 0, over at most
      `(num_tokens - 1) // block_size` blocks, stopping at the first miss. It locks and touches nothing.
    * `allocate_slots` either fails and changes nothing, or touches the hit blocks (pulling them out of the free
      queue), pops new blocks from the queue head (lazy eviction) and registers every block that the scheduled
      tokens fill (caching at schedule time: a request scheduled later in the same step already hits them).
    * `free` releases a request's blocks tail first, so a cached chain is evicted from its end.

    It is also the worker's `PrefixCache` (`sim.engines.interface`): routers peek with `peek_prefix_tokens`, and
    subscribers get vLLM's KV events: per caching pass one `stored` event with the newly hashed blocks (parent: the
    block before them), per evicted block one `removed` event, in the order vLLM emits them (evictions happen while
    allocating, before the pass caches), published once per step (`publish`).
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
        self.pool = BlockPool(num_blocks, unhashed_to_head=unhashed_to_head, block_size=block_size)
        self.stats = PrefixCacheStats()
        self._feed = EventFeed(self.pool)

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free_blocks

    def usage(self, num_blocks_taken: int = 0) -> float:
        """vLLM's `kv_cache_usage_perc`: evictable cached blocks count as free; with `num_blocks_taken`, as it will
        be once that many more blocks are allocated (`BlockPool.usage`)."""
        return self.pool.usage(num_blocks_taken)

    @property
    def num_evicted_blocks(self) -> int:
        """Cached blocks evicted to make room so far."""
        return self.pool.num_evicted_blocks

    def cached_mask(self, block_hashes: Sequence[BlockHash]) -> list[bool]:
        """Whether each hash is cached. Changes no recency (peek is not touch)."""
        return self.pool.cached_mask(block_hashes)

    # ------------------------------------------------------------------ PrefixCache
    def peek_prefix_tokens(self, request: Request) -> int:
        """Tokens of the request's leading run of cached full blocks (no hit cap); a peek."""
        return self.pool.num_leading_cached(request.block_hashes) * self.block_size

    def block_keys(self, request: Request) -> Sequence[BlockHash]:
        return request.block_hashes

    def subscribe(self, listener: CacheListener) -> None:
        self._feed.subscribe(listener)

    def publish(self, now_s: float) -> None:
        """Hand the events recorded since the last call to the subscribers, stamped `now_s`."""
        self._feed.publish(now_s)

    @property
    def records_events(self) -> bool:
        """Whether the cache records events (someone subscribed)."""
        return self.pool.records_events

    def _record_stored(self, state: RequestState, start: int) -> None:
        """A `stored` event for blocks start..num_cached_blocks-1 of `state` (one caching pass), if any."""
        stop = state.num_cached_blocks
        if stop > start:
            self.pool.record_stored(tuple(state.block_hashes(start, stop)),
                                    state.block_hash(start - 1) if start > 0 else None)

    def find_longest_cache_hit(self, state: RequestState) -> list[int]:
        # NOTE: a full hit still recomputes the last token (its logits are needed), so hits are capped at
        # num_tokens - 1 and rounded down to whole blocks: a block-aligned resend recomputes its last block.
        max_hit_blocks = (state.num_tokens - 1) // self.block_size
        return self.pool.leading_cached_blocks(state.block_hashes(0, max_hit_blocks))  # stops at the first miss

    def _num_evictable(self, hit_blocks: Sequence[int]) -> int:
        """Hit blocks sitting in the free queue: touching them takes them out of it."""
        return self.pool.num_evictable(hit_blocks)

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
            # NOTE: the common decode cases, same outcome as the general path: the slots exist already, or the token
            # starts a block (one new block, not full yet unless B == 1, so nothing registers with it).
            end = state.num_computed_tokens + num_new_tokens
            num_slots = len(state.block_ids) * B
            if end <= num_slots and end <= self.max_model_len:
                if not pool.records_events:
                    self._cache_full_blocks(state, min(end, state.num_tokens))
                else:
                    self.cache_full_blocks(state, min(end, state.num_tokens))
                return True
            if end == num_slots + 1 and B > 1 and end <= self.max_model_len:
                if not pool.num_free_blocks:
                    return False
                state.block_ids.append(pool.get_new_block())
                if not pool.records_events:
                    self._cache_full_blocks(state, min(end, state.num_tokens))
                else:
                    self.cache_full_blocks(state, min(end, state.num_tokens))
                return True
        records_events = pool.records_events
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
        first_uncached = state.num_cached_blocks
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
        self._cache_full_blocks(state, min(num_computed + num_new_tokens, state.num_tokens))
        if records_events:
            self._record_stored(state, first_uncached)
        return True

    def allocate_for_load(
        self,
        state: RequestState,
        hit_blocks: Sequence[int],
        num_external_tokens: int,
        *,
        full_sequence_must_fit: bool,
        reserved_blocks: int = 0,
    ) -> bool:
        """Slots for an async load (vLLM `allocate_slots(num_new_tokens=0, num_external_computed_tokens=ext,
        delay_cache_blocks=True, reserved_blocks=...)`, `KVM` 380-640): the GPU hit is touched and new blocks are
        taken for the `num_external_tokens` loaded after it, none of them cached until the load is done
        (`cache_full_blocks` then), so no other request hits them meanwhile. `reserved_blocks` must stay free
        for in-flight prefills. False (and nothing changed) if it does not fit.

            | GPU hit (hit_blocks, touched) | loaded from CPU: new blocks, uncached | rest of the prompt |
            0                               len(hit_blocks) * B                     + num_external_tokens
        """
        pool, B = self.pool, self.block_size
        free = pool.num_free_blocks
        if full_sequence_must_fit and self.num_blocks_to_admit(state, hit_blocks) > free:
            return False
        num_evictable_hits = self._num_evictable(hit_blocks) if hit_blocks else 0
        num_tokens = min(len(hit_blocks) * B + num_external_tokens, self.max_model_len)
        num_new_blocks = cdiv(num_tokens, B) - len(state.block_ids) - len(hit_blocks)
        if max(num_new_blocks, 0) + num_evictable_hits > free - reserved_blocks:
            return False
        if hit_blocks:
            pool.touch(hit_blocks)
            state.block_ids.extend(hit_blocks)
            state.num_cached_blocks = max(state.num_cached_blocks, len(state.block_ids))
        if num_new_blocks > 0:
            state.block_ids.extend(pool.get_new_blocks(num_new_blocks))
        return True

    def num_blocks_to_finish(self, state: RequestState) -> int:
        """Blocks `state` still needs to hold all its current tokens (vLLM `_request_remaining_blocks`)."""
        return max(cdiv(min(state.num_tokens, self.max_model_len), self.block_size) - len(state.block_ids), 0)

    def cache_full_blocks(self, state: RequestState, num_tokens: int) -> None:
        """Register the hashes of every block fully covered by the first `num_tokens` tokens of `state` (one
        caching pass: one `stored` event when recording)."""
        start = state.num_cached_blocks
        self._cache_full_blocks(state, num_tokens)
        if self.pool.records_events:
            self._record_stored(state, start)

    def _cache_full_blocks(self, state: RequestState, num_tokens: int) -> None:
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
