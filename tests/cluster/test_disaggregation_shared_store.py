"""A cluster-shared KV store with P/D pools, narrated on test_disaggregation's linear time model (step = 0.01 s +
0.001 s per prefill token + 0.002 s per decode, 4-token blocks of 4,000 bytes, router hop 1 ms, P/D link 1 MB/s
with 1 ms latency and 2 ms overhead) and a store link of the same figures (a copy of n blocks: 0.003 s + n x 4 ms).

The store is the prefill pool's, as Dynamo deploys KVBM with disaggregation (prefill workers `--connector kvbm
nixl`, decode workers `--connector nixl`): prefill workers load from it and store to it, decode workers receive
their KV from the prefill worker only."""

from __future__ import annotations

import pytest
import simpy

from sim.runner import build_cluster, build_pd_router
from sim.scenario import ScenarioError
from tests.cluster.test_disaggregation import request, run, scenario

STORE = {"engine.shared_kv_bytes": 409_600,  # 100 chunks of 4 KiB-aligned 4,000-byte blocks
         "engine.shared_link": {"bandwidth": 1e6, "latency_s": 0.001, "overhead_s": 0.002}}


def two_prefill_one_decode(**engine_overrides):
    sc = scenario({"name": "round-robin"}, workers=3,
                  disaggregation={"prefill": {"workers": 2, **engine_overrides}, "decode": {"workers": 1},
                                  "link": {"bandwidth_bytes_per_s": 1e6, "latency_s": 0.001, "overhead_s": 0.002}})
    return sc.with_overrides(**STORE)


def test_a_prefill_worker_loads_what_another_prefill_worker_stored():
    # Request 1 (8 shared + 2 own blocks) prefills on prefill worker 0 as in test_disaggregation's first test and
    # stores its 10 prompt blocks to the store; the decode worker keeps the 10 blocks it received.
    # Request 2 (same 8 shared blocks, 2 own), sent at 0.3, goes to prefill worker 1 (round robin), which has nothing
    # on its GPU:
    # 0.301   arrives; the store holds its 8 shared blocks: admitted with 0 tokens, the load of 8 blocks (32,000 B)
    #         starts at once (the step computes nothing): 0.002 + 0.032 + 0.001 latency -> done at 0.336.
    # 0.336   promoted; computes its 8 own tokens, 0.018 s -> its one token at 0.354 (and stores its 2 new blocks).
    # 0.355   at the decode worker after the response and the hop: its own cache holds the 8 shared blocks, so only
    #         8 tokens move (0.003 + 0.008 -> 0.366), then the last-token step, 0.011 s -> first token at 0.377.
    records, cluster = run(two_prefill_one_decode(), [(0.0, request(1, 8, 2)), (0.3, request(2, 8, 2))])
    r1, r2 = records[1], records[2]
    assert (r1.pd_prefill_worker, r1.worker, r1.shared_cached_tokens) == (0, 2, 0)
    assert (r2.pd_prefill_worker, r2.worker) == (1, 2)
    assert (r2.cached_tokens, r2.shared_cached_tokens) == (32, 32)  # the hit is the prefill worker's: all shared
    assert r2.tier_load_s == pytest.approx(0.035)
    assert r2.transfer_tokens == 8
    assert r2.first_token_s == pytest.approx(0.377)
    assert r2.finished_s == pytest.approx(0.401)
    # NOTE: the TTFT split counts the load as queueing (the prefill is timed from the promotion that ends it).
    assert (r2.ttft_queue_s, r2.ttft_prefill_s, r2.ttft_transfer_s) == pytest.approx((0.035, 0.018, 0.011))
    p0, p1, d = (c.engine for c in cluster.counters())
    assert (p0.shared_stored_blocks, p0.shared_loaded_blocks) == (10, 0)
    assert (p1.shared_stored_blocks, p1.shared_loaded_blocks) == (2, 8)  # its own 2 blocks, after the 8 it loaded
    # the decode worker neither reads nor writes the store
    assert (d.shared_stored_blocks, d.shared_loaded_blocks, d.shared_link_bytes) == (0, 0, 0)
    assert cluster.workers[2].engine.connector is None


def test_without_the_store_the_second_prefill_worker_computes_the_prefix():
    # The same two requests without a store: prefill worker 1 computes all 40 tokens (0.05 s): token at 0.351, at the
    # decode worker at 0.352, and the decode side as above (0.022 s) -> first token at 0.374. The store's 35 ms load
    # saved 32 ms of prefill: on this slow link it is 3 ms slower; it pays off only when its copy beats the compute.
    sc = scenario({"name": "round-robin"}, workers=3,
                  disaggregation={"prefill": {"workers": 2}, "decode": {"workers": 1},
                                  "link": {"bandwidth_bytes_per_s": 1e6, "latency_s": 0.001, "overhead_s": 0.002}})
    records, _ = run(sc, [(0.0, request(1, 8, 2)), (0.3, request(2, 8, 2))])
    assert (records[2].cached_tokens, records[2].shared_cached_tokens) == (0, 0)
    assert records[2].first_token_s == pytest.approx(0.374)


def test_decode_workers_cannot_be_given_the_store():
    with pytest.raises(ScenarioError, match="cluster.disaggregation.decode.engine.shared_kv_bytes"):
        scenario({"name": "round-robin"}, workers=3,
                 disaggregation={"prefill": {"workers": 2}, "decode": {"workers": 1,
                                                                       "engine": {"shared_kv_bytes": 409_600}}})


def test_the_store_may_be_the_prefill_pools_override():
    sc = scenario({"name": "round-robin"}, workers=3,
                  disaggregation={"prefill": {"workers": 2, "engine": {"shared_kv_bytes": 409_600}},
                                  "decode": {"workers": 1}})
    assert sc.shared_kv_bytes == 409_600


def test_a_prefill_pool_view_delivers_its_workers_store_events():
    # A router on the prefill pool that weighs tier hits subscribes through its pool's view: request 1 prefills on
    # prefill worker 0 (round robin), which stores its 10 prompt blocks to the store; the view of prefill worker 0
    # hears them as stored events of medium SHARED (one batch per completed store), prefill worker 1 hears nothing.
    env = simpy.Environment()
    sc = two_prefill_one_decode()
    cluster = build_cluster(env, sc, build_pd_router(sc))
    heard: dict[int, list] = {0: [], 1: []}
    for w in heard:
        cluster.prefill_view.subscribe_tier_events(w, lambda events, _t, w=w: heard[w].extend(events))
    env.process(_send(env, cluster, request(1, 8, 2)))
    env.run()
    stored = [e for e in heard[0] if e.kind == "stored"]
    assert {e.medium for e in stored} == {"SHARED"}
    assert sum(len(e.block_hashes) for e in stored) == 10
    assert heard[1] == []


def _send(env, cluster, req):
    yield cluster.send(req)
