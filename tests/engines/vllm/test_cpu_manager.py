"""kvsim's mirror of vLLM 0.33.0's CPU offloading manager (LRU and ARC), `sim.engines.vllm.offload.cpu_manager`.

* Narrated scenarios with exact state (rules: docs/engines/vllm-0.33-offloading-rules.md §4).
* In CI: kvsim replays `cpu_manager_streams.STREAMS` (the rules doc's probe, 60 random legal op sequences under
  LRU and 40 under ARC) and must reproduce the answers recorded from vLLM's own `CPUOffloadingManager`
  (tests/golden/cpu_manager/*.json) op by op.
* Opt-in (`-m vllm_oracle`, KVSIM_VLLM_PYTHON naming the oracle venv's python): the same against vLLM live. Golden
  files are regenerated with `KVSIM_VLLM_PYTHON=... python -m tests.support.cpu_manager_streams`.
"""

from __future__ import annotations

import pytest

from sim.engines.vllm.offload import CpuManagerCounters, CpuOffloadingManager, LookupResult, PrepareStoreOutput
from tests.support.cpu_manager_streams import (
    ORACLE,
    ORACLE_VLLM_VERSION,
    STREAMS,
    build_stream,
    differences,
    replay_kvsim,
)
from tests.support.oracle_support import check_golden, check_live

HIT, MISS, HIT_PENDING = LookupResult.HIT, LookupResult.MISS, LookupResult.HIT_PENDING


def start(m: CpuOffloadingManager, request_id: str, chunk_hashes: list[str]) -> None:
    """A request whose chunk i ends at token 16 * (i + 1)."""
    m.on_new_request(request_id, {h: 16 * (i + 1) for i, h in enumerate(chunk_hashes)})


def store(m: CpuOffloadingManager, request_id: str, chunk_hashes: list[str], *, finish: bool = True):
    start(m, request_id, chunk_hashes)
    out = m.prepare_store(request_id, chunk_hashes)
    assert out is not None
    m.complete_store(out.chunk_hashes_to_store)
    if finish:
        m.request_finished(request_id)
    m.check_invariants()
    return out


def test_the_rules_doc_probe_re_offered_request_is_refreshed_and_stores_evict_tail_first():
    # 6 chunks; A stores k1..k3, D stores k4..k6, G re-offers A's chunks (all resident: nothing stored) and
    # finishes, so A's chunks are now the most recent, head last.
    m = CpuOffloadingManager(6)
    store(m, "A", ["k1", "k2", "k3"])
    store(m, "D", ["k4", "k5", "k6"])
    assert store(m, "G", ["k1", "k2", "k3"]) == PrepareStoreOutput((), (), ())
    assert m.lru_order() == ["k6", "k5", "k4", "k3", "k2", "k1"]
    # Four new single stores evict D tail first, then A's tail; each takes the slot just freed.
    outs = [store(m, f"N{i}", [f"k{i}"]) for i in (7, 8, 9, 10)]
    assert [o.evicted_chunk_hashes for o in outs] == [("k6",), ("k5",), ("k4",), ("k3",)]
    assert [o.chunk_ids for o in outs] == [(5,), (4,), (3,), (2,)]
    assert m.lru_order() == ["k2", "k1", "k7", "k8", "k9", "k10"]
    assert m.counters() == CpuManagerCounters(num_allocation_attempts=6, num_allocation_chunks=10,
                                              num_evicted_chunks=4)


def test_a_running_requests_provisional_rank_is_older_than_a_just_finished_commit():
    # A and B store three chunks each; A finishes after B stored (B drew its request rank first), so B's chunks,
    # still at their provisional rank, go before all of A's (offloading/README.md, self-test 3).
    m = CpuOffloadingManager(6)
    store(m, "A", ["a0", "a1", "a2"], finish=False)
    store(m, "B", ["b0", "b1", "b2"], finish=False)
    m.request_finished("A")
    assert m.lru_order() == ["b2", "b1", "b0", "a2", "a1", "a0"]
    out = store(m, "C", ["c0", "c1", "c2", "c3"])
    assert out.evicted_chunk_hashes == ("b2", "b1", "b0", "a2")
    assert m.lru_order() == ["a1", "a0", "c3", "c2", "c1", "c0"]


