"""Exact times on tiny scenarios: the step-time model, device sharing, TTFT and the router hop."""

from __future__ import annotations

import pytest
import simpy

from sim.cluster.device import Device
from sim.cluster.worker import Worker
from sim.engines.interface import StepPlan
from sim.engines.vllm.engine import VllmEngine
from sim.engines.vllm.spec import VllmEngineSpec
from sim.results.records import RequestRecord
from sim.timing.linear import LinearStepTimeModel
from sim.workloads.request import Request

TM = LinearStepTimeModel(base_s=0.01, prefill_token_s=0.001, decode_seq_s=0.002)


def test_linear_step_time():
    plan = StepPlan(num_prefill_tokens=100, num_decode_seqs=3, num_decode_context_tokens=50,
                    num_prefill_attention_pairs=2000)
    tm = LinearStepTimeModel(base_s=0.01, prefill_token_s=0.001, decode_seq_s=0.002, decode_context_token_s=1e-4,
                             prefill_attention_pair_s=1e-6)
    assert tm.step_seconds(plan) == pytest.approx(0.01 + 0.1 + 0.006 + 0.005 + 0.002)


def test_device_alone_takes_work_over_speed():
    env = simpy.Environment()
    dev = Device(env, "d", speed=2.0, num_workers=1)
    done = []
    env.process(_job(env, dev, 1.0, done, "a"))
    env.run()
    assert done == [("a", 0.5)]


def test_two_steps_share_a_device_by_processor_sharing():
    # Device speed 1, two workers. A needs 1.0 s of work from t=0, B 0.2 s from t=0.1.
    # 0.0-0.1: A alone (0.1 done). 0.1-0.5: both at half speed (B done at 0.5, A has 0.3 done).
    # 0.5-1.2: A alone for its last 0.7 s: A finishes at 1.2 instead of 1.0.
    env = simpy.Environment()
    dev = Device(env, "d", speed=1.0, num_workers=2)
    done = []
    env.process(_job(env, dev, 1.0, done, "a"))
    env.process(_job(env, dev, 0.2, done, "b", start=0.1))
    env.run()
    assert [n for n, _ in done] == ["b", "a"]
    assert done[0][1] == pytest.approx(0.5) and done[1][1] == pytest.approx(1.2)


def test_sharing_efficiency_slows_concurrent_steps():
    # Two equal 1 s steps together at efficiency 0.8: each runs at 0.4, both done at 2.5 s.
    env = simpy.Environment()
    dev = Device(env, "d", speed=1.0, sharing_efficiency=0.8, num_workers=2)
    done = []
    env.process(_job(env, dev, 1.0, done, "a"))
    env.process(_job(env, dev, 1.0, done, "b"))
    env.run()
    assert [t for _, t in done] == [pytest.approx(2.5), pytest.approx(2.5)]


def _job(env, dev, work, done, name, start=0.0):
    if start:
        yield env.timeout(start)
    yield dev.run(work)
    done.append((name, env.now))


def _worker(env, device, *, budget=1000, index=0, events=None):
    spec = VllmEngineSpec(vllm_version="0.33.0", block_size=4, kv_cache_bytes=1, num_gpu_blocks_override=400,
                          max_num_batched_tokens=budget, max_num_seqs=16, max_model_len=10_000)
    events = events if events is not None else []
    w = Worker(env, index, VllmEngine(spec, kv_bytes_per_token=1), device, TM,
               on_first_token=lambda s: events.append(("first", s.request.request_id, env.now)),
               on_finished=lambda s: events.append(("done", s.request.request_id, env.now)))
    return w, events


