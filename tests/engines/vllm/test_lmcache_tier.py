"""LMCache 0.5.6 in-process as the host tier (`engine.cpu_kv_connector: lmcache`), narrated: its CPU backend's LRU
(head-first inserts, touch on lookup hits, allocation before dedup, a store dropped when nothing is evictable) and
the engine's synchronous loads and stores in simulated time. Rules: docs/engines/lmcache-0.5.6-rules.md §1."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.cluster.host_link import HostLinkQueue
from sim.engines.vllm.engine import VllmEngine
from sim.engines.vllm.offload.lmcache import LmcacheCpuBackend
from sim.engines.vllm.spec import VllmEngineSpec
from tests.engines.vllm.test_cpu_tier import KV, _request, _serve_one_by_one, _step


# --- the CPU backend ----------------------------------------------------------------------------------------------
def test_inserts_go_head_first_and_a_lookup_hit_makes_the_head_most_recent():
    backend = LmcacheCpuBackend(4)
    backend.store(["a", "b", "c", "d"])
    assert list(backend.chunks) == ["a", "b", "c", "d"]  # least recent first: the head of the prefix goes first
    assert backend.store(["e"]).evicted == ("a",)
    assert backend.lookup(["b", "c", "x", "d"]) == 2  # a prefix: x misses, d is not reached
    assert list(backend.chunks) == ["d", "e", "c", "b"]  # the hit touched in reverse: b, the head, most recent
    assert backend.chunks["b"] == backend.chunks["c"] == 1  # pinned until loaded


def test_a_duplicate_store_allocates_first_so_it_evicts_and_refreshes_nothing():
    backend = LmcacheCpuBackend(4)
    backend.store(["a", "b", "c", "d"])
    result = backend.store(["c"])  # c is resident, but a buffer is allocated before the put notices it
    assert (result.stored, result.evicted) == ((), ("a",))
    assert list(backend.chunks) == ["b", "c", "d"]  # c not moved


def test_a_store_with_nothing_evictable_keeps_what_it_allocated_and_drops_the_rest():
    backend = LmcacheCpuBackend(3)
    backend.store(["a", "b"])
    backend.lookup(["a", "b"])  # both pinned
    result = backend.store(["c", "d", "e"])
    assert (result.stored, result.evicted, result.num_dropped) == (("c",), (), 2)
    backend.unpin(["a", "b"])
    # the lookup left b least recent (a, the head, touched last), then c was inserted: d evicts b
    assert list(backend.chunks) == ["b", "a", "c"]
    assert backend.store(["d"]).evicted == ("b",)


# --- in the engine ---------------------------------------------------------------------------------------------------
def lmcache_engine(*, cpu_chunks: int = 10):
    # 16-token blocks of 16 KiB, 32-token LMCache chunks (2 blocks, 32 KiB), 20 GPU blocks, a link of 16 MB/s with
    # 1 ms per copy: a copy of one chunk takes 0.001 + 32768 / 16e6 = 3.048 ms, of two 5.096 ms.
    spec = VllmEngineSpec(kv_cache_bytes=20 * 16 * KV, cpu_kv_bytes=cpu_chunks * 32 * KV, vllm_version="0.33.0",
                          cpu_kv_connector="lmcache", lmcache_chunk_tokens=32)
    return VllmEngine(spec, kv_bytes_per_token=KV, host_link=HostLinkQueue(bandwidth_bytes_per_s=16e6,
                                                                            latency_s=1e-3))


def test_a_prompt_stores_its_full_chunks_synchronously_in_the_step_that_computes_them():
    # A: 70 tokens, one 10 ms step computes them all: chunks 0 and 1 (tokens 0-63) are full, the 6-token tail is
    # not stored. The store runs in that step, which lasts 5.096 ms longer: A's first token at 0.015096.
    engine = lmcache_engine()
    a = engine.add_request(_request(0, 70, prefix=1), worker=0, arrival_s=0.0)
    t, plan = _step(engine, 0.0, 0.010)
    assert plan.stall_s == pytest.approx(0.005096)
    assert a.first_token_s == pytest.approx(0.015096)
    assert engine.counters().cpu_stored_blocks == 4  # 2 chunks of 2 blocks
    assert not engine.scheduler.connector.has_jobs  # nothing left in flight: the next step sees the chunks


def test_a_cpu_hit_loads_in_its_admitting_step_and_prefills_in_it():
    # A (70 tokens) is stored (2 chunks), two 150-token floods (4 full chunks each) evict it from the GPU; the tier
    # (10 chunks) still holds it. A again: GPU miss, LMCache hit 64 tokens: the request is scheduled at once with
    # 64 tokens computed and 6 to prefill, and its admitting step first waits for the 2-chunk load (5.096 ms):
    # first token 15.096 ms after its arrival (vLLM's own connector takes at least three steps, test_cpu_tier).
    engine = lmcache_engine()
    _, t = _serve_one_by_one(engine, ((70, 1), (150, 2), (150, 3)))
    assert engine.counters().cpu_stored_blocks == 2 * (2 + 4 + 4)
    a2 = engine.add_request(_request(10, 70, prefix=1), worker=0, arrival_s=t)
    start = t
    t, plan = _step(engine, t, 0.010)
    assert plan.num_scheduled_tokens[a2] == 6 and not a2.loading
    assert (a2.num_cached_tokens, a2.num_cpu_hit_tokens) == (64, 64)
    assert a2.tier_load_s == pytest.approx(0.005096)
    assert a2.first_token_s - start == pytest.approx(0.015096)
    assert engine.counters().cpu_loaded_blocks == 4


def test_a_full_hit_recomputes_the_last_token():
    # A 64-token prompt (2 chunks, chunk-aligned) stored, then evicted from the GPU: the hit is the whole prompt,
    # so ext = 64 - 0 - 1 = 63 tokens and the last token is computed (the load still copies both chunks).
    engine = lmcache_engine()
    _, t = _serve_one_by_one(engine, ((64, 1), (150, 2), (150, 3)))
    a2 = engine.add_request(_request(10, 64, prefix=1), worker=0, arrival_s=t)
    _, plan = _step(engine, t, 0.010)
    assert plan.num_scheduled_tokens[a2] == 1
    assert (a2.num_cached_tokens, a2.num_cpu_hit_tokens) == (63, 63)
    assert plan.stall_s == pytest.approx(0.005096)


def test_the_chunk_must_be_whole_blocks_and_lmcache_does_not_chain_with_a_store():
    with pytest.raises(ValueError, match="engine.lmcache_chunk_tokens"):
        VllmEngineSpec(kv_cache_bytes=1 << 20, cpu_kv_bytes=1 << 20, cpu_kv_connector="lmcache",
                       lmcache_chunk_tokens=40)
    with pytest.raises(ValueError, match="engine.cpu_kv_connector"):
        VllmEngineSpec(kv_cache_bytes=1 << 20, cpu_kv_bytes=1 << 20, cpu_kv_connector="lmcache",
                       shared_kv_bytes=1 << 20)


def test_cli_selects_the_connector_and_refuses_it_for_sglang(tmp_path):
    res = CliRunner().invoke(main, ["run", "--prefixes", "4", "--workers", "2", "--cpu-kv-gib", "4",
                                    "--cpu-kv-connector", "lmcache", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(main, ["run", "--engine", "sglang", "--cpu-kv-connector", "lmcache"])
    assert res.exit_code != 0 and "--cpu-kv-connector" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["run", "--cpu-kv-connector", "lmcache", "--shared-kv-gib", "4"])
    assert res.exit_code != 0 and "engine.cpu_kv_connector" in res.output and "Traceback" not in res.output
