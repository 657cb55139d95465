"""kvsim's radix tree vs SGLang 0.5.23's own `RadixCache`, operation by operation.

* In CI: kvsim replays each stream of `sglang_tree_streams.STREAMS` and must give exactly the answers recorded from
  SGLang (tests/golden/sglang_tree/*.json): every match and insert length, lock delta, evicted token count and
  evicted node (in order), the evictable/protected sizes after every operation, and the final tree.
* Opt-in (`-m sglang_oracle`, with KVSIM_SGLANG_PYTHON naming the SGLang venv's python, see
  benchmarks/oracles/sglang/README.md): the same against SGLang live; regenerate the golden files with
  `KVSIM_SGLANG_PYTHON=... python -m tests.support.sglang_tree_streams`.
"""

from __future__ import annotations

import pytest

from tests.support.oracle_support import check_golden, check_live
from tests.support.sglang_tree_streams import (
    ORACLE,
    ORACLE_SGLANG_VERSION,
    STREAMS,
    build_stream,
    differences,
    replay_kvsim,
)


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_kvsim_tree_reproduces_recorded_sglang_answer(name):
    check_golden(ORACLE, name, build_stream(name), replay_kvsim, differences, ORACLE_SGLANG_VERSION)


def test_the_recorded_tree_streams_exercise_what_they_claim():
    answers = {n: ORACLE.golden(n)["answer"] for n in STREAMS}
    edge = [r.get("prefix_len") for r in answers["edge_cases"]["results"]]
    assert edge[1] == 2032 and edge[4] == 1000 and edge[6] == 2037  # a split, a mid-prefix match, a run into a tail
    for name, answer in answers.items():
        if name != "edge_cases":
            assert sum(1 for r in answer["results"] if r.get("evicted")) > 20, name  # under pressure
    assert {ORACLE.golden(n)["stream"] for n in STREAMS} == set(STREAMS)


@pytest.mark.sglang_oracle
@pytest.mark.parametrize("name", sorted(STREAMS))
def test_kvsim_tree_matches_live_sglang(name):
    check_live(ORACLE, build_stream(name), replay_kvsim, differences, ORACLE_SGLANG_VERSION)
