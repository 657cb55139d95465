"""Narrated: a session's next turn finds exactly what the previous turn left cached, in both engines.

One worker, one session, turns sent one after another through the engine (`sim.workloads.sequence` builds them).
vLLM (block size 4) caches the full blocks of what it computed (`input + output - 1` tokens: the last sampled
token's KV is never computed) and a hit stops one token short of the prompt; SGLang (page size 1) inserts the
finished sequence's computed tokens into its radix tree, token-exact; at page size 4 it keeps whole pages.

    system prompt (group 0): 6 tokens        turn 0: system 6 + user 5 = 11 prompt tokens, 7 outputs
    turn 1: + output 7 + user 3 = 21 tokens  computed by turn 0: 11 + 7 - 1 = 17 tokens
"""

from __future__ import annotations

import pytest
import simpy

from sim.cluster.device import Device
from sim.cluster.worker import Worker
from sim.engines.sglang.engine import SglangEngine
from sim.engines.sglang.spec import SglangEngineSpec
from sim.engines.vllm.engine import VllmEngine
from sim.engines.vllm.spec import VllmEngineSpec
from sim.timing.linear import LinearStepTimeModel
from sim.workloads.sequence import TokenSequence

TM = LinearStepTimeModel(base_s=0.01, prefill_token_s=0.001, decode_seq_s=0.002)
B = 4


def _engine(kind: str, page_size: int = 1):
    if kind == "vllm":
        return VllmEngine(VllmEngineSpec(kv_cache_bytes=64 * B, block_size=B, vllm_version="0.33.0"),
                          kv_bytes_per_token=1)
    return SglangEngine(SglangEngineSpec(kv_cache_bytes=1, max_total_tokens=1_000, page_size=page_size,
                                         disable_overlap_schedule=True), kv_bytes_per_token=1)


class Serve:
    """One worker; `send(request)` serves it alone and returns its hit (cached tokens at admission)."""

    def __init__(self, engine) -> None:
        self.env = simpy.Environment()
        self.done = []
        self.worker = Worker(self.env, 0, engine, Device(self.env, "d"), TM, on_first_token=lambda s: None,
                             on_finished=self.done.append)

    def send(self, request) -> int:
        self.worker.submit(request, self.env.now)
        self.env.run()
        (state,) = [s for s in self.done if s.request is request]
        return state.num_cached_tokens


def _session(output0: int) -> tuple[TokenSequence, list]:
    seq = TokenSequence(("lineage", 0), block_size=B, system_key=("system", 0), system_tokens=6)
    seq.append(("user", 0), 5)
    turn0 = seq.request(0, output_tokens=output0, output_key=("out", 0), session_id=0, turn=0)
    seq.append(("user", 1), 3)
    turn1 = seq.request(1, output_tokens=2, output_key=("out", 1), session_id=0, turn=1)
    return seq, [turn0, turn1]


def test_the_requests_name_the_output_blocks_the_next_prompt_resends():
    _, (turn0, turn1) = _session(7)
    assert (turn0.prompt_tokens, turn1.prompt_tokens) == (11, 21)
    # turn 0's prompt: block 0 inside the system prompt (shared by the group), block 1 its own; its outputs fill
    # blocks 2 and 3 (tokens 8..15) and part of block 4, which turn 1's user message completes.
    assert turn0.block_hashes == ((("system", 0), 0), (("lineage", 0), 1))
    assert turn0.output_block_hashes == ((("lineage", 0), 2), (("lineage", 0), 3))
    assert turn1.block_hashes[:4] == turn0.block_hashes + turn0.output_block_hashes
    assert turn1.token_runs == ((("system", 0), 6), (("user", 0), 5), (("out", 0), 7), (("user", 1), 3))
    # What turn 0 left cacheable: 17 computed tokens, 4 whole blocks.
    assert (turn0.num_context_tokens, turn1.num_context_tokens) == (0, 16)


@pytest.mark.parametrize(("kind", "page_size", "expected"), [
    ("vllm", 1, 16),     # 4 full blocks of the 17 computed tokens (the 5th holds token 16, not yet full)
    ("sglang", 1, 17),   # every computed token: 11 + 7 - 1
    ("sglang", 4, 16),   # whole pages of them
])
def test_turn_1_hits_the_previous_prompt_and_output(kind, page_size, expected):
    _, (turn0, turn1) = _session(7)
    serve = Serve(_engine(kind, page_size))
    assert serve.send(turn0) == 0  # a cold cache
    assert serve.send(turn1) == expected


