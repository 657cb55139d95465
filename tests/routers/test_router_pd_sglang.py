"""SGLang's PD router (`sglang-pd`), narrated on 2 prefill and 2 decode workers (cluster workers 0-1 and 2-3), with
the same 4-token blocks, linear time model (step = 0.01 s + 0.001 s per prefill token + 0.002 s per decode) and
1 MB/s link (a transfer of n tokens takes n ms) as the llm-d tests.

Both pools run `cache_aware` (the gateway's default --policy, one instance per pool): balanced loads and a match
rate <= 0.3 take the least-loaded worker, the first one on ties; a match above 0.3 takes the matched tenant."""

from __future__ import annotations

from tests.support.pd_cluster import pd_request, pd_scenario, run_pd


def scenario(**options):
    return pd_scenario({"name": "sglang-pd", "options": options}, name="sglang-pd-narrated")


def request(rid: int, prefix: str):
    """128 tokens of prefix `prefix` (32 blocks), then 16 tokens of its own."""
    return pd_request(rid, 32, 4, prefix=prefix)


def run(sc, sends, *, until: float | None = None):
    pd = run_pd(sc, sends, until=until)
    return pd.records, pd.router


def test_non_streaming_loads_count_both_workers_from_dispatch():
    # stream=false: request 1 (prefix a) at t=0: all loads 0, nothing matched -> prefill 0, decode 0 (first
    # minimum); both guards held from now to the response's end. Request 2 (prefix b) at t=0.01, request 1 still in
    # its prefill: loads (1, 0) on both pools -> prefill 1, decode 1.
    records, router = run(scenario(stream=False), [(0.0, request(1, "a")), (0.01, request(2, "b"))])
    assert [(r.pd_prefill_worker, r.worker) for r in (records[1], records[2])] == [(0, 2), (1, 3)]
    assert router.prefill.in_flight == [0, 0] and router.decode.in_flight == [0, 0]


def test_streaming_loads_start_when_the_prefill_is_back():
    # stream=true (the default): the guards come with the decode stream, after the prefill's response. Request 2 at
    # t=0.01 finds request 1 in its prefill and counted nowhere: loads (0, 0) -> prefill 0 and decode 0 again.
    records, router = run(scenario(), [(0.0, request(1, "a")), (0.01, request(2, "b"))], until=0.05)
    assert router.prefill.in_flight == [0, 0] and router.decode.in_flight == [0, 0]
    records, router = run(scenario(), [(0.0, request(1, "a")), (0.01, request(2, "b"))])
    assert [(r.pd_prefill_worker, r.worker) for r in (records[1], records[2])] == [(0, 2), (0, 2)]
    # during request 1's decode (its prefill was back at 0.154) both of its workers count it
    records, router = run(scenario(), [(0.0, request(1, "a"))], until=0.2)
    assert router.prefill.in_flight == [1, 0] and router.decode.in_flight == [1, 0]


def test_each_pool_follows_its_own_tree():
    # stream=false. Requests 1 (prefix a) and 2 (prefix b) as in the first test: a -> (0, 2), b -> (1, 3). Request 3
    # (prefix b) after both are done: match 128 of 144 tokens (0.89 > 0.3) in both trees -> the tenants of prefix b,
    # prefill 1 and decode 3, although worker 0 of each pool is first on ties.
    sends = [(0.0, request(1, "a")), (0.01, request(2, "b")), (2.0, request(3, "b"))]
    records, _ = run(scenario(stream=False), sends)
    assert (records[3].pd_prefill_worker, records[3].worker) == (1, 3)
    assert records[3].cached_tokens == 128  # prefill worker 1 holds prefix b


def test_other_policies_per_pool_and_never_a_local_prefill():
    # --prefill-policy round_robin, --decode-policy random: three requests go to prefill 0, 1, 0; every request is
    # prefilled on the prefill pool (the PD router has no decode-only path).
    sc = scenario(prefill_policy="round-robin", decode_policy="random")
    records, _ = run(sc, [(0.0, request(1, "a")), (1.0, request(2, "a")), (2.0, request(3, "a"))])
    assert [records[i].pd_prefill_worker for i in (1, 2, 3)] == [0, 1, 0]
    assert all(records[i].worker in (2, 3) and records[i].transfer_tokens > 0 for i in (1, 2, 3))
