"""Differential testing of kvsim's SGLang engine with HiCache against SGLang 0.5.23's own scheduler with its host
tier (`--enable-hierarchical-cache`), batch by batch: `sglang_engine_streams`' comparison (every batch, every
request, the final tree and pool), on streams whose prefixes do not all fit on the device, so that requests match
host-only prefixes, load them back at admission (or recompute a short host tail), and report them as
`cached_tokens_host`. SGLang's side is `engine_oracle.py` with `hicache`; every copy completes at once on CPU and is
acknowledged at the next scheduling pass, as kvsim's replay does here.
"""

from __future__ import annotations

from tests.support.oracle_support import StreamSuite
from tests.support.sglang_oracle import SGLANG_VERSION, sglang_oracle
from tests.support.sglang_engine_streams import DEFAULTS, _shared_prefix, differences, replay_kvsim

ORACLE = sglang_oracle("engine_oracle.py", "sglang_hicache_engine", answer_keys=("batches", "requests", "tree", "final"))


def _requests(seed: int):
    # 6 prefixes of 300-600 tokens in a 1,500-token pool: two or three fit on the device, the host holds the rest
    return lambda: _shared_prefix(seed=seed, requests=60, prefixes=6, prefix_tokens=(300, 600),
                                  tail_tokens=(5, 80), max_new=(4, 24))


STREAMS: dict[str, dict] = {
    "write_through_overlap": {"concurrency": 3, "max_total_tokens": 1500,
                              "hicache": {"write_policy": "write_through", "host_ratio": 3.0},
                              "requests": _requests(31)},
    "write_through_normal": {"concurrency": 3, "max_total_tokens": 1500, "disable_overlap_schedule": True,
                             "hicache": {"write_policy": "write_through", "host_ratio": 3.0},
                             "requests": _requests(31)},
    "selective_overlap": {"concurrency": 3, "max_total_tokens": 1500,
                          "hicache": {"write_policy": "write_through_selective", "host_ratio": 2.0},
                          "requests": _requests(32)},
    "write_back_overlap": {"concurrency": 3, "max_total_tokens": 1500,
                           "hicache": {"write_policy": "write_back", "host_ratio": 1.5},
                           "requests": _requests(33)},
    "write_back_normal_chunked": {"concurrency": 3, "max_total_tokens": 1500, "disable_overlap_schedule": True,
                                  "chunked_prefill_size": 256,
                                  "hicache": {"write_policy": "write_back", "host_ratio": 1.5},
                                  "requests": _requests(34)},
}


def build_stream(name: str) -> dict:
    # NOTE: the Python tree core: the Rust core's final tree is read back from device KV slots, so host-only nodes
    # have no path there (its batches and requests agree all the same: checked on the write_through streams)
    spec = {k: v for k, v in STREAMS[name].items() if k != "requests"}
    return {**DEFAULTS, "tree_cache": "unified-python", **spec, "requests": STREAMS[name]["requests"]()}


SUITE = StreamSuite(ORACLE, SGLANG_VERSION, STREAMS, build_stream, replay_kvsim, differences)
"""What tests/engines/sglang/test_sglang_hicache_engine_oracle.py checks, golden and live."""


if __name__ == "__main__":
    # Regenerate: KVSIM_SGLANG_PYTHON=<sglang venv>/bin/python python -m tests.support.sglang_hicache_engine_streams
    ORACLE.regenerate(STREAMS, build_stream)
