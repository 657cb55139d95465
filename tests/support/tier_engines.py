"""Driving one vLLM engine with KV tiers by hand, for the narrated tier tests (shared store, peer fetch): requests of
16-token blocks named (prefix, i), steps of a fixed `STEP_S` plus the step's stall, background copies awaited."""

from __future__ import annotations

from sim.engines.vllm.engine import VllmEngine
from sim.workloads.request import Request

KV = 1024  # KV bytes per token: a 16-token block is 16 KiB
BLOCK_BYTES = 16 * KV
STEP_S = 0.010


def request(rid: int, tokens: int, *, prefix: int, output: int = 2) -> Request:
    return Request(request_id=rid, prompt_tokens=tokens, output_tokens=output,
                   block_hashes=tuple((prefix, i) for i in range(tokens // 16)))


def step(engine: VllmEngine, now_s: float):
    """One engine step from `now_s`: (its end, its plan); an empty plan takes no time."""
    plan = engine.schedule(now_s)
    if plan.is_empty:
        return now_s, plan
    end = now_s + plan.stall_s + STEP_S
    engine.update_from_output(plan, end)
    return end, plan


def drain(engine: VllmEngine, t: float) -> float:
    """Step until the engine has no work, sleeping to its next background completion when only copies are in
    flight; returns the time it went idle."""
    while engine.has_work:
        t, plan = step(engine, t)
        if plan.is_empty and engine.has_work:
            t = max(t, engine.next_background_s())
    return t


def serve(engine: VllmEngine, rid: int, tokens: int, prefix: int, t: float):
    """Add one request at `t` and drain: (its state, the time the engine went idle)."""
    state = engine.add_request(request(rid, tokens, prefix=prefix), worker=0, arrival_s=t)
    return state, drain(engine, t)
