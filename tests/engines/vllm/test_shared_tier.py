"""The cluster-shared KV store and tier chaining (sim/engines/vllm/offload/multi.py), narrated: worker A stores and
worker B loads; the store's one capacity evicts across workers; a store in flight is a miss; host then shared chain
as vLLM's MultiConnector does (the first tier with a hit is the one loaded from, and stores go to both)."""

from __future__ import annotations

import pytest

from sim.cluster.host_link import HostLinkQueue
from sim.cluster.network_link import NetworkLinkQueue, StoreBandwidth
from sim.engines.interface import SharedTier
from sim.engines.vllm.engine import VllmEngine
from sim.engines.vllm.spec import VllmEngineSpec
from tests.support.tier_engines import BLOCK_BYTES, KV, STEP_S
from tests.support.tier_engines import request as _request
from tests.support.tier_engines import serve as _serve
from tests.support.tier_engines import step as _step



def _link(bandwidth: float = 16e6, latency_s: float = 1e-3, overhead_s: float = 0.0, store=None):
    return NetworkLinkQueue(bandwidth_bytes_per_s=bandwidth, latency_s=latency_s, overhead_s=overhead_s, store=store)


def _workers(n: int, *, gpu_blocks: int = 20, shared_blocks: int = 32, cpu_blocks: int = 0, **link):
    """n engines of `gpu_blocks` GPU blocks sharing one store of `shared_blocks` chunks, each on its own NIC."""
    spec = VllmEngineSpec(kv_cache_bytes=gpu_blocks * BLOCK_BYTES, shared_kv_bytes=shared_blocks * BLOCK_BYTES,
                          cpu_kv_bytes=cpu_blocks * BLOCK_BYTES, vllm_version="0.33.0")
    store = VllmEngine.shared_store(spec, KV)
    return store, [VllmEngine(spec, kv_bytes_per_token=KV, shared_tier=SharedTier(store, _link(**link)),
                              host_link=HostLinkQueue(bandwidth_bytes_per_s=16e6, latency_s=1e-3))
                   for _ in range(n)]


def test_worker_a_stores_and_worker_b_loads_over_its_own_link():
    # A serves X (70 tokens: 4 full blocks); its prompt chunks are written through to the store. B has never seen X:
    # its GPU misses, the store hits all 4 chunks, and B loads them over its NIC (1 ms + 64 KiB at 16 MB/s).
    store, (a, b) = _workers(2)
    _, t = _serve(a, 0, 70, prefix=1, t=0.0)
    assert sorted(store.ref_counts()) == [(1, 0), (1, 1), (1, 2), (1, 3)]
    assert set(store.ref_counts().values()) == {0}  # stored and evictable
    x, t_end = _serve(b, 1, 70, prefix=1, t=t)
    assert x.num_shared_hit_tokens == 64 and x.num_cpu_hit_tokens == 0 and x.num_cached_tokens == 64
    # The load starts when the admitting (empty) step ends, at once; B sleeps until it is done, then prefills.
    load_s = 1e-3 + 4 * BLOCK_BYTES / 16e6
    assert x.tier_load_s == pytest.approx(load_s)
    assert x.first_token_s - x.arrival_s == pytest.approx(load_s + STEP_S)
    ca, cb = a.counters(), b.counters()
    assert (ca.shared_stored_blocks, ca.shared_loaded_blocks) == (4, 0)
    assert (cb.shared_stored_blocks, cb.shared_loaded_blocks) == (0, 4)  # B offers X's chunks: all resident
    assert cb.shared_link_bytes == 4 * BLOCK_BYTES and cb.prefix_cache.hits == 0