def test_a_chunk_is_hit_pending_until_its_store_completes_and_lookup_changes_nothing():
    m = CpuOffloadingManager(4)
    start(m, "A", ["k1", "k2"])
    assert m.prepare_store("A", ["k1", "k2"]) == PrepareStoreOutput(("k1", "k2"), (0, 1), ())
    assert [m.lookup(h) for h in ("k1", "k2", "k3")] == [HIT_PENDING, HIT_PENDING, MISS]
    assert m.counters().num_write_pending_chunks == 2 and m.counters().num_used_chunks == 2
    # A write-pending chunk offered again is neither stored nor counted as an allocation.
    start(m, "B", ["k1"])
    assert m.prepare_store("B", ["k1"]) == PrepareStoreOutput((), (), ())
    with pytest.raises(ValueError, match="still being stored"):
        m.prepare_load("B", ["k1"])
    m.complete_store(["k1", "k2"])
    before = m.lru_order()
    assert [m.lookup(h) for h in ("k1", "k2")] == [HIT, HIT]
    assert m.lru_order() == before == ["k2", "k1"]
    assert m.counters() == CpuManagerCounters(num_allocation_attempts=1, num_allocation_chunks=2)


def test_all_or_nothing_every_chunk_pinned_means_none_and_no_change():
    # 4 chunks, all pinned by loads: a one-chunk store gets None (rules §4.3 probe); nothing is evicted.
    m = CpuOffloadingManager(4)
    store(m, "A", ["k1", "k2", "k3", "k4"])
    start(m, "L", ["k1", "k2", "k3", "k4"])
    assert m.prepare_load("L", ["k1", "k2", "k3", "k4"]) == (0, 1, 2, 3)
    start(m, "C", ["k20"])
    assert m.prepare_store("C", ["k20"]) is None
    assert m.ref_counts() == {"k1": 1, "k2": 1, "k3": 1, "k4": 1}
    assert m.counters() == CpuManagerCounters(num_allocation_attempts=2, num_allocation_chunks=5,
                                              num_allocation_failures=1, num_used_chunks=4)
    # One load done: k4 is evictable again, and the retry evicts it into its slot.
    m.complete_load(["k4"])
    assert m.prepare_store("C", ["k20"]) == PrepareStoreOutput(("k20",), (3,), ("k4",))
    m.check_invariants()


def test_a_store_needing_two_slots_with_one_evictable_gets_nothing():
    m = CpuOffloadingManager(2)
    store(m, "A", ["k1", "k2"])
    start(m, "L", ["k1"])
    m.prepare_load("L", ["k1"])
    start(m, "B", ["k5", "k6"])
    assert m.prepare_store("B", ["k5", "k6"]) is None
    assert m.lru_order() == ["k2", "k1"] and m.lookup("k2") is HIT


def test_chunks_in_the_offer_are_never_evicted_for_it():
    # k1 is the only evictable chunk and the LRU victim, but it is in the offer: the store gets nothing.
    m = CpuOffloadingManager(2)
    store(m, "A", ["k1"])
    store(m, "B", ["k2"])
    start(m, "L", ["k2"])
    m.prepare_load("L", ["k2"])
    start(m, "C", ["k1", "k3"])
    assert m.prepare_store("C", ["k1", "k3"]) is None
    assert m.ref_counts() == {"k1": 0, "k2": 1}


def test_a_failed_store_frees_its_slot_silently_and_the_slot_is_reused_first():
    m = CpuOffloadingManager(4)
    start(m, "A", ["k1", "k2"])
    m.prepare_store("A", ["k1", "k2"])
    m.complete_store(["k2"], success=False)
    m.complete_store(["k1"])
    assert m.ref_counts() == {"k1": 0} and m.lookup("k2") is MISS
    # Never-used slots (2, 3) come before the freed slot 1.
    start(m, "B", ["k3", "k4", "k5"])
    assert m.prepare_store("B", ["k3", "k4", "k5"]).chunk_ids == (2, 3, 1)
    m.check_invariants()


