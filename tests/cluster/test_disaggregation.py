"""P/D disaggregation, narrated with exact times on a linear time model (step = 0.01 s + 0.001 s per prefill token
+ 0.002 s per decode), 4-token blocks, 1,000 KV bytes per token, a router hop of 1 ms, and a transfer link of
1 MB/s with 1 ms latency and 2 ms per-transfer overhead (a transfer of n tokens: 0.003 s + n x 0.001 s).

One prefill worker (cluster worker 0) and one decode worker (cluster worker 1)."""

from __future__ import annotations

import pytest
import simpy

from sim.runner import build_cluster, build_pd_router
from sim.scenario import ScenarioError
from tests.support.pd_cluster import pd_request, pd_scenario, run_pd


def scenario(router: dict | None = None, engine: str = "vllm", **cluster):
    return pd_scenario(router or {"name": "dynamo-disagg"}, name="pd-narrated", prefill_workers=1, decode_workers=1,
                       link={"bandwidth_bytes_per_s": 1e6, "latency_s": 0.001, "overhead_s": 0.002}, engine=engine,
                       router_hop_s=0.001, **cluster)


def request(rid: int, shared_blocks: int, own_blocks: int):
    """A prompt of `shared_blocks` blocks every request shares, then `own_blocks` of its own."""
    return pd_request(rid, shared_blocks, own_blocks)


def run(sc, sends):
    """Send each (time, request) and return the records by request id, and the cluster."""
    pd = run_pd(sc, sends)
    return pd.records, pd.cluster


def test_a_request_prefills_moves_its_kv_and_decodes():
    # t=0     sent; hop 1 ms -> the prefill worker at 0.001: one step of 40 prefill tokens, 0.05 s -> its one
    #         token at 0.051 (the prefill request ends there).
    # 0.051   the router picks the decode worker; hop -> the decode worker at 0.052: no local hit, so the whole
    #         prompt (40 tokens) is received: 0.003 + 0.040 -> done at 0.095 (the request holds 10 blocks meanwhile).
    # 0.095   promoted: 40 tokens computed, the last one recomputed (a 1-token prefill step, 0.011 s) -> first
    #         token at 0.106; two decode steps of 0.012 s -> done at 0.130.
    records, _ = run(scenario(), [(0.0, request(1, 8, 2))])
    r = records[1]
    assert (r.worker, r.pd_prefill_worker) == (1, 0)
    assert r.arrival_s == pytest.approx(0.052)
    assert r.first_token_s == pytest.approx(0.106)
    assert r.finished_s == pytest.approx(0.130)
    assert (r.cached_tokens, r.transfer_tokens) == (0, 40)
    assert r.ttft_queue_s == pytest.approx(0.0)
    assert r.ttft_prefill_s == pytest.approx(0.050)
    assert r.ttft_transfer_s == pytest.approx(0.043)
    # the rest of the TTFT: two hops (0.002) and the decode worker's last-token step (0.011)
    assert r.ttft_s - r.ttft_queue_s - r.ttft_prefill_s - r.ttft_transfer_s == pytest.approx(0.013)


def test_the_decode_worker_keeps_what_it_received_as_cached_prefix():
    # Request 1 as above leaves its 10 prompt blocks cached on both workers. Request 2 (sent at 0.2) shares the
    # first 8 blocks: the prefill worker hits 32 tokens and computes 8 (0.018 s: token at 0.219); the decode
    # worker (at 0.220) hits the same 32 tokens in what it received, so only 8 tokens move: 0.003 + 0.008 -> done
    # at 0.231; the last token's step -> first token at 0.242.
    records, cluster = run(scenario(), [(0.0, request(1, 8, 2)), (0.2, request(2, 8, 2))])
    r = records[2]
    assert (r.cached_tokens, r.transfer_tokens) == (32, 8)
    assert r.ttft_prefill_s == pytest.approx(0.018)
    assert r.ttft_transfer_s == pytest.approx(0.011)
    assert r.first_token_s == pytest.approx(0.242)
    decode_stats = cluster.counters()[1].engine.prefix_cache
    # vLLM's prefix-cache counters on the decode worker count its local lookups: 0 of 40, then 32 of 40.
    assert (decode_stats.requests, decode_stats.queries, decode_stats.hits) == (2, 80, 32)
    assert cluster.workers[1].engine.cache.peek_prefix_tokens(request(3, 8, 0)) == 32


