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

from tests.support.sglang_tree_streams import SUITE


@pytest.mark.parametrize("name", SUITE.names)
def test_kvsim_tree_reproduces_recorded_sglang_answer(name):
    SUITE.check_golden(name)


def test_the_recorded_tree_streams_exercise_what_they_claim():
    answers = {n: SUITE.oracle.golden(n)["answer"] for n in SUITE.streams}
    edge = [r.get("prefix_len") for r in answers["edge_cases"]["results"]]
    assert edge[1] == 2032 and edge[4] == 1000 and edge[6] == 2037  # a split, a mid-prefix match, a run into a tail
    for name, answer in answers.items():
        if name != "edge_cases":
            assert sum(1 for r in answer["results"] if r.get("evicted")) > 20, name  # under pressure
    assert {SUITE.oracle.golden(n)["stream"] for n in SUITE.streams} == set(SUITE.streams)


@pytest.mark.sglang_oracle
@pytest.mark.parametrize("name", SUITE.names)
def test_kvsim_tree_matches_live_sglang(name):
    SUITE.check_live(name)
