"""Property tests: kvsim's KV cache manager against a deliberately naive model of vLLM's block pool.

The naive model is the pseudo-code of docs/engines/vllm-rules.md §9 written as plainly as possible: Python lists for
the free queue (O(n) everything), a dict of hash -> list of blocks (first registered answers lookups). Hypothesis
drives both with the same random admissions, decode steps and finishes, and after every operation the hits, the
free queue (block for block) and the cached set must agree.
"""

from __future__ import annotations

from unittest import mock

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.engines.vllm import block_pool
from sim.engines.vllm.kv_cache_manager import KVCacheManager
from sim.engines.vllm.request_state import RequestState
from sim.workloads.request import Request

B = 4


def cdiv(a, b):
    return -(-a // b)


class NaiveCache:
    def __init__(self, num_blocks: int, *, unhashed_to_head: bool):
        self.free = list(range(1, num_blocks))
        self.ref = [0] * num_blocks
        self.hash = [None] * num_blocks
        self.cached: dict[object, list[int]] = {}
        self.unhashed_to_head = unhashed_to_head
        self.blocks: dict[int, list[int]] = {}
        self.n_cached: dict[int, int] = {}

    def lookup(self, hashes, num_tokens):
        out = []
        for h in hashes[: (num_tokens - 1) // B]:
            if not self.cached.get(h):
                break
            out.append(self.cached[h][0])
        return out

    def allocate(self, rid, hashes, num_tokens, upto, hits=()):
        held = self.blocks.setdefault(rid, [])
        n_new = cdiv(upto, B) - len(hits) - len(held)
        if max(n_new, 0) + sum(1 for b in hits if self.ref[b] == 0) > len(self.free):
            return False
        for b in hits:
            if self.ref[b] == 0:
                self.free.remove(b)
            self.ref[b] += 1
        held += hits
        for _ in range(max(n_new, 0)):
            b = self.free.pop(0)
            if self.hash[b] is not None:
                self.cached[self.hash[b]].remove(b)
                if not self.cached[self.hash[b]]:
                    del self.cached[self.hash[b]]
            self.hash[b] = None
            self.ref[b] = 1
            held.append(b)
        start = max(self.n_cached.get(rid, 0), len(hits))
        for i in range(start, min(upto, num_tokens) // B):
            self.hash[held[i]] = hashes[i]
            self.cached.setdefault(hashes[i], []).append(held[i])
        self.n_cached[rid] = max(start, min(upto, num_tokens) // B)
        return True

    def release(self, rid):
        head, tail = [], []
        for b in reversed(self.blocks.pop(rid)):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (head if self.hash[b] is None and self.unhashed_to_head else tail).append(b)
        self.free = head + self.free + tail
        self.n_cached.pop(rid, None)


def all_hashes(state: RequestState, upto_tokens: int):
    return [state.block_hash(i) for i in range(upto_tokens // B)]


ops = st.lists(
    st.one_of(
        st.tuples(st.just("admit"), st.integers(0, 3), st.integers(0, 6), st.integers(1, 14), st.integers(1, 9)),
        st.tuples(st.just("decode"), st.integers(0, 50)),
        st.tuples(st.just("finish"), st.integers(0, 50)),
        st.tuples(st.just("resend"), st.integers(0, 50), st.integers(1, 9)),
    ),
    min_size=1, max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(ops=ops, num_blocks=st.integers(4, 24), unhashed_to_head=st.booleans())
@pytest.mark.slow
def test_manager_matches_naive_model(ops, num_blocks, unhashed_to_head):
    check_manager_against_naive_model(ops, num_blocks, unhashed_to_head)


@settings(max_examples=300, deadline=None)
@given(ops=ops, num_blocks=st.integers(4, 24), unhashed_to_head=st.booleans())
@pytest.mark.slow
def test_batch_passes_match_naive_model(ops, num_blocks, unhashed_to_head):
    """The pool's batch passes (allocations and frees of many blocks) taken from two blocks up, its free queue
    compacted at every touch that leaves more stale entries than free blocks and its consumed entries dropped at
    every pop: same state as the naive model after every operation, as the block-by-block loops."""
    with mock.patch.object(block_pool, "_BATCH_MIN_BLOCKS", 2), mock.patch.object(block_pool, "_COMPACT_SLACK", 0), \
            mock.patch.object(block_pool, "_COMPACT_POOL_MULTIPLE", 0), mock.patch.object(block_pool, "_TRIM_MIN_ENTRIES", 1):
        check_manager_against_naive_model(ops, num_blocks, unhashed_to_head)


def check_manager_against_naive_model(ops, num_blocks, unhashed_to_head):
    kv = KVCacheManager(num_blocks=num_blocks, block_size=B, max_model_len=10_000, unhashed_to_head=unhashed_to_head)
    naive = NaiveCache(num_blocks, unhashed_to_head=unhashed_to_head)
    running: list[RequestState] = []
    sent: list[tuple[int, tuple]] = []
    next_id = 0
    for op in ops:
        if op[0] in ("admit", "resend"):
            if op[0] == "admit":
                _, prefix, shared_blocks, tail_tokens, output_tokens = op
                prompt = shared_blocks * B + tail_tokens
                hashes = tuple(("p", prefix, i) if i < shared_blocks else ("u", next_id, i)
                               for i in range(prompt // B))
                sent.append((prompt, hashes))
            elif sent:
                # NOTE: an earlier prompt sent again: a block-aligned one wholly cached recomputes its last block,
                # which is then cached twice (a duplicate; the pool's batch passes must keep vLLM's order of them).
                (prompt, hashes), output_tokens = sent[op[1] % len(sent)], op[2]
            else:
                continue
            state = RequestState(Request(next_id, prompt, output_tokens, hashes), 0, 0.0, block_size=B)
            next_id += 1
            hits = kv.find_longest_cache_hit(state)
            n_hits = naive.lookup(list(hashes) + [state.block_hash(i) for i in range(len(hashes), 99)], prompt)
            assert hits == n_hits
            ok = kv.allocate_slots(state, prompt - len(hits) * B, hits, full_sequence_must_fit=False)
            ok_naive = naive.allocate(state.request.request_id, all_hashes(state, prompt), prompt, prompt, n_hits)
            assert ok == ok_naive
            if ok:
                state.num_computed_tokens = prompt
                running.append(state)
        elif op[0] == "decode" and running:
            state = running[op[1] % len(running)]
            if state.is_finished:
                continue
            state.num_output_tokens += 1  # the token sampled by the last step is computed by this one
            upto = state.num_computed_tokens + 1
            ok = kv.allocate_slots(state, 1)
            ok_naive = naive.allocate(state.request.request_id, all_hashes(state, state.num_tokens),
                                      state.num_tokens, upto)
            assert ok == ok_naive
            if ok:
                state.num_computed_tokens += 1
            else:
                state.num_output_tokens -= 1
        elif op[0] == "finish" and running:
            state = running.pop(op[1] % len(running))
            kv.free(state)
            naive.release(state.request.request_id)
        assert kv.pool.free_queue() == naive.free
        assert kv.pool.cached_hashes() == naive.cached.keys()
        assert all(kv.pool.get_cached_block(h) == bs[0] for h, bs in naive.cached.items())
        kv.pool.check_invariants()


@settings(max_examples=100, deadline=None)
@given(prompts=st.lists(st.tuples(st.integers(0, 2), st.integers(1, 30)), min_size=1, max_size=40))
def test_hits_are_whole_blocks_contiguous_and_below_the_prompt(prompts):
    """Whatever the history: a hit is a multiple of B, covers blocks 0..k-1, and leaves >= 1 token to compute."""
    kv = KVCacheManager(num_blocks=12, block_size=B, max_model_len=10_000)
    for rid, (prefix, length) in enumerate(prompts):
        hashes = tuple(("p", prefix, i) for i in range(length // B))
        state = RequestState(Request(rid, length, 1, hashes), 0, 0.0, block_size=B)
        hits = kv.find_longest_cache_hit(state)
        assert len(hits) * B <= length - 1
        assert [kv.pool.block_hash(b) for b in hits] == list(hashes[: len(hits)])
        if kv.allocate_slots(state, length - len(hits) * B, hits):
            kv.free(state)
        kv.pool.check_invariants()