def test_a_rank_committed_while_pinned_applies_once_the_chunk_is_evictable():
    m = CpuOffloadingManager(3)
    store(m, "A", ["k1"])
    store(m, "B", ["k2"])
    start(m, "L", ["k1"])
    m.prepare_load("L", ["k1"])
    m.request_finished("L")  # k1 is now the most recent, though still pinned
    assert m.lru_order() == ["k2", "k1"]
    m.complete_load(["k1"])
    store(m, "C", ["k3"])
    assert store(m, "D", ["k4"]).evicted_chunk_hashes == ("k2",)


def test_store_threshold_two_stores_a_chunk_on_its_second_offer():
    m = CpuOffloadingManager(4, store_threshold=2)
    start(m, "A", ["k1"])
    assert m.prepare_store("A", ["k1"]) == PrepareStoreOutput((), (), ())
    m.request_finished("A")
    assert store(m, "B", ["k1"]).chunk_hashes_to_store == ("k1",)
    assert m.counters() == CpuManagerCounters(num_allocation_attempts=1, num_allocation_chunks=1,
                                              num_stores_skipped=1)


def test_reset_cache_drops_everything_and_restarts_slots():
    m = CpuOffloadingManager(2)
    store(m, "A", ["k1", "k2"])
    m.reset_cache()
    assert m.lru_order() == [] and m.lookup("k1") is MISS
    assert store(m, "B", ["k3"]).chunk_ids == (0,)


def test_loads_and_stores_of_illegal_chunks_name_the_chunk():
    m = CpuOffloadingManager(2)
    with pytest.raises(ValueError, match="'k9' that is not resident"):
        m.prepare_load("A", ["k9"])
    with pytest.raises(ValueError, match="'k9' that is not being loaded"):
        m.complete_load(["k9"])
    with pytest.raises(ValueError, match="duplicate"):
        m.prepare_store("A", ["k1", "k1"])


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="'lru' or 'arc'"):
        CpuOffloadingManager(4, eviction_policy="lfu")


# --- ARC (rules §4.4, vLLM's cpu/policies/arc.py) ---


def arc(m: CpuOffloadingManager) -> tuple:
    a = m.arc_state()
    return a["t1"], a["t2"], a["b1"], a["b2"], a["target_t1_size"]


def test_arc_a_chunk_reused_by_a_later_request_moves_to_t2_at_its_finish():
    m = CpuOffloadingManager(6, eviction_policy="arc")
    # A's stores enter T1 in offer order; its finish moves them to T1's MRU end tail first, so the head is last.
    store(m, "A", ["a0", "a1", "a2"])
    assert arc(m) == (["a2", "a1", "a0"], [], [], [], 0.0)
    # B loads A's first two chunks and stores its own third: nothing moves until B finishes (loads, pins and
    # unpins are not policy accesses); then, tail first, b2 (only inserted) goes to T1's MRU end and a1, a0
    # (reused) go from T1 to T2.
    start(m, "B", ["a0", "a1", "b2"])
    assert m.prepare_load("B", ["a0", "a1"]) == (0, 1)
    m.complete_load(["a0", "a1"])
    assert m.prepare_store("B", ["b2"]) == PrepareStoreOutput(("b2",), (3,), ())
    m.complete_store(["b2"])
    assert arc(m) == (["a2", "a1", "a0", "b2"], [], [], [], 0.0)
    m.request_finished("B")
    assert arc(m) == (["a2", "b2"], ["a1", "a0"], [], [], 0.0)
    # C re-offers A's whole prompt (all ready: nothing stored, every chunk a reuse): a2 leaves T1, and a1, a0
    # move to T2's MRU end behind it.
    assert store(m, "C", ["a0", "a1", "a2"]) == PrepareStoreOutput((), (), ())
    assert arc(m) == (["b2"], ["a2", "a1", "a0"], [], [], 0.0)
    m.check_invariants()


