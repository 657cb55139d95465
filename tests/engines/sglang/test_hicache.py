"""SGLang's HiCache host tier (`HiRadixCache`) in tiny narrated scenarios with exact expected state, and the engine
with it (docs/engines/sglang-hicache.md; rules docs/engines/hicache-0.5.23-rules.md)."""

from __future__ import annotations

import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cluster.device import Device
from sim.cluster.host_link import HostLinkQueue
from sim.cluster.worker import Worker
from sim.engines.sglang.engine import SglangEngine
from sim.engines.sglang.hiradix_cache import HiRadixCache, host_capacity_tokens
from sim.engines.sglang.spec import SglangEngineSpec
from sim.engines.sglang.tokens import Tokens
from sim.runner import run
from sim.scenario import load_scenario, with_cpu_kv_gib
from sim.timing.linear import LinearStepTimeModel
from sim.workloads.request import Request

A = ("a", 0, 20)
B = ("b", 0, 5)


def tiers(c: HiRadixCache) -> list[tuple[int, str, int]]:
    """Each node as (path length, tiers, lock_ref), shortest path first."""
    return sorted((len(path), t, lock) for path, t, lock in c.tiers())


def ack_all(c: HiRadixCache, now_s: float = 0.0) -> None:
    """Every copy issued completes at once (what SGLang's CPU events report) and is reaped."""
    for copy in c.take_new_writes() + c.take_new_loads():
        copy.done_s = now_s
    c.check_events(now_s)


def room(c: HiRadixCache, device_tokens: int):
    """The pool's evict-for-alloc against a device pool of `device_tokens` (no request holds private KV)."""
    def make_room(n: int) -> bool:
        short = n - (device_tokens - c.total_size())
        if short > 0:
            c.evict(short)
        return device_tokens - c.total_size() >= n
    return make_room


def test_host_capacity_is_sglangs_page_rounding_plus_one_page():
    # 64 device tokens at ratio 2 are 128 tokens' bytes: SGLang allocates floor(128 / P) + 1 pages (129 slots at P=1)
    assert host_capacity_tokens(128 * 100, 100, 1) == 129
    assert host_capacity_tokens(128 * 100 + 99, 100, 16) == 144
    with pytest.raises(ValueError, match="hicache_write_policy must be one of"):
        HiRadixCache(host_capacity=10, write_policy="write_around")


def test_write_through_backs_up_on_insert_locks_until_the_ack_then_demotes_and_loads_back():
    # write_through: the 20-token prompt is copied to the host as it is inserted (host 129 -> 109 free) and stays
    # device-locked (protected) until the copy is acknowledged; eviction then demotes it (device freed, the node
    # stays host-only); a match finds device 0 + host 20, and the load-back puts it on both tiers, locked until its ack.
    c = HiRadixCache(host_capacity=129)
    c.insert(Tokens([A]))
    assert (c.evictable_size(), c.protected_size(), c.host_available()) == (0, 20, 109)
    assert c.evict(20) == 0  # a copy in flight pins its node
    ack_all(c)
    assert (c.evictable_size(), c.protected_size()) == (20, 0) and tiers(c) == [(20, "DH", 0)]
    assert c.evict(20) == 20 and tiers(c) == [(20, "H", 0)] and c.total_size() == 0
    device, _, host, best = c.match_prefix_tiers(Tokens([A]))
    assert (device, host) == (0, 20)
    assert c.load_back(best, room(c, 64)) == 20
    assert tiers(c) == [(20, "DH", 1)] and (c.protected_size(), c.host_available()) == (20, 109)
    ack_all(c)
    assert c.match_prefix_tiers(Tokens([A]))[:3:2] == (20, 0) and tiers(c) == [(20, "DH", 0)]
    assert (c.num_stored_tokens, c.num_loaded_tokens, c.num_evicted_tokens) == (20, 20, 20)
    c.check_invariants()


def test_write_through_selective_waits_for_a_second_hit_and_write_back_for_eviction():
    # selective: a new leaf has 1 hit, a node is copied at its 2nd; evicted before that, it is deleted (no host copy)
    c = HiRadixCache(host_capacity=129, write_policy="write_through_selective")
    c.insert(Tokens([A]))
    assert c.host_available() == 129 and tiers(c) == [(20, "D", 0)]
    assert c.evict(20) == 20 and tiers(c) == [] and c.num_unbacked_evicted_tokens == 20
    c.insert(Tokens([A]))
    c.insert(Tokens([A]))  # the second counted insert backs it up
    assert c.host_available() == 109 and tiers(c) == [(20, "DH", 1)]
    # write_back: nothing on insert, however often; eviction copies the victim synchronously (no lock), then demotes
    w = HiRadixCache(host_capacity=129, write_policy="write_back")
    w.insert(Tokens([A]))
    w.insert(Tokens([A]))
    assert w.host_available() == 129 and w.protected_size() == 0
    assert w.evict(20) == 20 and tiers(w) == [(20, "H", 0)] and w.host_available() == 109
    assert [copy.tokens for copy in w.take_new_writes()] == [20] and not w.pending_writes