def _request(rid, prompt, out):
    return Request(rid, prompt, out, tuple(("o", rid, i) for i in range(prompt // 4)))


def test_ttft_is_the_prefill_step_and_decode_steps_follow():
    # Prompt 40 tokens, 3 outputs: step 1 prefill 0.01 + 0.040 = 0.05 s (first token), then 2 decode steps of
    # 0.01 + 0.002 = 0.012 s each: done at 0.074 s.
    env = simpy.Environment()
    w, events = _worker(env, Device(env, "d"))
    w.submit(_request(1, 40, 3), env.now)
    env.run()
    assert events == [("first", 1, pytest.approx(0.05)), ("done", 1, pytest.approx(0.074))]


def test_a_long_prefill_on_a_shared_device_stretches_the_other_workers_decode_steps():
    # Two workers on one device (speed 1). Worker 0 decodes a request (steps of 0.012 s alone); worker 1 starts
    # a 1,000-token prefill (1.01 s of work) at t=0 too. While both run, each gets half the device: worker 0's
    # decode steps take 0.024 s. Its request (1 prefill step + 4 decode steps) ends at 2 x (0.014 + 4 x 0.012).
    env = simpy.Environment()
    dev = Device(env, "gpu", num_workers=2)
    w0, ev0 = _worker(env, dev, index=0)
    w1, ev1 = _worker(env, dev, index=1)
    w0.submit(_request(1, 4, 5), env.now)
    w1.submit(_request(2, 1000, 1), env.now)
    env.run()
    assert ev0[-1] == ("done", 1, pytest.approx(2 * (0.014 + 4 * 0.012)))
    # Worker 1's prefill: 0.124 s at half speed covers 0.062 s of its work; the remaining 0.948 s alone.
    assert ev1[-1] == ("done", 2, pytest.approx(0.124 + (1.01 - 0.062)))


def test_a_two_core_device_runs_two_steps_at_full_speed_and_time_slices_a_third():
    # Three 1 s steps on a 2-core device: each runs at 2/3 speed while all three are in flight: done at 1.5 s.
    env = simpy.Environment()
    dev = Device(env, "cpu", speed=1.0, num_workers=3, cores=2)
    done = []
    for name in "abc":
        env.process(_job(env, dev, 1.0, done, name))
    env.run()
    assert [t for _, t in done] == [pytest.approx(1.5)] * 3
    env = simpy.Environment()
    dev = Device(env, "cpu", speed=1.0, num_workers=3, cores=2)
    done = []
    env.process(_job(env, dev, 1.0, done, "a"))
    env.process(_job(env, dev, 1.0, done, "b"))
    env.run()
    assert [t for _, t in done] == [pytest.approx(1.0)] * 2


def test_decode_series_matches_step_by_step_times():
    tm = LinearStepTimeModel(base_s=0.01, prefill_token_s=0.001, decode_seq_s=0.002, decode_context_token_s=1e-6)
    first, growth = tm.decode_steps(3, 3000)
    for j in range(4):
        plan = StepPlan(num_decode_seqs=3, num_decode_context_tokens=3000 + 3 * j)
        assert tm.step_seconds(plan) == pytest.approx(first + j * growth)


def test_a_request_is_queued_when_the_engines_loop_comes_round():
    # vLLM's EngineCore reads its input queue between steps and stamps `queued_ts` there; its server-side TTFT
    # (queue_time + time_to_first_token) starts at that stamp, not at the arrival.
    env = simpy.Environment()
    states = {}
    w, events = _worker(env, Device(env, "d"))
    states[1] = w.submit(_request(1, 40, 3), env.now)  # idle: seen at once
    env.run(until=0.02)
    states[2] = w.submit(_request(2, 40, 1), env.now)  # mid-way through request 1's prefill step (0 - 0.05 s)
    env.run()
    assert states[1].queued_s == 0.0
    assert states[2].arrival_s == 0.02 and states[2].queued_s == pytest.approx(0.05)
    # step 2: request 2's prefill with request 1's decode: 0.01 + 0.040 + 0.002 = 0.052 s
    record = RequestRecord.from_state(states[2], 0.02)
    assert record.engine_first_token_s == pytest.approx(0.102)
    assert record.engine_ttft_s == pytest.approx(0.052)  # from the loop's stamp, not the 0.082 s from arrival


def test_an_arrival_during_a_decode_stretch_is_seen_at_the_end_of_the_step_in_progress():
    # Request 1 (4 tokens, 20 outputs): prefill 0.014 s, then decode steps of 0.012 s as one stretch. Request 2
    # arrives at 0.02, inside the step 0.014 - 0.026: the stretch is cut there and the loop sees request 2 then.
    env = simpy.Environment()
    w, _ = _worker(env, Device(env, "d"))
    w.submit(_request(1, 4, 20), env.now)
    env.run(until=0.02)
    state = w.submit(_request(2, 4, 1), env.now)
    env.run()
    assert state.queued_s == pytest.approx(0.026)
