"""kvsim's CPU KV tier vs vLLM 0.33.0's own OffloadingConnector (scheduler side, CPU manager, LRU and one ARC stream),
decision for decision.

* In CI: kvsim replays each stream of `offload_streams.STREAMS` and must reproduce the answer recorded from vLLM
  (tests/golden/vllm_offload/*.json) exactly: per request the GPU and CPU hit tokens, the load step, the steps it
  waited for its load or was deferred, admission, first token, finish and preemptions; per worker the GPU and
  connector prefix-cache counters, the allocation counters, the CPU tier's final LRU order (ARC: T1, T2, target), the GPU free queue and
  GPU KV events; per step every load, store, flush and eviction and the jobs handed to and reported by the worker.
* Opt-in (`-m vllm_oracle`, KVSIM_VLLM_PYTHON naming the oracle venv's python): the same against vLLM live;
  regenerate the golden files with `KVSIM_VLLM_PYTHON=... python -m tests.support.offload_streams`.
"""

from __future__ import annotations

import pytest

from tests.support.offload_streams import ORACLE, STREAMS, build_stream, differences, replay_kvsim
from tests.support.oracle_streams import ORACLE_VLLM_VERSION
from tests.support.oracle_support import check_golden, check_live


@pytest.mark.parametrize("name", STREAMS)
def test_kvsim_reproduces_recorded_vllm_offloading(name):
    check_golden(ORACLE, name, build_stream(name), replay_kvsim, differences, ORACLE_VLLM_VERSION)


def test_the_recorded_streams_exercise_what_they_claim():
    answers = {n: ORACLE.golden(n)["answer"] for n in STREAMS}

    def rows(name):
        return [r for w in answers[name]["offload_steps"] for r in w]

    slow = {r["id"]: r for r in answers["block_aligned_slow_transfers"]["requests"]}
    assert slow["B2"]["deferred_steps"] and (slow["B2"]["gpu_hit_tokens"], slow["B2"]["cpu_hit_tokens"]) == (48, 16)
    assert any(r["jobs_to_flush"] for r in rows("flush_and_full_tier"))
    assert answers["flush_and_full_tier"]["workers"][0]["kv_connector_stats"].get(
        "vllm:kv_offload_allocation_failure", 0) > 0
    for name in ("reference_n12_c8_3w", "reference_n12_c8_3w_slow", "pressure"):
        reqs = answers[name]["requests"]
        assert sum(1 for r in reqs if r["cpu_hit_tokens"]) > 5, name
        assert any(r["evicted"] for r in rows(name)), name
    assert sum(r["num_preemptions"] for r in answers["pressure"]["requests"]) > 0
    # ARC: CPU hits, evictions, chunks reused into T2 and the target moved off 0 on both workers.
    arc = answers["pressure_arc"]
    assert sum(1 for r in arc["requests"] if r["cpu_hit_tokens"]) > 5
    assert any(r["evicted"] for r in rows("pressure_arc"))
    assert all(w["cpu_resident_end"]["t2"] and w["cpu_resident_end"]["target_t1_size"] > 0 for w in arc["workers"])
    assert any(r["deferred_steps"] for r in answers["reference_n12_c8_3w_slow"]["requests"])


@pytest.mark.vllm_oracle
@pytest.mark.parametrize("name", STREAMS)
def test_kvsim_matches_live_vllm_offloading(name):
    check_live(ORACLE, build_stream(name), replay_kvsim, differences, ORACLE_VLLM_VERSION)