def test_write_through_copies_unbacked_ancestors_root_first_and_a_chain_stops_when_the_host_is_full():
    # selective leaves the 20-token prefix unbacked; its child's 2nd hit backs up prefix then child, root first
    c = HiRadixCache(host_capacity=129, write_policy="write_through_selective")
    c.insert(Tokens([A, B]))
    c.match_prefix(Tokens([A]))          # split: prefix 20 -> tail 5, both with hit_count 1
    c.insert(Tokens([A, B]))             # both reach 2
    assert [copy.tokens for copy in c.take_new_writes()] == [20, 5] and tiers(c) == [(20, "DH", 2), (25, "DH", 1)]
    # a host of 22 slots: the prefix fits, the tail's copy does not (nothing host-evictable): the chain stops there
    d = HiRadixCache(host_capacity=22)
    d.insert(Tokens([A]))
    d.insert(Tokens([A, B]))
    assert tiers(d) == [(20, "DH", 1), (25, "D", 0)] and d.host_available() == 2


def test_device_eviction_takes_a_node_whose_children_are_host_only_and_host_eviction_frees_h_leaves_lru_first():
    # prefix A with tails B and C, all backed up; tails evicted to the host first, then the prefix (a D-leaf once
    # its children are host-only). A 30-token host: backing up new D (10 tokens) must free host space: H-leaves
    # are the host-only tails, oldest first (B), and the prefix still has a child so it is no H-leaf.
    c = HiRadixCache(host_capacity=31)
    C = ("c", 0, 5)
    c.insert(Tokens([A, B]))
    c.insert(Tokens([A, C]))
    ack_all(c)
    assert c.host_available() == 1 and tiers(c) == [(20, "DH", 0), (25, "DH", 0), (25, "DH", 0)]
    assert c.evict(10) == 10 and tiers(c) == [(20, "DH", 0), (25, "H", 0), (25, "H", 0)]
    assert c.evict(1) == 20 and tiers(c) == [(20, "H", 0), (25, "H", 0), (25, "H", 0)]
    c.insert(Tokens([("d", 0, 9)]))  # needs 9 host slots, 1 free: evicts B (LRU H-leaf), then C
    assert c.num_host_evicted_tokens == 10 and c.host_available() == 2
    assert tiers(c) == [(9, "DH", 1), (20, "H", 0)]
    # ...and the now childless host-only prefix is the next H-leaf
    c.insert(Tokens([("e", 0, 20)]))
    assert tiers(c) == [(9, "DH", 1), (20, "DH", 1)] and c.num_host_evicted_tokens == 30
    c.check_invariants()


def test_a_host_hit_under_ten_tokens_is_not_loaded_and_an_insert_takes_host_only_nodes_back():
    c = HiRadixCache(host_capacity=129)
    c.insert(Tokens([A]))
    c.insert(Tokens([A, B]))
    ack_all(c)
    c.evict(5)                                            # only the 5-token tail goes to the host
    d, _, h, best = c.match_prefix_tiers(Tokens([A, B]))
    assert (d, h) == (20, 5) and c.load_back(best, room(c, 64)) == 0   # declined: under load_back_threshold 10
    c.insert(Tokens([A, B]))                              # the recomputed tail becomes the node's device copy again
    assert tiers(c) == [(20, "DH", 0), (25, "DH", 0)] and c.host_available() == 104


def _engine(policy: str = "write_through", **spec):
    # 100 device tokens, a host of 200 (1 byte per token), a host link of 1,000 tokens/s with no latency
    link = HostLinkQueue(bandwidth_bytes_per_s=1000.0, latency_s=0.0)
    return SglangEngine(SglangEngineSpec(kv_cache_bytes=1, max_total_tokens=100, cpu_kv_bytes=199,
                                         hicache_write_policy=policy, disable_overlap_schedule=True, **spec),
                        kv_bytes_per_token=1, host_link=link)


