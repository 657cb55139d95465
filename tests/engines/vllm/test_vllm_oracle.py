"""kvsim vs vLLM's own scheduler and KV cache manager, block for block.

* In CI: kvsim replays each stream of `oracle_streams.STREAMS` and must reproduce the answer recorded from vLLM
  (tests/golden/vllm_oracle/*.json) exactly: every request's hit tokens, admission/first-token/finish steps and
  preemptions, every worker's prefix-cache counters, every worker's final free queue, and every worker's KV cache
  events (stored / removed, per step, in vLLM's emission order, each named by request and block index).
* Opt-in (`-m vllm_oracle`, with KVSIM_VLLM_PYTHON naming the oracle venv's python, see
  benchmarks/oracles/vllm/README.md): the same comparison against vLLM running live; the golden files are
  regenerated with `KVSIM_VLLM_PYTHON=... python -m tests.support.oracle_streams`.
"""

from __future__ import annotations

import pytest

from tests.support.oracle_streams import ORACLE, ORACLE_VLLM_VERSION, STREAMS, build_stream, differences, replay_kvsim
from tests.support.oracle_support import check_golden, check_live


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_kvsim_reproduces_recorded_vllm_answer(name):
    check_golden(ORACLE, name, build_stream(name), replay_kvsim, differences, ORACLE_VLLM_VERSION)


def test_the_recorded_streams_exercise_what_they_claim():
    answers = {n: ORACLE.golden(n)["answer"] for n in STREAMS}
    assert sum(r["num_preemptions"] for r in answers["pressure"]["requests"]) > 0
    edge = {r["id"]: r["hit_tokens"] for r in answers["edge_cases"]["requests"]}
    assert (edge["a_repeat"], edge["a_ext2"], edge["p_exact"]) == (2032, 2048, 2016)
    ref = answers["reference_n7_c8"]["requests"]
    assert 0 < sum(1 for r in ref if r["hit_tokens"]) < len(ref)
    # The events: a block-aligned resend stores its recomputed last block again (a duplicate), evictions happen
    # (and interleave with stores within a step), and a pass after a hit has a parent.
    edge_events = answers["edge_cases"]["events"][0]
    assert [1, "stored", 1, False, "a_repeat", 127] in edge_events
    for name in ("pressure", "reference_n7_c8"):
        rows = [r for w in answers[name]["events"] for r in w]
        assert any(r[1] == "removed" for r in rows) and any(r[1] == "stored" and not r[3] for r in rows)
        assert any(x[0] == y[0] and (x[1], y[1]) == ("removed", "stored")
                   for w in answers[name]["events"] for x, y in zip(w, w[1:]))


@pytest.mark.vllm_oracle
@pytest.mark.parametrize("name", sorted(STREAMS))
def test_kvsim_matches_live_vllm(name):
    check_live(ORACLE, build_stream(name), replay_kvsim, differences, ORACLE_VLLM_VERSION)
