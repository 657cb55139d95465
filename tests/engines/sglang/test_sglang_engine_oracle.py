"""kvsim's SGLang engine vs SGLang 0.5.23's own scheduler code, batch by batch.

* In CI: kvsim replays each stream of `sglang_engine_streams.STREAMS` and must reproduce the answer recorded from
  SGLang (tests/golden/sglang_engine/*.json) exactly: every batch (kind, requests with prefix and extend lengths,
  retractions, free slots, evictable/protected tree tokens, new_token_ratio, waiting queue), every request's
  cached_tokens, admission/first-token/finish batches, retractions and outputs, and the final tree.
* Opt-in (`-m sglang_oracle`, with KVSIM_SGLANG_PYTHON naming the SGLang venv's python, see
  benchmarks/oracles/sglang/README.md): the same against SGLang live; regenerate the golden files with
  `KVSIM_SGLANG_PYTHON=... python -m tests.support.sglang_engine_streams`.
"""

from __future__ import annotations

import pytest

from tests.support.oracle_support import check_golden, check_live
from tests.support.sglang_engine_streams import (
    ORACLE,
    ORACLE_SGLANG_VERSION,
    STREAMS,
    build_stream,
    differences,
    replay_kvsim,
)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_kvsim_sglang_engine_reproduces_recorded_sglang_answer(name):
    check_golden(ORACLE, name, build_stream(name), replay_kvsim, differences, ORACLE_SGLANG_VERSION)


def test_the_recorded_engine_streams_exercise_what_they_claim():
    answers = {n: ORACLE.golden(n)["answer"] for n in STREAMS}

    def cached(name):
        return [r["cached_tokens"] for r in answers[name]["requests"]]

    # one prompt per prefill batch: under overlap the second batch is formed before the first's result is in the
    # tree, so the second request misses too; without overlap only the first misses
    assert cached("one_pass_apart_overlap")[:3] == [0, 0, 2032]
    assert cached("one_pass_apart_normal")[:2] == [0, 2032]
    # requests admitted in one prefill batch do not hit each other (the tree learns a prompt after its pass)
    assert [r[1] for r in answers["same_prefix_overlap"]["batches"][0]["reqs"]] == [0, 0, 0]
    for name in ("pressure_retract", "pressure_retract_page16"):
        assert sum(len(b["retracted"]) for b in answers[name]["batches"]) >= 5, name
    assert any(len(r) == 3 and r[2] < 1000 for b in answers["chunked"]["batches"] if b["mode"] == "extend"
               for r in b["reqs"])
    assert all(c % 16 == 0 for c in cached("page16"))
    first = answers["lpm_fcfs_fallback"]["batches"][0]
    assert first["waiting"] + len(first["reqs"]) > 128  # lpm ordered more than 128 waiting requests: fcfs


@pytest.mark.sglang_oracle
@pytest.mark.parametrize("name", sorted(STREAMS))
def test_kvsim_sglang_engine_matches_live_sglang(name):
    check_live(ORACLE, build_stream(name), replay_kvsim, differences, ORACLE_SGLANG_VERSION)
