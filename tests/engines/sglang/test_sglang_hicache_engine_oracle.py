"""kvsim's SGLang engine with HiCache vs SGLang 0.5.23's own scheduler with its host tier, batch by batch.

* In CI: kvsim's scheduler replays each stream of `sglang_hicache_engine_streams.STREAMS` and must give exactly the
  answers recorded from SGLang (tests/golden/sglang_hicache_engine/*.json): every batch (its requests with prefix
  and extend lengths, free slots, evictable and protected tokens, ratio, queue), every request (`cached_tokens`,
  `cached_tokens_host`, the batches that admitted, answered and finished it), the final tree and pool.
* Opt-in (`-m sglang_oracle`, with KVSIM_SGLANG_PYTHON): the same against SGLang live; regenerate the golden files
  with `KVSIM_SGLANG_PYTHON=... python -m tests.support.sglang_hicache_engine_streams`.
"""

from __future__ import annotations

import pytest

from tests.support.sglang_hicache_engine_streams import SUITE


@pytest.mark.parametrize("name", SUITE.names)
def test_kvsim_engine_with_hicache_reproduces_recorded_sglang_answer(name):
    SUITE.check_golden(name)


def test_the_recorded_hicache_engine_streams_load_from_the_host():
    for name in SUITE.streams:
        requests = SUITE.oracle.golden(name)["answer"]["requests"]
        host = [r["cached_tokens_host"] for r in requests]
        assert sum(1 for h in host if h) >= 15, name                         # many requests loaded a host prefix
        assert all(0 <= h <= r["cached_tokens"] for h, r in zip(host, requests)), name


@pytest.mark.sglang_oracle
@pytest.mark.parametrize("name", SUITE.names)
def test_kvsim_engine_with_hicache_matches_sglang_live(name):
    SUITE.check_live(name)