def test_the_engine_loads_a_prefix_back_and_counts_it_as_a_host_hit_timed_on_the_link():
    # 100 device tokens, a link of 1,000 tokens/s. r1 (prefix p 40 + own 10, 2 outputs) prefills 0 -> 0.06 s; its
    # prompt's copy (50 tokens) runs 0.06 -> 0.11 and its finish's (1 token) -> 0.111, each device-locking its path
    # until acknowledged (write_through). r2 (prefix q) arrives at 0.071 and needs 50 + 2 + 1 slots, but 51 are
    # locked: it waits for the acks and is admitted at 0.111, which demotes r1's nodes to the host. r3 shares p: its
    # 40 host tokens are loaded back at admission (0.222, after r2's own copies), a host hit; its batch's forward
    # waits for the load (40 / 1000 s) and prefills its 10 own tokens (0.01 + 0.010): first token at 0.282.
    env = simpy.Environment()
    engine = _engine()
    seen = {}
    w = Worker(env, 0, engine, Device(env, "d"), LinearStepTimeModel(base_s=0.01, prefill_token_s=0.001,
                                                                     decode_seq_s=0.001),
               on_first_token=lambda s: seen.__setitem__(s.request.request_id, s), on_finished=lambda s: None)
    for rid, prefix in ((1, "p"), (2, "q"), (3, "p")):
        w.submit(Request(rid, 50, 2, (), token_runs=(((prefix,), 40), (("u", rid), 10))), env.now)
        env.run()
    assert [round(seen[r].admitted_s, 6) for r in (1, 2, 3)] == [0.0, 0.111, 0.222]
    assert [(seen[r].num_cached_tokens, seen[r].num_cpu_hit_tokens) for r in (1, 2, 3)] == [(0, 0), (0, 0), (40, 40)]
    assert round(seen[3].first_token_s, 6) == 0.282
    counters = engine.counters()
    # stored: r1 and r2 51 tokens each, r3 only its own 11 (its prefix is already on the host); loaded: 40
    assert (counters.cpu_stored_blocks, counters.cpu_loaded_blocks, counters.cpu_evicted_blocks) == (113, 40, 0)
    assert [(len(path), t) for path, t, _ in sorted(engine.tree.tiers(), key=lambda x: (len(x[0]), x[1]))] == [
        (40, "DH"), (50, "DH"), (50, "H"), (50, "H"), (51, "DH"), (51, "H"), (51, "H")]


def test_without_a_host_tier_the_engine_runs_the_plain_tree():
    engine = SglangEngine(SglangEngineSpec(kv_cache_bytes=1, max_total_tokens=100), kv_bytes_per_token=1)
    assert type(engine.tree).__name__ == "RadixCache" and engine.hicache is None
    with pytest.raises(ValueError, match="needs a host link"):
        SglangEngine(SglangEngineSpec(kv_cache_bytes=1, max_total_tokens=100, cpu_kv_bytes=10), kv_bytes_per_token=1)


@pytest.mark.parametrize("policy", ["write_through", "write_through_selective", "write_back"])
def test_decode_stretches_are_exact_with_a_host_tier(policy):
    # 2 workers of 4,000 device slots and a 1 GiB host each, 6 prefixes of 1,000 tokens: the device holds about
    # three of them, the host the rest, so requests hit both tiers; stepping every decode batch or advancing
    # stretches must give the same records.
    scenario, _ = load_scenario()
    s = with_cpu_kv_gib(scenario.with_engine("sglang").with_overrides(**{
        "cluster.deployments": [], "cluster.workers": 2, "workload.prefixes": 6, "workload.prefix_tokens": 1000,
        "workload.tail_tokens": 50, "workload.concurrency": 8, "workload.output_tokens": 40,
        "engine.kv_cache_bytes": 4000 * 114688, "engine.hicache_write_policy": policy}), 1)
    slow, fast = run(s, fast_forward=False), run(s, fast_forward=True)
    key = [(r.request_id, r.worker, r.cached_tokens, r.cpu_cached_tokens) for r in slow.records]
    assert [(r.request_id, r.worker, r.cached_tokens, r.cpu_cached_tokens) for r in fast.records] == key
    assert [r.finished_s for r in fast.records] == pytest.approx([r.finished_s for r in slow.records])
    assert fast.workers == slow.workers
    assert sum(1 for r in slow.records if r.cpu_cached_tokens) > 10


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(["write_through", "write_through_selective", "write_back"]), st.integers(1, 2),
       st.lists(st.tuples(st.sampled_from(["insert", "match_load", "evict", "ack", "lock", "unlock"]),
                          st.integers(0, 5), st.integers(1, 30)), max_size=60))
def test_any_sequence_of_operations_keeps_the_tiers_consistent(policy, page_size, ops):
    # Keys from 3 prefixes x 2 tails; a device of 64 tokens (make_room) and a host of 50: every operation leaves the
    # sizes equal to the tree's (device: evictable + protected; host: backed-up tokens <= capacity), the leaf sets
    # current, no dead node, no device node under a host-only one (`check_invariants`), and nothing lost: the
    # device holds what the pool says.
    c = HiRadixCache(page_size=page_size, host_capacity=50, write_policy=policy)
    locks = []
    for op, k, n in ops:
        key = Tokens([(("p", k % 3), 0, 12), (("t", k), 0, n)])
        if op == "insert":
            if room(c, 64)(len(key)):
                c.insert(key)
        elif op == "match_load":
            d, node, h, best = c.match_prefix_tiers(key)
            loaded = c.load_back(best, room(c, 64)) if h else 0
            assert loaded in (0, h) and (loaded == 0 or h >= 10)
        elif op == "evict":
            c.evict(n)
        elif op == "ack":
            ack_all(c)
        elif op == "lock":
            _, node = c.match_prefix(key)
            c.inc_lock_ref(node)
            locks.append(node)
        elif locks:
            c.dec_lock_ref(locks.pop(k % len(locks)))
        c.check_invariants()
        assert c.total_size() <= 64  # room() made space before every insert and load: the device never overflows