def test_the_prefill_worker_keeps_its_blocks_until_the_decode_side_has_read_them():
    # A prefill worker of 12 blocks (11 usable) and two 40-token prompts of their own, both sent at 0: request 1
    # takes 10 blocks (+1 for its token) and request 2 does not fit. Request 1's token comes at 0.051 but its blocks
    # stay held (NIXL's delay_free_blocks) until the decode worker has read them at 0.095 (as in the first test):
    # only then is request 2 admitted (queued 0.094 s), prefilled by 0.145, its 40 tokens read by 0.189 (hop 1 ms:
    # from 0.146), and its last token computed by 0.200. Freed at its token, request 2 would have started at 0.051.
    sc = scenario(disaggregation={"prefill": {"workers": 1, "engine": {"num_gpu_blocks_override": 12}},
                                  "decode": {"workers": 1},
                                  "link": {"bandwidth_bytes_per_s": 1e6, "latency_s": 0.001, "overhead_s": 0.002}})
    records, cluster = run(sc, [(0.0, request(1, 0, 10)), (0.0, request(2, 0, 10))])
    assert records[1].first_token_s == pytest.approx(0.106)
    assert records[2].ttft_queue_s == pytest.approx(0.094)
    assert records[2].first_token_s == pytest.approx(0.200)
    # both released: the prefill worker holds nothing, its blocks are cached and evictable
    assert cluster.workers[0].engine.scheduler.num_held_requests == 0
    assert cluster.workers[0].engine.cache.usage() == 0.0


def test_conditional_disaggregation_prefills_a_short_uncached_part_locally():
    # With conditional disaggregation (Dynamo's IslBounding: net-new < 2048 tokens and < 0.7 of the prompt on the
    # decode worker the decode router would pick): request 1 finds nothing on the decode worker (net-new 40 of 40,
    # ratio 1.0) and goes remote as above; request 2 finds 32 of 40 there (net-new 8, ratio 0.2) and is prefilled
    # on the decode worker itself: at 0.201, 8 tokens in one step (0.018 s) -> first token at 0.219, no transfer.
    sc = scenario({"name": "dynamo-disagg", "options": {"conditional_disagg": True}})
    records, cluster = run(sc, [(0.0, request(1, 8, 2)), (0.2, request(2, 8, 2))])
    assert (records[1].pd_prefill_worker, records[1].transfer_tokens) == (0, 40)
    r = records[2]
    assert (r.worker, r.pd_prefill_worker, r.transfer_tokens) == (1, 1, 0)
    assert r.cached_tokens == 32
    assert r.first_token_s == pytest.approx(0.219)
    assert r.ttft_transfer_s == 0.0
    # the prefill worker saw only request 1
    assert cluster.counters()[0].engine.prefix_cache.requests == 1


def test_conditional_disaggregation_keeps_a_long_uncached_part_remote():
    # The same two requests with eff_isl_threshold 8: request 2's net-new 8 tokens are not < 8, so it goes remote.
    sc = scenario({"name": "dynamo-disagg", "options": {"conditional_disagg": True, "eff_isl_threshold": 8}})
    records, _ = run(sc, [(0.0, request(1, 8, 2)), (0.2, request(2, 8, 2))])
    assert (records[2].pd_prefill_worker, records[2].transfer_tokens) == (0, 8)
    assert records[2].first_token_s == pytest.approx(0.242)


def test_an_aggregated_router_routes_each_pool():
    # round-robin on a 1 + 2 cluster: prefill always worker 0, decode workers 1, 2, 1 in turn.
    sc = scenario({"name": "round-robin"}, workers=3,
                  disaggregation={"prefill": {"workers": 1}, "decode": {"workers": 2}})
    records, _ = run(sc, [(0.0, request(1, 8, 2)), (0.3, request(2, 8, 2)), (0.6, request(3, 8, 2))])
    assert [(records[i].pd_prefill_worker, records[i].worker) for i in (1, 2, 3)] == [(0, 1), (0, 2), (0, 1)]


def test_the_request_overhead_is_paid_once_on_the_way_in():
    # With a 4 ms per-request overhead (HTTP, tokenisation) the prefill worker gets the request at 0.005 and every
    # later time of the first test moves by 4 ms: the decode hop carries a tokenised request and pays the hop only.
    records, _ = run(scenario(request_overhead_s=0.004), [(0.0, request(1, 8, 2))])
    assert records[1].arrival_s == pytest.approx(0.056)
    assert records[1].first_token_s == pytest.approx(0.110)


