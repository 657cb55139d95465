"""G2 peer fetch in a cluster, narrated on a linear time model (step = 0.01 s + 0.001 s per prefill token + 0.002 s
per decode, 4-token blocks of 4,000 bytes, router hop 1 ms), host links of 1 MB/s with 1 ms latency (a copy of n
blocks: 0.001 + n x 4 ms) and NICs of 1 MB/s, 1 ms latency and 2 ms overhead (a pull of n blocks: 0.003 + n x 4 ms).
Two workers behind round-robin; each has a host tier of 100 chunks."""

from __future__ import annotations

import pytest
import simpy

from sim.runner import build_cluster, build_router
from sim.scenario import validate_scenario
from tests.support.pd_cluster import pd_request as request


def scenario(*, peer_fetch: bool = True, cpu_kv_bytes: int = 409_600):
    return validate_scenario({
        "name": "peer-fetch-narrated",
        "model": {"kv_bytes_per_token": 1000},
        "engine": {"kind": "vllm", "block_size": 4, "kv_cache_bytes": 400_000, "max_model_len": 1000,
                   "vllm_version": "0.33.0", "max_num_batched_tokens": 1000, "cpu_kv_bytes": cpu_kv_bytes,
                   "peer_fetch": peer_fetch,
                   "shared_link": {"bandwidth": 1e6, "latency_s": 0.001, "overhead_s": 0.002}},
        "workload": {"prefixes": 1, "prefix_tokens": 32, "tail_tokens": 8, "output_tokens": 3},
        "router": {"name": "round-robin"},
        "time_model": {"kind": "linear", "base_s": 0.01, "prefill_token_s": 0.001, "decode_seq_s": 0.002,
                       "host_link": {"bandwidth": 1e6, "latency_s": 0.001}},
        "cluster": {"workers": 2, "router_hop_s": 0.001},
    }, source="test")


def run(sc, sends):
    env = simpy.Environment()
    cluster = build_cluster(env, sc, build_router(sc))
    records = {}

    def send(at_s, req):
        yield env.timeout(at_s)
        records[req.request_id] = yield cluster.send(req)

    for at_s, req in sends:
        env.process(send(at_s, req))
    env.run()
    return records, cluster


def test_worker_1_pulls_worker_0s_host_blocks_then_loads_them():
    # Request 1 (8 shared + 2 own blocks) prefills on worker 0 (40 tokens, 0.05 s from 0.001) and its 10 prompt
    # blocks are written to worker 0's host tier.
    # Request 2 (the same 8 shared blocks, 2 own), sent at 0.3, goes to worker 1, whose GPU and host tier are empty:
    # 0.301   arrives; worker 0's host holds the 8 shared chunks (its run stops at request 2's own blocks): they are
    #         allocated in worker 1's host tier and the pull starts on its NIC: 0.002 + 0.032 + 0.001 -> 0.336.
    # 0.336   the pull is reported; the next lookup is a host hit of 32 tokens, loaded over PCIe from the end of
    #         that (empty) step: 0.001 + 0.032 -> 0.369.
    # 0.369   promoted; computes its 8 own tokens, 0.018 s -> first token at 0.387.
    records, cluster = run(scenario(), [(0.0, request(1, 8, 2)), (0.3, request(2, 8, 2))])
    r2 = records[2]
    assert r2.worker == 1 and r2.arrival_s == pytest.approx(0.301)
    assert (r2.cached_tokens, r2.cpu_cached_tokens) == (32, 32)
    assert r2.first_token_s == pytest.approx(0.387)
    w0, w1 = (c.engine for c in cluster.counters())
    assert (w0.cpu_stored_blocks, w0.peer_fetched_blocks) == (10, 0)
    assert (w1.peer_fetched_blocks, w1.cpu_loaded_blocks, w1.cpu_stored_blocks) == (8, 8, 2)
    held = cluster.workers[1].engine.connector.manager.ref_counts()
    assert sorted(h for h in held if h[0] == "shared") == [("shared", i) for i in range(8)]


def test_without_peer_fetch_worker_1_computes_the_prefix():
    # The same two requests: worker 1 computes all 40 tokens (0.05 s) from 0.301 -> first token at 0.351. On these
    # slow links the two copies (68 ms) cost more than the 32 tokens of prefill they save (32 ms).
    records, _ = run(scenario(peer_fetch=False), [(0.0, request(1, 8, 2)), (0.3, request(2, 8, 2))])
    assert records[2].cached_tokens == 0 and records[2].first_token_s == pytest.approx(0.351)