def test_arc_a_store_miss_in_b1_raises_the_target_before_the_eviction():
    m = CpuOffloadingManager(2, eviction_policy="arc")
    store(m, "A", ["k1", "k2"])
    # Target 0: the victim is T1's LRU end, k2 (A's tail), which becomes a B1 ghost.
    assert store(m, "B", ["k3"]).evicted_chunk_hashes == ("k2",)
    assert arc(m) == (["k1", "k3"], [], ["k2"], [], 0.0)
    # C stores k2 again: a B1 hit, so the target rises by max(1, |B2| / |B1|) = 1 first; |T1| = 2 >= 1 still
    # evicts from T1 (k1 goes to B1); k2 is inserted into T1 and leaves B1.
    out = store(m, "C", ["k2"])
    assert (out.evicted_chunk_hashes, out.chunk_ids) == (("k1",), (0,))
    assert arc(m) == (["k3", "k2"], [], ["k1"], [], 1.0)
    # A request that misses the same ghost twice adapts once (vLLM dedupes per request, `CM` 293-301): D's
    # first offer fails (k2 pinned, k3 in the offer) yet counts; its retry does not adapt again.
    start(m, "L", ["k2"])
    m.prepare_load("L", ["k2"])
    start(m, "D", ["k3", "k1"])
    assert m.prepare_store("D", ["k3", "k1"]) is None
    assert arc(m) == (["k3", "k2"], [], ["k1"], [], 2.0)
    m.complete_load(["k2"])
    assert m.prepare_store("D", ["k3", "k1"]) == PrepareStoreOutput(("k1",), (0,), ("k2",))
    assert arc(m) == (["k3", "k1"], [], ["k2"], [], 2.0)
    m.check_invariants()


def test_arc_evicts_from_t1_while_it_holds_at_least_the_target_else_from_t2_and_a_b2_hit_lowers_it():
    m = CpuOffloadingManager(4, eviction_policy="arc")
    store(m, "A", ["a0", "a1"])
    start(m, "L", ["a0", "a1"])
    m.prepare_load("L", ["a0", "a1"])
    m.complete_load(["a0", "a1"])
    m.request_finished("L")
    store(m, "B", ["b0", "b1"])
    assert arc(m) == (["b1", "b0"], ["a1", "a0"], [], [], 0.0)
    # Full. Target 0: T1's LRU end goes (b1), and each B1 hit then adds 1 to the target.
    assert store(m, "C", ["c0"]).evicted_chunk_hashes == ("b1",)
    assert store(m, "D", ["b1"]).evicted_chunk_hashes == ("b0",)  # target 1, |T1| = 2 >= 1
    assert store(m, "E", ["b0"]).evicted_chunk_hashes == ("c0",)  # target 2, |T1| = 2 >= 2
    assert arc(m) == (["b1", "b0"], ["a1", "a0"], ["c0"], [], 2.0)
    # Target 3 > |T1| = 2: the victim is T2's LRU end, a1, which becomes a B2 ghost.
    assert store(m, "F", ["c0"]).evicted_chunk_hashes == ("a1",)
    assert arc(m) == (["b1", "b0", "c0"], ["a0"], [], ["a1"], 3.0)
    # A B2 hit lowers the target by max(1, |B1| / |B2|) = 1: |T1| = 3 >= 2, T1's LRU end goes. The re-stored
    # a1 enters T1, not T2: a store is not a reuse.
    assert store(m, "G", ["a1"]).evicted_chunk_hashes == ("b1",)
    assert arc(m) == (["b0", "c0", "a1"], ["a0"], ["b1"], [], 2.0)
    m.check_invariants()