def test_one_capacity_for_the_cluster_evicts_another_workers_chunks_least_recent_first():
    # A 6-chunk store. A stores X (4 chunks); B then stores Y (4 chunks): 2 must go, and they are X's, its tail
    # first (vLLM's LRU: within a request, tails go before heads).
    store, (a, b) = _workers(2, shared_blocks=6)
    _, t = _serve(a, 0, 70, prefix=1, t=0.0)
    _, t = _serve(b, 1, 70, prefix=2, t=t)
    # Evicted first at the front: each finished request's chunks were re-ranked tail first, so its head is its
    # most recent; X's tail (1, 2), (1, 3) went.
    assert store.lru_order() == [(1, 1), (1, 0), (2, 3), (2, 2), (2, 1), (2, 0)]
    assert b.counters().shared_evicted_blocks == 2 and a.counters().shared_evicted_blocks == 0
    # A third worker asking for X now finds only its first two chunks (32 tokens) and loads those.
    c = VllmEngine(b.spec, kv_bytes_per_token=KV, shared_tier=SharedTier(store, _link()))
    x, _ = _serve(c, 2, 70, prefix=1, t=t)
    assert x.num_shared_hit_tokens == 32 and x.num_cached_tokens == 32


def test_a_chunk_whose_store_is_in_flight_is_a_miss_not_a_wait():
    # A slow NIC (1 MB/s): A's store of X takes 66.5 ms. B asks for X while it is in flight: vLLM's host tier would
    # defer B; the shared store answers miss (a put is visible once written), so B prefills X itself.
    store, (a, b) = _workers(2, bandwidth=1e6)
    a.add_request(_request(0, 70, prefix=1, output=1), worker=0, arrival_s=0.0)
    t, _ = _step(a, 0.0)  # prefill; the store job goes out at the next step's start
    t, _ = _step(a, t)
    assert set(store.ref_counts().values()) == {-1}  # write-pending
    x, _ = _serve(b, 1, 70, prefix=1, t=t)
    assert x.num_shared_hit_tokens == 0 and x.num_cached_tokens == 0


def test_host_then_shared_the_first_tier_with_a_hit_is_loaded_even_if_the_store_holds_more():
    # Worker A stores X (4 chunks) in the store. Worker B (host tier + store, 20 GPU blocks) serves X' = X's first 40
    # tokens: the store hits 2 chunks, and B's host tier gets them written through. Two floods evict them from B's
    # GPU. X on B then finds 2 chunks in its host tier and 4 in the store: vLLM's MultiConnector loads from the
    # first tier reporting a hit, the host, and B prefills the rest.
    store, (a, b) = _workers(2, cpu_blocks=32)
    _, t = _serve(a, 0, 70, prefix=1, t=0.0)
    x1, t = _serve(b, 1, 40, prefix=1, t=t)
    assert x1.num_shared_hit_tokens == 32
    host = b.connector.tiers[0].manager
    assert sorted(h for h in host.ref_counts() if h[0] == 1) == [(1, 0), (1, 1)]
    _, t = _serve(b, 2, 150, prefix=2, t=t)
    _, t = _serve(b, 3, 150, prefix=3, t=t)
    x, _ = _serve(b, 4, 70, prefix=1, t=t)
    assert x.num_cached_tokens == 32 and x.num_cpu_hit_tokens == 32 and x.num_shared_hit_tokens == 0
    cb = b.counters()
    assert (cb.cpu_loaded_blocks, cb.shared_loaded_blocks) == (2, 2)
    # B's host tier now holds X's 4 chunks (the two it computed written through), and so does the store.
    assert sorted(h for h in host.ref_counts() if h[0] == 1) == [(1, 0), (1, 1), (1, 2), (1, 3)]


def test_the_network_link_queues_per_direction_and_the_store_bandwidth_is_shared():
    # Two NICs of 1 MB/s with 1 ms overhead and 2 ms latency, one store of 1 MB/s: two 1 MB loads submitted at 0 on
    # different NICs share the store: the first done at 1.001 + 0.002, the second queues behind it at the store.
    store = StoreBandwidth(bandwidth_bytes_per_s=1e6)
    nic1, nic2 = (_link(bandwidth=1e6, latency_s=2e-3, overhead_s=1e-3, store=store) for _ in range(2))
    assert nic1.copy_done_s(to_device=True, start_s=0.0, num_bytes=1_000_000) == pytest.approx(1.003)
    assert nic2.copy_done_s(to_device=True, start_s=0.0, num_bytes=1_000_000) == pytest.approx(2.003)
    # The other direction is free; the same NIC's next load queues behind its first (overhead holds the queue).
    assert nic1.copy_done_s(to_device=False, start_s=0.0, num_bytes=1_000_000) == pytest.approx(1.003)
    assert nic1.copy_done_s(to_device=True, start_s=0.0, num_bytes=0) == pytest.approx(2.003)


