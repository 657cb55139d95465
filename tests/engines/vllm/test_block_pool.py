"""Narrated, exact-state tests of the block pool and the KV cache manager (vLLM v1 semantics)."""

from __future__ import annotations

import pytest

from sim.engines.vllm.block_pool import BlockPool
from sim.engines.vllm.kv_cache_manager import KVCacheManager
from sim.engines.vllm.request_state import RequestState
from sim.workloads.request import Request

B = 4  # tokens per block in these stories


def request(rid: int, prompt_tokens: int, *, shared: str | None = None, shared_blocks: int = 0,
            output_tokens: int = 1) -> RequestState:
    """A prompt whose first `shared_blocks` full blocks belong to prefix `shared`; the rest are its own."""
    n_full = prompt_tokens // B
    hashes = tuple((shared, i) if shared and i < shared_blocks else ("own", rid, i) for i in range(n_full))
    req = Request(request_id=rid, prompt_tokens=prompt_tokens, output_tokens=output_tokens, block_hashes=hashes)
    return RequestState(req, 0, 0.0, block_size=B)


def manager(num_blocks: int, **kw) -> KVCacheManager:
    return KVCacheManager(num_blocks=num_blocks, block_size=B, max_model_len=10_000, **kw)


def admit(kv: KVCacheManager, state: RequestState) -> int:
    """Look up, allocate the whole prompt in one step, return the hit tokens (as the scheduler does)."""
    hits = kv.find_longest_cache_hit(state)
    n_hit = len(hits) * B
    assert kv.allocate_slots(state, state.num_tokens - n_hit, hits, full_sequence_must_fit=True)
    state.num_computed_tokens = state.num_tokens
    return n_hit


def test_null_block_is_never_handed_out_and_the_queue_starts_in_id_order():
    # Five blocks: block 0 is the null block, so four are usable and the queue is [1, 2, 3, 4].
    pool = BlockPool(5)
    assert pool.num_usable_blocks == 4
    assert pool.free_queue() == [1, 2, 3, 4]
    assert pool.get_new_blocks(4) == [1, 2, 3, 4]
    with pytest.raises(RuntimeError, match="only 0 free"):
        pool.get_new_blocks(1)
    pool.check_invariants()