def test_arc_never_evicts_write_pending_or_pinned_chunks_and_falls_back_to_the_other_list():
    m = CpuOffloadingManager(3, eviction_policy="arc")
    store(m, "A", ["a0"])
    start(m, "L", ["a0"])
    m.prepare_load("L", ["a0"])
    m.complete_load(["a0"])
    m.request_finished("L")
    start(m, "B", ["b0", "b1"])
    m.prepare_store("B", ["b0", "b1"])  # in flight: write-pending in T1
    # |T1| = 2 >= target 0, but neither T1 chunk can go: the victim is T2's a0.
    start(m, "C", ["c0"])
    assert m.prepare_store("C", ["c0"]) == PrepareStoreOutput(("c0",), (0,), ("a0",))
    assert arc(m) == (["b0", "b1", "c0"], [], [], ["a0"], 0.0)
    # Everything is write-pending now: the next store gets None and changes nothing (but the B2 hit's target
    # change, made before the eviction is tried, which stays at 0 here).
    start(m, "D", ["a0"])
    assert m.prepare_store("D", ["a0"]) is None
    assert arc(m) == (["b0", "b1", "c0"], [], [], ["a0"], 0.0)
    # A failed store drops its chunk without a ghost entry.
    m.complete_store(["b1"], success=False)
    assert arc(m) == (["b0", "c0"], [], [], ["a0"], 0.0)
    m.check_invariants()


def test_arc_state_and_lru_order_each_belong_to_their_policy_and_reset_clears_arc():
    m = CpuOffloadingManager(2, eviction_policy="arc")
    store(m, "A", ["k1", "k2"])
    store(m, "B", ["k3"])
    with pytest.raises(ValueError, match="arc_state"):
        m.lru_order()
    with pytest.raises(ValueError, match="lru_order"):
        CpuOffloadingManager(2).arc_state()
    m.reset_cache()
    assert arc(m) == ([], [], [], [], 0.0) and m.lookup("k1") is MISS


# --- against vLLM's own manager ---


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_kvsim_reproduces_recorded_vllm_answer(name):
    check_golden(ORACLE, name, build_stream(name), replay_kvsim, differences, ORACLE_VLLM_VERSION)


def test_the_recorded_streams_exercise_what_they_claim():
    def ops(name):
        stream, answer = build_stream(name), ORACLE.golden(name)["answer"]
        return [(o, r) for spec, run in zip(stream["runs"], answer["runs"]) for o, r in zip(spec["ops"], run["results"])]

    for name in ("random_lru", "random_threshold", "random_arc"):
        pairs = ops(name)
        assert any(o["op"] == "prepare_store" and r is None for o, r in pairs)
        assert "HIT_PENDING" in [r for _, r in pairs] and "HIT" in [r for _, r in pairs]
        assert any(o["op"] == "complete_store" and not o["success"] for o, _ in pairs)
        assert any(o["op"] == "reset_cache" for o, _ in pairs)
    assert any(o["op"] == "prepare_store" and r and len(r["evicted"]) > 1 for o, r in ops("random_lru"))
    skipped = [run["final"]["stats"]["vllm:kv_offload_stores_skipped"]
               for run in ORACLE.golden("random_threshold")["answer"]["runs"]]
    assert sum(skipped) > 0
    # ARC: evictions from T2 as well as T1 (a victim later seen as a B2 ghost), the target moving up (B1 hits)
    # and down (B2 hits), and reused chunks reaching T2.
    states = [r["arc"] for o, r in ops("random_arc") if o["op"] == "state"]
    assert any(a["b2"] for a in states) and any(a["b1"] for a in states) and any(a["t2"] for a in states)
    targets = [(a["target_t1_size"], b["target_t1_size"]) for a, b in zip(states, states[1:])]
    assert any(y > x for x, y in targets) and any(y < x for x, y in targets)


@pytest.mark.vllm_oracle
@pytest.mark.parametrize("name", sorted(STREAMS))
def test_kvsim_matches_live_vllm(name):
    check_live(ORACLE, build_stream(name), replay_kvsim, differences, ORACLE_VLLM_VERSION)
