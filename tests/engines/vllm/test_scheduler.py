"""Narrated tests of the vLLM v1 step scheduler: same-step hits, chunking, FCFS blocking, preemption, stats."""

from __future__ import annotations

from sim.engines.vllm.behaviour import VllmBehaviour
from sim.engines.vllm.kv_cache_manager import KVCacheManager
from sim.engines.vllm.request_state import RequestState
from sim.engines.vllm.scheduler import Scheduler, SchedulerLimits
from sim.workloads.request import Request

B = 4
NEW = VllmBehaviour.for_version("0.33.0")


def make(num_blocks=32, budget=1000, max_seqs=16, behaviour=NEW) -> Scheduler:
    kv = KVCacheManager(num_blocks=num_blocks, block_size=B, max_model_len=10_000,
                        unhashed_to_head=behaviour.unhashed_to_head)
    return Scheduler(SchedulerLimits(budget, max_seqs, 10_000), kv, behaviour)


def req(rid, prompt, out=3, prefix=None, shared_blocks=0) -> RequestState:
    hashes = tuple((prefix, i) if prefix is not None and i < shared_blocks else ("own", rid, i)
                   for i in range(prompt // B))
    return RequestState(Request(rid, prompt, out, hashes), 0, 0.0, block_size=B)


def step(s: Scheduler):
    plan = s.schedule()
    outcome = s.update_from_output(plan)
    return plan, outcome


def test_a_request_admitted_later_in_the_same_step_hits_what_an_earlier_one_just_allocated():
    # Two requests with a new 8-token (2-block) prefix arrive together: caching at schedule time means only
    # the first misses, even though neither has been computed yet.
    s = make()
    a, b = req(1, 10, prefix="p", shared_blocks=2), req(2, 10, prefix="p", shared_blocks=2)
    s.add_request(a)
    s.add_request(b)
    plan, _ = step(s)
    assert plan.admitted == [a, b]
    assert (a.num_cached_tokens, b.num_cached_tokens) == (0, 8)
    assert plan.num_scheduled_tokens == {a: 10, b: 2}  # cached tokens use no budget
    assert s.kv.stats.requests == 2 and s.kv.stats.queries == 20 and s.kv.stats.hits == 8


def test_chunked_prefill_and_first_token_after_the_last_chunk():
    # Budget 8 tokens per step, a 20-token prompt: chunks of 8, 8, 4; the first token comes with the third step.
    s = make(budget=8)
    a = req(1, 20, out=2)
    s.add_request(a)
    sizes, firsts = [], []
    for _ in range(4):
        plan, outcome = step(s)
        sizes.append(plan.num_scheduled_tokens.get(a))
        firsts.append(bool(outcome.first_token))
    assert sizes == [8, 8, 4, 1]
    assert firsts == [False, False, True, False]
    assert a.is_finished and not s.has_work


def test_each_chunk_registers_its_full_blocks_when_scheduled():
    s = make(budget=6)
    a, b = req(1, 13, prefix="p", shared_blocks=3), req(2, 13, prefix="p", shared_blocks=3)
    s.add_request(a)
    step(s)  # a: tokens 0..5 scheduled -> block 0 full and cached, block 1 half
    assert a.num_cached_blocks == 1
    s.add_request(b)
    plan, _ = step(s)  # a continues (6 more tokens -> blocks 1, 2 cached); budget is then spent
    assert plan.num_scheduled_tokens == {a: 6} and a.num_cached_blocks == 3
    plan, _ = step(s)  # a's last token, then b is admitted and hits all three prefix blocks
    assert b in plan.admitted and b.num_cached_tokens == 12


def test_fcfs_head_of_line_blocking_when_the_whole_prompt_does_not_fit():
    # 10 usable blocks. A runs with 6 blocks; B needs 5 blocks for its whole prompt (only 4 free): it waits, and
    # C (1 block) behind it is not tried either.
    s = make(num_blocks=11)
    a, b, c = req(1, 24, out=20), req(2, 20), req(3, 3)
    s.add_request(a)
    step(s)
    s.add_request(b)
    s.add_request(c)
    plan, _ = step(s)
    assert plan.admitted == [] and list(s.waiting) == [b, c]


def test_older_vllm_admits_when_only_the_first_chunk_fits():
    s = make(num_blocks=11, budget=8, behaviour=VllmBehaviour.for_version("0.18.0"))
    a, b = req(1, 24, out=20), req(2, 20)
    s.add_request(a)
    for _ in range(3):
        step(s)  # a's 24 tokens in three chunks
    s.add_request(b)
    plan, _ = step(s)
    assert plan.admitted == [b]  # only its first chunk (7 tokens, 2 blocks) had to fit


def test_preemption_takes_the_last_admitted_request_and_it_later_hits_its_own_blocks():
    # 6 usable blocks. A (8 tokens) and B (8 tokens) each hold 2 blocks, then decode. When A needs a third block
    # and none is free... B, the last admitted, is preempted: its blocks freed tail first, progress reset, and
    # it goes back to the head of the waiting queue.
    s = make(num_blocks=7)
    a, b = req(1, 8, out=9), req(2, 8, out=9)
    s.add_request(a)
    s.add_request(b)
    step(s)  # both prefill; token 1 each; KV for 8 tokens = 2 blocks each
    preempted_at = None
    for k in range(12):
        plan, _ = step(s)
        if plan.preempted:
            preempted_at = k
            break
    assert preempted_at is not None
    assert plan.preempted == [b]
    assert b.num_computed_tokens == 0 and b.block_ids == [] and s.waiting[0] is b
    assert b.num_preemptions == 1 and s.num_preemptions == 1
    assert plan.admitted == []  # no admissions in a step that preempted
    # Resume: B's earlier full blocks are still cached, so it hits them (capped at num_tokens - 1).
    while s.waiting:
        step(s)
    assert s.kv.stats.preempted_requests == 1 and s.kv.stats.preempted_hits > 0
    assert b.num_cached_tokens == 0  # the record keeps the hit of the first admission


def test_a_request_that_cannot_grow_preempts_itself_when_it_is_the_last():
    s = make(num_blocks=4)  # 3 usable blocks
    a = req(1, 8, out=10)
    s.add_request(a)
    preempted = []
    for _ in range(10):
        plan, _ = step(s)
        preempted += plan.preempted
        if preempted:
            break
    assert preempted == [a]


def test_max_num_seqs_caps_running_requests():
    s = make(max_seqs=2)
    for rid in range(3):
        s.add_request(req(rid, 5))
    plan, _ = step(s)
    assert len(plan.admitted) == 2 and len(s.waiting) == 1


def test_stats_counted_at_every_lookup_before_0_27():
    # A head request that does not fit is looked up (and counted) again at every step in <= 0.26.
    old = make(num_blocks=5, behaviour=VllmBehaviour.for_version("0.26.0"))
    new = make(num_blocks=5, behaviour=NEW)
    for s in (old, new):
        s.add_request(req(1, 12, out=6))
        step(s)
        s.add_request(req(2, 12))
        step(s)
        step(s)
    assert new.kv.stats.requests == 1
    assert old.kv.stats.requests == 3 and old.kv.stats.queries == 12 + 2 * 12


def shape(plan):
    return (plan.num_prefill_tokens, plan.num_decode_seqs, plan.num_decode_context_tokens,
            plan.num_prefill_attention_pairs, plan.num_prefill_context_tokens)


def test_step_shape_for_the_time_model():
    s = make()
    a = req(1, 10, out=3, prefix="p", shared_blocks=2)
    s.add_request(a)
    plan, _ = step(s)
    assert shape(plan) == (10, 0, 0, 55, 0)  # 10 new tokens from 0: 10 x 11 / 2 query-key pairs, no context before
    b = req(2, 11, prefix="p", shared_blocks=2)
    s.add_request(b)
    plan = s.schedule()
    # a decodes (reads its 10 computed tokens); b hits 8 tokens and computes 3: 3 x 8 + 3 x 4 / 2 pairs, after the
    # 8 cached tokens it reads.
    assert shape(plan) == (3, 1, 10, 3 * 8 + 6, 8)