def test_capacity_of_the_reference_worker():
    # 1 GiB / (16 tokens x 114,688 B) = 585 blocks, 584 usable = 9,344 token slots.
    kv = KVCacheManager(num_blocks=1073741824 // (16 * 114688), block_size=16, max_model_len=4096)
    assert kv.pool.num_blocks == 585
    assert kv.num_free_blocks == 584


def test_free_is_tail_first_hashed_to_tail_unhashed_to_head():
    # A 10-token prompt holds 3 blocks: two full (hashed) and one partial (unhashed).
    kv = manager(8)
    a = request(1, 10)
    admit(kv, a)
    assert a.block_ids == [1, 2, 3]
    assert kv.num_free_blocks == 4 and kv.pool.free_queue() == [4, 5, 6, 7]
    kv.free(a)
    # Freed in reverse: block 3 (partial, no hash) is prepended; 2 then 1 (hashed) go to the tail, root last.
    assert kv.pool.free_queue() == [3, 4, 5, 6, 7, 2, 1]
    kv.pool.check_invariants()


def test_older_vllm_puts_unhashed_blocks_at_the_tail_too():
    kv = manager(8, unhashed_to_head=False)
    a = request(1, 10)
    admit(kv, a)
    kv.free(a)
    assert kv.pool.free_queue() == [4, 5, 6, 7, 3, 2, 1]


def test_several_unhashed_blocks_are_prepended_keeping_reverse_order():
    # Two requests free in one step; an unhashed block goes to the head in the order freed (LIFO reuse).
    kv = manager(8)
    a, b = request(1, 6), request(2, 7)
    admit(kv, a)
    admit(kv, b)
    assert a.block_ids == [1, 2] and b.block_ids == [3, 4]
    kv.free(a)
    kv.free(b)
    assert kv.pool.free_queue() == [4, 2, 5, 6, 7, 1, 3]


def test_block_aligned_prompt_hits_one_block_less():
    # NOTE: the last prompt token is always recomputed, so a 12-token (3-block) resend hits 8 tokens.
    kv = manager(10)
    a = request(1, 12, shared="p", shared_blocks=3)
    admit(kv, a)
    kv.free(a)
    again = request(2, 12, shared="p", shared_blocks=3)
    assert admit(kv, again) == 8
    # The third block is recomputed into a new block with the same hash: a duplicate, not de-duplicated.
    assert again.block_ids == [1, 2, 4]
    assert kv.pool.block_hash(4) == kv.pool.block_hash(3) == ("p", 2)
    assert kv.pool.get_cached_block(("p", 2)) == 3  # the first registered copy answers lookups
    assert kv.pool.num_cached_blocks == 4


def test_one_token_past_a_block_boundary_hits_every_full_block():
    kv = manager(10)
    admit(kv, request(1, 12, shared="p", shared_blocks=3))
    assert admit(kv, request(2, 13, shared="p", shared_blocks=3)) == 12


def test_hit_stops_at_first_missing_block():
    kv = manager(10)
    a = request(1, 13, shared="p", shared_blocks=3)
    admit(kv, a)
    # A request that shares block 0 and 2 but not block 1 (chained hashes make that impossible in practice,
    # but the lookup must still stop at the first miss).
    req = Request(request_id=9, prompt_tokens=13, output_tokens=1,
                  block_hashes=(("p", 0), ("other", 1), ("p", 2)))
    assert kv.find_longest_cache_hit(RequestState(req, 0, 0.0, block_size=B)) == [a.block_ids[0]]


def test_blocks_held_by_a_running_request_are_never_evicted():
    # Capacity 6 usable blocks. A holds the 2-block prefix; B allocates everything else and then needs more.
    kv = manager(7)
    a = request(1, 9, shared="p", shared_blocks=2)
    admit(kv, a)  # blocks 1, 2 (prefix), 3 (partial)
    b = request(2, 12)
    admit(kv, b)  # blocks 4, 5, 6
    assert kv.num_free_blocks == 0
    c = request(3, 5)
    assert not kv.allocate_slots(c, 5, full_sequence_must_fit=True)  # nothing is evictable
    assert kv.pool.get_cached_block(("p", 0)) == 1


def test_a_hit_pulls_free_cached_blocks_out_of_the_queue():
    kv = manager(8)
    a = request(1, 9, shared="p", shared_blocks=2)
    admit(kv, a)
    kv.free(a)
    assert kv.pool.free_queue() == [3, 4, 5, 6, 7, 2, 1]
    b = request(2, 9, shared="p", shared_blocks=2)
    assert admit(kv, b) == 8
    # Blocks 1 and 2 left the queue on the hit; block 3 (the head) was taken for b's partial block.
    assert b.block_ids == [1, 2, 3]
    assert kv.pool.free_queue() == [4, 5, 6, 7]
    assert kv.pool.ref_cnt(1) == 1


def test_admission_counts_free_hit_blocks_against_free_space():
    # 4 usable blocks; the cached prefix sits in the free queue. A request hitting it needs its 2 hit blocks
    # (pulled out of the queue) + 1 new block = 3 of the 4 free blocks.
    kv = manager(5)
    a = request(1, 9, shared="p", shared_blocks=2)
    admit(kv, a)
    kv.free(a)
    b = request(2, 9, shared="p", shared_blocks=2)
    hits = kv.find_longest_cache_hit(b)
    assert kv.num_blocks_to_admit(b, hits) == 3


def test_shared_prefix_returns_to_the_queue_only_when_its_last_holder_frees_it():
    kv = manager(10)
    a = request(1, 9, shared="p", shared_blocks=2)
    b = request(2, 9, shared="p", shared_blocks=2)
    admit(kv, a)
    assert admit(kv, b) == 8
    assert kv.pool.ref_cnt(1) == 2
    kv.free(a)
    assert 1 not in kv.pool.free_queue() and 2 not in kv.pool.free_queue()
    kv.free(b)
    assert kv.pool.free_queue()[-2:] == [2, 1]


def test_partial_hit_after_tail_eviction():
    # A 3-block prefix is freed (queue tail ... 3, 2, 1). Allocations eat the queue from the head, so the prefix
    # loses block 3 first and still hits blocks 1-2: a partial hit, as vLLM's reverse-order free intends.
    kv = manager(6)  # 5 usable blocks
    a = request(1, 13, shared="p", shared_blocks=3)
    admit(kv, a)  # blocks 1, 2, 3 (prefix) + 4 (partial)
    kv.free(a)
    assert kv.pool.free_queue() == [4, 5, 3, 2, 1]
    filler = request(2, 12)
    admit(kv, filler)  # takes 4, 5 and 3: evicts the prefix's last block
    assert filler.block_ids == [4, 5, 3]
    assert kv.pool.num_evicted_blocks == 1
    kv.free(filler)
    again = request(3, 13, shared="p", shared_blocks=3)
    assert admit(kv, again) == 8


def test_head_first_ablation_evicts_the_prefix_root_first():
    kv = manager(6, free_tail_first=False)
    a = request(1, 13, shared="p", shared_blocks=3)
    admit(kv, a)
    kv.free(a)
    assert kv.pool.free_queue() == [4, 5, 1, 2, 3]
    filler = request(2, 12)
    admit(kv, filler)  # takes 4, 5 and 1: the prefix root is gone
    kv.free(filler)
    assert admit(kv, request(3, 13, shared="p", shared_blocks=3)) == 0


def test_decode_blocks_are_cached_when_full_and_the_partial_last_block_is_not():
    # Prompt 6 tokens, 5 outputs: KV for 6 + 5 - 1 = 10 tokens -> 3 blocks, the first 2 hashed.
    kv = manager(10)
    s = request(1, 6, output_tokens=5)
    admit(kv, s)
    for _ in range(4):  # sample tokens 1..4; each decode step computes the previous token
        s.num_output_tokens += 1
        assert kv.allocate_slots(s, 1)
        s.num_computed_tokens += 1
    assert s.num_computed_tokens == 10 and len(s.block_ids) == 3
    assert s.num_cached_blocks == 2
    assert kv.pool.block_hash(s.block_ids[1]) == ("out", 1, 1)
    assert kv.pool.block_hash(s.block_ids[2]) is None


def test_duplicate_blocks_keep_hitting_after_the_first_copy_is_evicted():
    pool = BlockPool(6)
    b1, b2 = pool.get_new_blocks(2)
    pool.cache_block(b1, "h")
    pool.cache_block(b2, "h")  # identical content computed twice: both registered
    assert pool.get_cached_block("h") == b1
    pool.free([b1, b2])
    # Evict b1 by reallocating the whole queue head up to it.
    while pool.free_queue()[0] != b2:
        pool.get_new_blocks(1)
    assert pool.get_cached_block("h") == b2
    pool.check_invariants()


@pytest.mark.parametrize("trim_min_entries", [1, 4096])
def test_pool_prepends_a_group_of_unhashed_blocks_in_the_order_given(trim_min_entries):
    # vLLM's `prepend_n`: [5, 4] freed in that order (a request's blocks, tail first) -> the head is [5, 4, ...].
    # The same whether the group goes into the consumed slots before the queue's head or the popped entries were
    # dropped first (trimmed at once) and the group is put in front.
    from unittest import mock

    from sim.engines.vllm import block_pool

    with mock.patch.object(block_pool, "_TRIM_MIN_ENTRIES", trim_min_entries):
        pool = BlockPool(7)
        blocks = pool.get_new_blocks(5)  # 1..5
        pool.cache_block(1, "h1")
        pool.free(reversed(blocks))  # 5, 4, 3, 2 unhashed; 1 hashed
        assert pool.free_queue() == [5, 4, 3, 2, 6, 1]
        pool.check_invariants()


def test_a_requests_hash_ranges_are_its_hashes_one_by_one():
    # block_hashes(start, stop) slices the prompt's hashes, then the outputs' a session resends, then the request's
    # own keys: any range agrees with block_hash taken one block at a time (empty when start >= stop).
    for num_prompt, num_out in ((0, 0), (2, 0), (0, 2), (3, 2)):
        req = Request(7, num_prompt * B + 1, 20, tuple(("p", i) for i in range(num_prompt)),
                      output_block_hashes=tuple(("o", i) for i in range(num_out)))
        state = RequestState(req, 0, 0.0, block_size=B)
        for start in range(9):
            for stop in range(9):
                assert state.block_hashes(start, stop) == [state.block_hash(i) for i in range(start, stop)]


@pytest.mark.parametrize("batch_min_blocks", [2, 10_000])
def test_a_whole_cached_request_is_evicted_tail_first_by_the_next_allocation(batch_min_blocks):
    # Nine usable blocks all cached by request 1 (36 tokens, 9 full blocks) and freed tail first: the queue is
    # [9, 8, ..., 1]. Request 2 (36 tokens of its own) takes them in that order, evicting request 1's hashes from
    # its last block to its first, whether the pool pops block by block or in one batch pass.
    from unittest import mock

    from sim.engines.vllm import block_pool

    with mock.patch.object(block_pool, "_BATCH_MIN_BLOCKS", batch_min_blocks):
        kv = manager(10)
        kv.pool.enable_events()
        a = request(1, 36)
        admit(kv, a)
        kv.free(a)
        assert kv.pool.free_queue() == [9, 8, 7, 6, 5, 4, 3, 2, 1]
        kv.pool.take_events()
        b = request(2, 36)
        assert admit(kv, b) == 0
        assert b.block_ids == [9, 8, 7, 6, 5, 4, 3, 2, 1]
        removed = [e.block_hashes[0] for e in kv.pool.take_events() if e.kind == "removed"]
        assert removed == [("own", 1, i) for i in range(8, -1, -1)]
        assert kv.pool.cached_hashes() == {("own", 2, i) for i in range(9)}
        assert kv.num_evicted_blocks == 9
        kv.pool.check_invariants()
