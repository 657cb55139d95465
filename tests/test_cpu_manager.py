"""kvsim's mirror of vLLM 0.33.0's CPU offloading manager (LRU), `sim.engines.vllm.offload.cpu_manager`.

* Narrated scenarios with exact state (rules: benchmarks/vllm-oracle/offloading/vllm-0.33-offloading-rules.md §4).
* In CI: kvsim replays `cpu_manager_streams.STREAMS` (the rules doc's probe and 60 random legal op sequences) and
  must reproduce the answers recorded from vLLM's own `CPUOffloadingManager` (tests/golden/cpu_manager/*.json)
  op by op.
* Opt-in (`-m vllm_oracle`, KVSIM_VLLM_PYTHON naming the oracle venv's python): the same against vLLM live. Golden
  files are regenerated with `KVSIM_VLLM_PYTHON=... python tests/cpu_manager_streams.py`.
"""

from __future__ import annotations

import pytest

from cpu_manager_streams import ORACLE, ORACLE_VLLM_VERSION, STREAMS, build_stream, differences, replay_kvsim
from oracle_support import check_golden, check_live
from sim.engines.vllm.offload import CpuManagerCounters, CpuOffloadingManager, LookupResult, PrepareStoreOutput

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


def test_arc_is_named_as_not_mirrored():
    with pytest.raises(NotImplementedError, match="arc"):
        CpuOffloadingManager(4, eviction_policy="arc")


# --- against vLLM's own manager ---


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_kvsim_reproduces_recorded_vllm_answer(name):
    check_golden(ORACLE, name, build_stream(name), replay_kvsim, differences, ORACLE_VLLM_VERSION)


def test_the_recorded_streams_exercise_what_they_claim():
    def ops(name):
        stream, answer = build_stream(name), ORACLE.golden(name)["answer"]
        return [(o, r) for spec, run in zip(stream["runs"], answer["runs"]) for o, r in zip(spec["ops"], run["results"])]

    for name in ("random_lru", "random_threshold"):
        pairs = ops(name)
        assert any(o["op"] == "prepare_store" and r is None for o, r in pairs)
        assert "HIT_PENDING" in [r for _, r in pairs] and "HIT" in [r for _, r in pairs]
        assert any(o["op"] == "complete_store" and not o["success"] for o, _ in pairs)
        assert any(o["op"] == "reset_cache" for o, _ in pairs)
    assert any(o["op"] == "prepare_store" and r and len(r["evicted"]) > 1 for o, r in ops("random_lru"))
    skipped = [run["final"]["stats"]["vllm:kv_offload_stores_skipped"]
               for run in ORACLE.golden("random_threshold")["answer"]["runs"]]
    assert sum(skipped) > 0


@pytest.mark.vllm_oracle
@pytest.mark.parametrize("name", sorted(STREAMS))
def test_kvsim_matches_live_vllm(name):
    check_live(ORACLE, build_stream(name), replay_kvsim, differences, ORACLE_VLLM_VERSION)
