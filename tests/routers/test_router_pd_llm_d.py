"""llm-d's P/D routing (`llm-d-pd`), narrated on a cluster of 2 prefill and 2 decode workers (cluster workers 0-1 and
2-3), 4-token blocks, a linear time model (step = 0.01 s + 0.001 s per prefill token + 0.002 s per decode) and a
transfer link of 1 MB/s with no latency (1,000 KV bytes a token: a transfer of n tokens takes n ms).

The approximate prefix producer keys 64-token blocks (the engine's 4 tokens, floored at 64), so the prompts here are
a shared prefix of 128 tokens (two keys) and a tail of 16 tokens of their own (a partial key, never matched)."""

from __future__ import annotations

import pytest

from tests.support.pd_cluster import PdDriver, pd_request, pd_scenario


def scenario(**options):
    return pd_scenario({"name": "llm-d-pd", "options": options}, name="llm-d-pd-narrated")


def request(rid: int, prefix: str):
    """128 tokens of prefix `prefix` (32 blocks), then 16 tokens (4 blocks) of its own: 144 tokens."""
    return pd_request(rid, 32, 4, prefix=prefix)


def start(sc):
    pd = PdDriver(sc)
    return pd.env, pd.router, pd.records, pd.send


def test_the_decode_pod_is_chosen_first_and_booked_at_arrival():
    # The guide's profiles: decode by active-request-scorer, prefill by the affinity filter + token-load-scorer.
    # Request 1 at t=0 takes a decode pod (both idle: a random one) and is prefilled remotely (always-disagg).
    # Request 2 at t=0.01 arrives while request 1 is still in its prefill (a 144-token step: 0.154 s): request 1's
    # decode pod already counts it (one scheduling cycle books both pods), so request 2 takes the other decode pod,
    # and the other prefill pod too (request 1's 144 uncached tokens load the first one).
    env, router, records, send = start(scenario())
    send(0.0, request(1, "a"))
    send(0.01, request(2, "b"))
    env.run(until=0.05)
    assert sorted(router.decode.in_flight) == [1, 1]
    assert sorted(router.prefill.in_flight) == [1, 1]
    env.run()
    r1, r2 = records[1], records[2]
    assert {r1.worker, r2.worker} == {2, 3}
    assert {r1.pd_prefill_worker, r2.pd_prefill_worker} == {0, 1}
    assert (r1.transfer_tokens, r2.transfer_tokens) == (144, 144)


def test_the_prefill_pod_stays_in_flight_until_the_first_response_chunk():
    # Request 1 alone: prefill 0.154 s (its one token at 0.154); the transfer of 144 tokens ends at 0.298; the
    # decode pod recomputes the last token (0.011 s) -> first token at 0.309. The inflight-load producer releases the
    # prefill pod's entry at the first response chunk, not when the prefill pod is done. Its token count is the
    # producer's uncached estimate: 3 keys (two full, the partial last one counted whole) x 64 = 192.
    env, router, records, send = start(scenario())
    send(0.0, request(1, "a"))
    env.run(until=0.2)  # prefill done, transfer running
    p = router.prefill.in_flight.index(1)
    assert router.prefill._inflight_tokens[p] == 192
    env.run(until=0.31)  # first token out
    assert router.prefill.in_flight == [0, 0]
    assert router.prefill._inflight_tokens == [0, 0]
    assert sum(router.decode.in_flight) == 1  # the decode pod until the response's end
    env.run()
    assert records[1].first_token_s == pytest.approx(0.309)
    assert router.decode.in_flight == [0, 0]


def prefix_options(non_cached_tokens: int, **more):
    # a decode profile that follows the prefix (so that request 2 lands where request 1's prefix was recorded)
    return {"decider": "prefix", "non_cached_tokens": non_cached_tokens,
            "decode_options": {"prefix_cache_weight": 1.0, "queue_weight": 0.0, "kv_cache_utilization_weight": 0.0},
            **more}


def test_prefix_decider_prefills_a_short_uncached_suffix_on_the_decode_pod():
    # nonCachedTokens 32. Request 1 (cold): 144 - 0 >= 32 -> remote prefill, decode pod d. Request 2 (same prefix,
    # after request 1 is done) goes to d (its prefix score is 1 there); the approximate producer recorded request 1's
    # two 64-token keys on d, so the uncached suffix is 144 - 2 x 64 = 16 < 32 -> decode-only: d prefills it itself
    # (its engine hits the 128 tokens it received) and nothing is transferred.
    env, router, records, send = start(scenario(**prefix_options(32)))
    send(0.0, request(1, "a"))
    send(1.0, request(2, "a"))
    env.run()
    r1, r2 = records[1], records[2]
    assert r1.pd_prefill_worker in (0, 1) and r1.transfer_tokens == 144
    assert r2.worker == r1.worker
    assert r2.pd_prefill_worker == r2.worker  # prefilled locally on the decode pod
    assert (r2.cached_tokens, r2.transfer_tokens) == (128, 0)


def test_prefix_decider_disaggregates_a_long_uncached_suffix_and_is_off_at_zero():
    # nonCachedTokens 8: request 2's 16 uncached tokens are >= 8 -> remote prefill as well.
    env, router, records, send = start(scenario(**prefix_options(8)))
    send(0.0, request(1, "a"))
    send(1.0, request(2, "a"))
    env.run()
    assert records[2].pd_prefill_worker in (0, 1) and records[2].transfer_tokens == 16
    # nonCachedTokens 0 disables the decider (llm-d-router HEAD): every request is decode-only.
    env, router, records, send = start(scenario(**prefix_options(0)))
    send(0.0, request(1, "a"))
    env.run()
    assert records[1].pd_prefill_worker == records[1].worker and records[1].transfer_tokens == 0


def test_prefix_decider_prompt_gate():
    # promptTokens 200 > 144: too short to consider -> decode-only even though nothing is cached.
    env, router, records, send = start(scenario(**prefix_options(32, prompt_tokens=200)))
    send(0.0, request(1, "a"))
    env.run()
    assert records[1].pd_prefill_worker == records[1].worker