def test_a_decode_worker_chosen_at_arrival_is_kept():
    # pd-stages with decode_after_prefill false (SGLang's and llm-d's order): both workers are chosen when the
    # request arrives. Request 1 (40 uncached tokens, prefill 0.05 s) and request 2 (4 tokens, 0.014 s) arrive
    # together on two prefill workers: request 2 finishes its prefill first, yet the decode workers are those of
    # arrival order (1 -> decode 0, 2 -> decode 1), as round robin handed them out then.
    sc = scenario({"name": "pd-stages", "options": {"prefill_router": "round-robin", "decode_router": "round-robin",
                                                     "decode_after_prefill": False}},
                  workers=4, disaggregation={"prefill": {"workers": 2}, "decode": {"workers": 2}})
    records, _ = run(sc, [(0.0, request(1, 0, 10)), (0.0, request(2, 0, 1))])
    assert [(records[i].pd_prefill_worker, records[i].worker) for i in (1, 2)] == [(0, 2), (1, 3)]
    assert records[2].ttft_prefill_s == pytest.approx(0.014)
    # chosen after the prefill instead (the default), request 2 would have taken decode worker 0
    sc = scenario({"name": "pd-stages", "options": {"prefill_router": "round-robin", "decode_router": "round-robin"}},
                  workers=4, disaggregation={"prefill": {"workers": 2}, "decode": {"workers": 2}})
    records, _ = run(sc, [(0.0, request(1, 0, 10)), (0.0, request(2, 0, 1))])
    assert [(records[i].pd_prefill_worker, records[i].worker) for i in (1, 2)] == [(0, 3), (1, 2)]


def test_sglang_decodes_from_the_prefill_servers_token_and_keeps_nothing():
    # SGLang 0.5.23 (overlap scheduling, page 1), the same two requests. Request 1: prefill 0.05 s -> its token at
    # 0.051; at the decode worker at 0.052 its 40 slots are preallocated and the whole prompt moves (no decode
    # radix cache by default): 0.043 s -> 0.095, where it joins the running batch with the prefill server's token
    # as its first (no forward pass, no recomputed token): TTFT 0.095; two decode steps -> done at 0.119.
    # Request 2 hits 32 tokens on the prefill worker (0.018 s: token at 0.219) but nothing on the decode worker,
    # whose finished requests were freed, not cached: all 40 tokens move again (0.220 -> 0.263).
    records, cluster = run(scenario(engine="sglang"), [(0.0, request(1, 8, 2)), (0.2, request(2, 8, 2))])
    r1, r2 = records[1], records[2]
    assert (r1.worker, r1.pd_prefill_worker, r1.cached_tokens, r1.transfer_tokens) == (1, 0, 0, 40)
    assert (r1.first_token_s, r1.finished_s) == (pytest.approx(0.095), pytest.approx(0.119))
    assert (r1.ttft_prefill_s, r1.ttft_transfer_s) == (pytest.approx(0.050), pytest.approx(0.043))
    assert (r2.cached_tokens, r2.transfer_tokens) == (32, 40)
    assert r2.first_token_s == pytest.approx(0.263)
    assert cluster.workers[1].engine.cache.peek_prefix_tokens(request(3, 8, 0)) == 0
    # the prefill worker released what it held, and keeps request 1's and 2's prompts cached
    assert not cluster.workers[0].engine.scheduler.held
    assert cluster.workers[0].engine.cache.peek_prefix_tokens(request(2, 8, 2)) == 40


def test_sglangs_prefill_server_holds_its_kv_until_the_transfer():
    # SGLang's prefill server keeps a finished request's KV locked in its tree (disagg_prefill_inflight_queue) until
    # the decode side has it: at 0.07 (request 1's token at 0.051, transfer until 0.095) its 40 tokens are protected
    # (token usage 40 / 400 slots); after the transfer they are evictable (usage 0).
    sc = scenario(engine="sglang")
    env_records = {}
    env = simpy.Environment()
    cluster = build_cluster(env, sc, build_pd_router(sc))
    usage = {}

    def probe(at_s):
        yield env.timeout(at_s)
        usage[at_s] = cluster.workers[0].engine.cache.usage()

    env.process(probe(0.07))
    env.process(probe(0.2))
    cluster.send(request(1, 8, 2), env_records.setdefault)
    env.run()
    assert usage == {0.07: pytest.approx(0.1), 0.2: 0.0}


def test_a_layerwise_transfer_leaves_only_the_last_layer_to_move():
    # With 4 layers (an architecture whose KV is 1,000 bytes a token), layer-wise streaming leaves 250 bytes a token
    # to move after the prefill: 40 tokens take 0.003 + 0.010 s instead of 0.043 s (0.052 -> 0.065), then the
    # last-token step -> first token at 0.076.
    arch = {"num_hidden_layers": 4, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1,
            "head_dim": 125, "intermediate_size": 128, "vocab_size": 100, "dtype_bytes": 1}
    data = scenario().model_dump()
    data["model"]["architecture"] = arch
    data["cluster"]["disaggregation"]["link"]["layerwise"] = True
    from sim.scenario import validate_scenario as validate
    records, _ = run(validate(data, source="test"), [(0.0, request(1, 8, 2))])
    assert records[1].ttft_transfer_s == pytest.approx(0.013)
    assert records[1].first_token_s == pytest.approx(0.076)
    data["model"]["architecture"] = None
    with pytest.raises(ScenarioError, match="layerwise needs model.architecture"):
        validate(data, source="test")


def test_pools_must_add_up():
    with pytest.raises(ScenarioError, match=r"cluster.workers \(3\) must equal"):
        scenario(workers=3)
