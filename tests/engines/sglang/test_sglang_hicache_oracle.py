"""kvsim's HiCache tree (`HiRadixCache`) vs SGLang 0.5.23's own `UnifiedRadixCache` with its host tier, op by op.

* In CI: kvsim replays each stream of `sglang_hicache_streams.STREAMS` and must give exactly the answers recorded from
  SGLang (tests/golden/sglang_hicache/*.json): inserted and matched lengths (device and host), lock deltas, device
  tokens evicted, tokens loaded back, the evictable / protected device sizes and free host slots after every
  operation, and the final tree with every node's tiers.
* Opt-in (`-m sglang_oracle`, with KVSIM_SGLANG_PYTHON naming the SGLang venv's python, see
  benchmarks/oracles/sglang/README.md): the same against SGLang live; regenerate the golden files with
  `KVSIM_SGLANG_PYTHON=... python -m tests.support.sglang_hicache_streams`.
"""

from __future__ import annotations

import pytest

from tests.support.sglang_hicache_streams import SUITE


@pytest.mark.parametrize("name", SUITE.names)
def test_kvsim_hicache_reproduces_recorded_sglang_answer(name):
    SUITE.check_golden(name)


def test_the_recorded_hicache_streams_exercise_what_they_claim():
    answers = {n: SUITE.oracle.golden(n)["answer"] for n in SUITE.streams}
    for name, answer in answers.items():
        results = answer["results"]
        assert any(r.get("host") for r in results), name                       # host hits
        assert any(r.get("evicted") for r in results), name                    # device eviction
        if name.startswith(("lifecycle", "host_pressure", "page4")):
            assert sum(1 for r in results if r.get("loaded")) >= 5, name      # load-backs
        if name != "lifecycle_selective" and name.startswith(("lifecycle", "host_pressure", "page4")):
            assert min(r["host_available"] for r in results) <= 16, name      # a host under pressure
    # write_through_selective: the narrated prefix is deleted on its first eviction (no host hit), then backed up
    narrated = answers["narrated_selective"]["results"]
    assert narrated[3] == {"device": 0, "host": 0, "evictable": 0, "protected": 0, "host_available": 129}
    assert {SUITE.oracle.golden(n)["stream"] for n in SUITE.streams} == set(SUITE.streams)


@pytest.mark.sglang_oracle
@pytest.mark.parametrize("name", SUITE.names)
def test_kvsim_hicache_matches_sglang_live(name):
    SUITE.check_live(name)