def test_tiers_publish_their_events_with_their_medium_to_tier_subscribers_only():
    # Host tier + a 6-chunk store. X's 4 chunks are stored in both when the stores complete (vLLM's BlockStored
    # medium "CPU", queued at complete_store); the store's eviction for Y is a removed event of medium "SHARED",
    # queued in the schedule() whose offer needed the room. The GPU cache's subscribers hear only GPU events.
    store, (a, b) = _workers(2, shared_blocks=6, cpu_blocks=32)
    tier_events, gpu_events = [], []
    for engine in (a, b):
        engine.subscribe_tiers(lambda batch, now_s: tier_events.extend((e.kind, e.medium, e.block_hashes)
                                                                        for e in batch))
        engine.cache.subscribe(lambda batch, now_s: gpu_events.extend(batch))
    _, t = _serve(a, 0, 70, prefix=1, t=0.0)
    x = tuple((1, i) for i in range(4))
    assert sorted(tier_events) == [("stored", "CPU", x), ("stored", "SHARED", x)]
    tier_events.clear()
    _serve(b, 1, 70, prefix=2, t=t)
    y = tuple((2, i) for i in range(4))
    assert tier_events == [("removed", "SHARED", ((1, 3), (1, 2))), ("stored", "CPU", y), ("stored", "SHARED", y)]
    assert gpu_events and all(e.medium is None for e in gpu_events)


@pytest.mark.parametrize("cpu_gib", [0, 1])
def test_fast_forward_is_exact_with_a_shared_store_under_pressure(cpu_gib):
    # A 2 GiB store for 3 workers and 12 prefixes evicts all the time. Other workers read the store, so a worker
    # with shared copies in flight must not advance decode steps as one event: a store completing inside the
    # stretch would reach the others late (without that rule 30 of 480 records differ here).
    from sim.runner import run
    from sim.scenario import load_scenario, with_cpu_kv_gib, with_shared_kv_gib

    base, _ = load_scenario()
    s = with_shared_kv_gib(base.with_overrides(**{
        "cluster.deployments": [], "engine.vllm_version": "0.33.0", "workload.prefixes": 12, "cluster.workers": 3,
        "workload.concurrency": 8, "router.name": "random"}), 2)
    if cpu_gib:
        s = with_cpu_kv_gib(s, cpu_gib)
    slow, fast = run(s, fast_forward=False), run(s, fast_forward=True)

    def key(result):
        return [(r.request_id, r.worker, r.cached_tokens, r.cpu_cached_tokens, r.shared_cached_tokens)
                for r in result.records]

    assert key(fast) == key(slow)
    assert [r.first_token_s for r in fast.records] == pytest.approx([r.first_token_s for r in slow.records])
    assert fast.workers == slow.workers
    assert sum(r.shared_cached_tokens > 0 for r in slow.records) > 50


def test_a_replay_with_a_shared_store_never_splits_over_processes():
    # Every worker reads what the others stored: a random-routed replay that would split over 3 processes stays one.
    from sim.replay import device_groups
    from sim.scenario import load_scenario, with_shared_kv_gib
    from tests.support.paths import SCENARIOS

    s, _ = load_scenario(SCENARIOS / "trace-replay.yaml")
    s = s.with_overrides(**{"cluster.workers": 8, "router.name": "random", "router.options": {}})
    assert len(device_groups(s, 3)) == 3
    assert device_groups(with_shared_kv_gib(s, 8), 3) == [frozenset(range(8))]
