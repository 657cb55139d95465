"""Tiny sessions scenarios for the workload tests: one vLLM or SGLang worker (or a few), blocks of 16 tokens, every
length a whole number of blocks unless a test says otherwise, a linear time model."""

from __future__ import annotations

from typing import Any

from sim.scenario import Scenario, validate_scenario

BASE: dict[str, Any] = {
    "name": "tiny-sessions",
    "seed": 3,
    "model": {"name": "tiny", "kv_bytes_per_token": 1},
    "engine": {"kind": "vllm", "block_size": 16, "kv_cache_bytes": 16 * 4096, "max_num_batched_tokens": 2048,
               "max_num_seqs": 64, "max_model_len": 8192},
    "router": {"name": "random"},
    "cluster": {"workers": 1},
    "time_model": {"base_s": 0.01, "prefill_token_s": 0.0001, "decode_seq_s": 0.002},
}


def sessions_scenario(engine: str = "vllm", workers: int = 1, seed: int = 3, **workload: Any) -> Scenario:
    """A scenario of `BASE` with the sessions workload `workload` (kind sessions added), on `engine` (SGLang at
    page size 1: token-exact)."""
    data = {**BASE, "seed": seed, "cluster": {"workers": workers},
            "workload": {"kind": "sessions", **workload}}
    if engine == "sglang":
        data["engine"] = {"kind": "sglang", "page_size": 1, "block_size": 16, "kv_cache_bytes": 16 * 4096,
                          "max_model_len": 8192, "disable_overlap_schedule": True}
    return validate_scenario(data, source="test")


CHAT: dict[str, Any] = {"style": "chat", "sessions": 2, "concurrent_sessions": 1, "system_tokens": 32,
                        "turns": 4, "user_tokens": 16, "output_tokens": 16, "think_time_s": 2.0}
"""Two chats one after the other, 4 turns each: system 32, user 16, output 16 tokens; 2 s think times."""
