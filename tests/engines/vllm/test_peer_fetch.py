"""Dynamo KVBM's G2 peer fetch on the vLLM host tier (sim/engines/vllm/offload/peer_fetch.py), narrated: worker A's
host tier holds a prompt's blocks; worker B misses on GPU and host, pulls them from A's host tier over its NIC into
its own, then loads them over PCIe as an ordinary host hit; once A has evicted them B's lookup is a plain miss."""

from __future__ import annotations

import pytest

from sim.cluster.host_link import HostLinkQueue
from sim.cluster.network_link import NetworkLinkQueue
from sim.engines.registry import bind_peer_fetch
from sim.engines.vllm.engine import VllmEngine
from sim.engines.vllm.spec import VllmEngineSpec
from tests.support.tier_engines import BLOCK_BYTES, KV, STEP_S
from tests.support.tier_engines import drain as _drain
from tests.support.tier_engines import request as _request
from tests.support.tier_engines import serve as _serve
from tests.support.tier_engines import step as _step

PCIE = (16e6, 1e-3)  # host link: 16 MB/s, 1 ms
NIC = (8e6, 2e-3)  # network link: 8 MB/s, 2 ms


def _workers(n: int, *, cpu_blocks: int = 8, gpu_blocks: int = 20, **spec):
    spec = VllmEngineSpec(kv_cache_bytes=gpu_blocks * BLOCK_BYTES, cpu_kv_bytes=cpu_blocks * BLOCK_BYTES,
                          vllm_version="0.33.0", peer_fetch=True, **spec)
    engines = [VllmEngine(spec, kv_bytes_per_token=KV,
                          host_link=HostLinkQueue(bandwidth_bytes_per_s=PCIE[0], latency_s=PCIE[1]))
               for _ in range(n)]
    bind_peer_fetch(engines, [NetworkLinkQueue(bandwidth_bytes_per_s=NIC[0], latency_s=NIC[1]) for _ in range(n)])
    return engines


def _host(engine: VllmEngine) -> dict:
    return engine.connector.manager.ref_counts()


def test_b_pulls_a_hosts_blocks_over_its_nic_then_loads_them_over_pcie():
    a, b = _workers(2)
    # A serves X (70 tokens: 4 full blocks); its prompt chunks are written to A's host tier. No peer holds them
    # while A looks up (B's host is empty), so A asks and finds nothing: a plain miss.
    _, t = _serve(a, 0, 70, prefix=1, t=0.0)
    assert _host(a) == {(1, 0): 0, (1, 1): 0, (1, 2): 0, (1, 3): 0}
    assert a.counters().peer_fetched_blocks == 0
    # B has never seen X: GPU miss, host miss; A's host holds all 4 chunks, so B allocates them in its own host
    # tier (write-pending, ref -1) and pins them on A (ref 1), and the request waits.
    x = b.add_request(_request(1, 70, prefix=1), worker=0, arrival_s=t)
    t0 = t
    t, plan = _step(b, t)
    assert plan.is_empty and x.num_computed_tokens == 0
    assert _host(b) == {(1, 0): -1, (1, 1): -1, (1, 2): -1, (1, 3): -1}
    assert _host(a) == {(1, 0): 1, (1, 1): 1, (1, 2): 1, (1, 3): 1}
    # The pull starts at the step's start on B's NIC: 2 ms + 64 KiB at 8 MB/s.
    pull_s = NIC[1] + 4 * BLOCK_BYTES / NIC[0]
    assert b.next_background_s() == pytest.approx(t0 + pull_s)
    t = _drain(b, b.next_background_s())
    # Done: the chunks are ready in B's host (stored CPU events), unpinned on A; B's lookup then was a host hit of
    # 64 tokens loaded over PCIe (1 ms + 64 KiB at 16 MB/s) as any host hit is.
    assert _host(b) == {(1, 0): 0, (1, 1): 0, (1, 2): 0, (1, 3): 0}
    assert _host(a) == {(1, 0): 0, (1, 1): 0, (1, 2): 0, (1, 3): 0}
    assert x.num_cpu_hit_tokens == 64 and x.num_cached_tokens == 64
    load_s = PCIE[1] + 4 * BLOCK_BYTES / PCIE[0]
    assert x.tier_load_s == pytest.approx(load_s)
    # The request waited for the pull, the load, and its prefill step.
    assert x.first_token_s - x.arrival_s == pytest.approx(pull_s + load_s + STEP_S)
    cb = b.counters()
    assert (cb.peer_fetched_blocks, cb.cpu_loaded_blocks, cb.cpu_stored_blocks) == (4, 4, 0)
    assert a.counters().peer_fetched_blocks == 0


def test_after_eviction_on_a_it_is_a_miss():
    # A's host tier holds 4 chunks: X's 4 fill it, then Y's 4 evict them. B's lookup of X finds no peer holding it.
    a, b = _workers(2, cpu_blocks=4)
    _, t = _serve(a, 0, 70, prefix=1, t=0.0)
    _, t = _serve(a, 1, 70, prefix=2, t=t)
    assert sorted(_host(a)) == [(2, 0), (2, 1), (2, 2), (2, 3)]
    x, t_end = _serve(b, 2, 70, prefix=1, t=t)
    assert x.num_cpu_hit_tokens == 0 and x.num_cached_tokens == 0
    assert x.first_token_s - x.arrival_s == pytest.approx(STEP_S)
    assert b.counters().peer_fetched_blocks == 0
    assert sorted(_host(b)) == [(1, 0), (1, 1), (1, 2), (1, 3)]  # B computed X and stored it as usual


def test_peer_min_blocks_and_the_holders_contiguous_run():
    # A holds X's first 2 chunks only (a 40-token prompt); B asks for 4, A gives its run of 2: B loads 2 from host
    # and computes the rest. With peer_min_blocks 5, B does not ask (4 remain).
    a, b = _workers(2)
    _, t = _serve(a, 0, 40, prefix=1, t=0.0)
    x, t = _serve(b, 1, 70, prefix=1, t=t)
    assert x.num_cpu_hit_tokens == 32 and b.counters().peer_fetched_blocks == 2
    a, b = _workers(2, peer_min_blocks=5)
    _, t = _serve(a, 0, 70, prefix=1, t=0.0)
    x, t = _serve(b, 1, 70, prefix=1, t=t)
    assert x.num_cpu_hit_tokens == 0 and b.counters().peer_fetched_blocks == 0


def test_peer_fetch_needs_the_offloading_host_tier():
    with pytest.raises(ValueError, match="engine.peer_fetch: needs a host tier"):
        VllmEngineSpec(kv_cache_bytes=BLOCK_BYTES * 20, peer_fetch=True)