@pytest.mark.parametrize(("kind", "expected"), [("vllm", 12), ("sglang", 15)])
def test_the_last_sampled_token_is_never_cached(kind, expected):
    # Turn 0 ends block-aligned (11 + 5 = 16 tokens): block 3 holds the last output, whose KV is never computed,
    # so vLLM caches 3 blocks (12 tokens) and SGLang 15 tokens.
    _, (turn0, turn1) = _session(5)
    serve = Serve(_engine(kind))
    serve.send(turn0)
    assert turn1.num_context_tokens == 12
    assert serve.send(turn1) == expected


@pytest.mark.parametrize(("kind", "expected"), [("vllm", 4), ("sglang", 6)])
def test_a_truncated_history_keeps_only_the_system_prompt_cached(kind, expected):
    # The client drops turn 0 (user 0 and output 0): the prompt is the system prompt, then user 1, output 1 and
    # user 2. The prefix breaks right after the system prompt: vLLM keeps its one full block, SGLang its 6 tokens.
    seq, (turn0, turn1) = _session(7)
    serve = Serve(_engine(kind))
    serve.send(turn0)
    serve.send(turn1)
    seq.rewrite(("lineage", 0, "truncated", 1), [(("user", 1), 3), (("out", 1), 2)])
    seq.append(("user", 2), 4)
    turn2 = seq.request(2, output_tokens=2, output_key=("out", 2), session_id=0, turn=2)
    assert turn2.prompt_tokens == 6 + 3 + 2 + 4
    assert turn2.num_context_tokens == 4
    assert serve.send(turn2) == expected


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_a_forked_subagent_hits_its_parents_context(kind):
    # A subagent forks after turn 0: its prompt is turn 1's context (system, user 0, output 0) and a task of its
    # own, so it hits what turn 0 left cacheable; its own blocks are not the parent's.
    _, (turn0, _) = _session(7)
    serve = Serve(_engine(kind))
    serve.send(turn0)
    child = _fork_after_turn0()
    sub = child.request(5, output_tokens=3, output_key=("out", "sub"), session_id=1, turn=0)
    assert sub.block_hashes[:4] == turn0.block_hashes + turn0.output_block_hashes
    assert sub.block_hashes[4] == (("sub", 1), 4)
    assert serve.send(sub) == (16 if kind == "vllm" else 17)


def _fork_after_turn0() -> TokenSequence:
    seq = TokenSequence(("lineage", 0), block_size=B, system_key=("system", 0), system_tokens=6)
    seq.append(("user", 0), 5)
    seq.request(0, output_tokens=7, output_key=("out", 0), session_id=0, turn=0)
    child = seq.fork(("sub", 1))
    child.append(("task", 1), 6)
    return child


def test_the_host_tier_returns_the_previous_prompt_but_not_its_outputs():
    # vLLM's OffloadingConnector stores prompt chunks only (offload_prompt_only, its default): turn 0 (32 system +
    # 40 user = 72 tokens, 30 outputs) stores its 4 full prompt blocks. Two 150-token requests then evict it from
    # the 19-block GPU cache. Turn 1's context is 6 blocks (101 computed tokens); it loads the 4 prompt blocks
    # (64 tokens) from the host and recomputes the 2 output blocks.
    from sim.cluster.host_link import HostLinkQueue
    from sim.workloads.request import Request

    kv = 1024
    spec = VllmEngineSpec(kv_cache_bytes=20 * 16 * kv, cpu_kv_bytes=64 * 16 * kv, vllm_version="0.33.0")
    serve = Serve(VllmEngine(spec, kv_bytes_per_token=kv,
                             host_link=HostLinkQueue(bandwidth_bytes_per_s=16e6, latency_s=1e-3)))
    seq = TokenSequence(("lineage", 0), block_size=16, system_key=("system", 0), system_tokens=32)
    seq.append(("user", 0), 40)
    turn0 = seq.request(0, output_tokens=30, output_key=("out", 0), session_id=0, turn=0)
    seq.append(("user", 1), 20)
    turn1 = seq.request(1, output_tokens=5, output_key=("out", 1), session_id=0, turn=1)
    serve.send(turn0)
    assert serve.worker.engine.counters().cpu_stored_blocks == 4
    for i in range(2):
        serve.send(Request(10 + i, 150, 2, tuple(("flood", i, j) for j in range(150 // 16))))
    assert turn1.num_context_tokens == 96
    assert serve.send(turn1) == 64
    (state,) = [s for s in serve.done if s.request is turn1]
    assert state.num_cpu_hit_tokens == 64
