"""The worker loop's wake-ups: a decode stretch's end resumes the loop in its timer's own processing when nothing else
is due at that instant, and behind whatever is (an arrival due at the very instant a stretch ends is seen first)."""

from __future__ import annotations

import simpy

from sim.cluster.device import Device
from sim.cluster.worker import Worker
from sim.engines.vllm.engine import VllmEngine
from sim.engines.vllm.spec import VllmEngineSpec
from sim.timing.linear import LinearStepTimeModel
from sim.workloads.request import Request

B = 4
TM = LinearStepTimeModel(base_s=0.01, prefill_token_s=0.001, decode_seq_s=0.002)


def _own(rid: int, prompt_tokens: int, output_tokens: int) -> Request:
    return Request(rid, prompt_tokens, output_tokens, tuple(("own", rid, i) for i in range(prompt_tokens // B)))


def _serve(late: tuple[float, Request] | None = None):
    """Requests 0 (30 outputs) and 1 (10 outputs) from 0 s on one worker, and `late` sent at its time in two hops (the
    second hop scheduled at half its time, after the worker's first stretch started, so that its arrival event comes
    after that stretch's timer in SimPy's order of events due at the same instant). Returns {id: (first token, finish)},
    the worker's steps and the SimPy events processed."""
    env = simpy.Environment()
    spec = VllmEngineSpec(kv_cache_bytes=1, num_gpu_blocks_override=64, block_size=B, vllm_version="0.33.0",
                          max_model_len=10_000)
    worker = Worker(env, 0, VllmEngine(spec, kv_bytes_per_token=1), Device(env, "d"), TM,
                    on_first_token=lambda s: None, on_finished=lambda s: None)
    states = [worker.submit(_own(0, 8, 30), 0.0), worker.submit(_own(1, 8, 10), 0.0)]

    def send(arrival_s: float, request: Request):
        yield env.timeout(arrival_s / 2)
        yield env.timeout(arrival_s / 2)
        assert env.now == arrival_s  # halves of a float add up to it exactly
        states.append(worker.submit(request, env.now))

    if late is not None:
        env.process(send(*late))
    processed = 0
    while env.peek() < float("inf"):
        env.step()
        processed += 1
    return {s.request.request_id: (s.first_token_s, s.finished_s) for s in states}, worker.num_steps, processed


def test_a_stretch_end_with_nothing_else_due_costs_no_event_of_its_own():
    # Step 1 prefills both prompts; the first stretch decodes both until request 1 samples its 10th token, the second
    # decodes request 0 alone to its 30th: two stretch timers, a prefill step, the worker's start, nothing else.
    times, steps, processed = _serve()
    assert steps == 30
    assert processed == 4  # the process's start, the prefill step, two stretch ends (no wake-up events)
    assert times[1][1] < times[0][1]


def test_an_arrival_due_the_instant_a_stretch_ends_is_seen_before_the_loop_resumes():
    # Request 2 arrives exactly when request 1 finishes (the first stretch's end). Its arrival event was scheduled
    # after the stretch's timer, so SimPy processes the timer first; the loop must still resume behind the arrival
    # (as a separate wake-up event would), so that the step right after the stretch admits request 2. Resumed at
    # once, the loop would start a stretch for request 0 alone, which request 2 then cuts after its first step.
    first = _serve()[0]
    stretch_end_s = first[1][1]
    times, steps, _processed = _serve((stretch_end_s, _own(2, 8, 4)))
    assert times[1] == first[1] and times[0][0] == first[0][0]
    prefill_s = TM.base_s + TM.prefill_token_s * 8 + TM.decode_seq_s * 1  # request 2's prompt beside request 0's decode
    assert abs(times[2][0] - (stretch_end_s + prefill_s)) < 1e-12
