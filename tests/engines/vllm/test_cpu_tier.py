"""The host (CPU) KV tier in simulated time and in every command: narrated copy timing, exactness of decode
fast-forward with copies in flight, invariants against a naive model, the built-in workload's figures, and the
CLI (run, sweep, plan, replay) with its bad inputs.

The tier's decisions are checked against vLLM's own connector in `test_vllm_offload.py`; here, what kvsim adds
around them: when copies run on the host link (`sim.engines.vllm.offload.transfers`) and what users read.
"""

from __future__ import annotations

import csv
import math

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.cluster.host_link import HostLinkQueue
from sim.engines.vllm.engine import VllmEngine
from sim.engines.vllm.spec import VllmEngineSpec
from sim.replay import replay
from sim.results.summary import summarize
from sim.runner import run
from sim.scenario import ScenarioError, load_scenario, with_cpu_kv_gib
from sim.workloads.request import Request
from sim.workloads.traces import read_mooncake
from tests.support.paths import SCENARIOS, TRACES

GIB = 1 << 30
KV = 1024  # KV bytes per token in the narrated engine: a 16-token block is 16 KiB


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def _request(rid: int, tokens: int, *, prefix: int, output: int = 2) -> Request:
    blocks = tuple((prefix, i) for i in range(tokens // 16))
    return Request(request_id=rid, prompt_tokens=tokens, output_tokens=output, block_hashes=blocks)


def _step(engine: VllmEngine, now_s: float, step_s: float) -> tuple[float, object]:
    """One engine step as the worker runs it: schedule at now, the forward (after any stall), outputs at its end."""
    plan = engine.schedule(now_s)
    if plan.is_empty:
        return now_s, plan  # the engine ended the empty step itself
    end = now_s + plan.stall_s + step_s
    engine.update_from_output(plan, end)
    return end, plan


def _drain(engine: VllmEngine, t: float, step_s: float) -> float:
    """Step the engine until it has nothing left (copies included), sleeping as the worker does when only copies
    are in flight; returns the time it ends."""
    while engine.has_work:
        before = t
        t, plan = _step(engine, t, step_s)
        if plan.is_empty and engine.has_work:
            wake = engine.next_background_s()
            assert wake is not None, "an engine with work and nothing scheduled must say when to wake"
            t = max(t, wake)
        assert t >= before
    return t


def _serve_one_by_one(engine: VllmEngine, prompts, step_s: float = 0.010, t: float = 0.0):
    """Send each (tokens, prefix) after the previous one is done; returns the last request's state and the time."""
    state = None
    for rid, (tokens, prefix) in enumerate(prompts):
        state = engine.add_request(_request(rid, tokens, prefix=prefix), worker=0, arrival_s=t)
        t = _drain(engine, t, step_s)
    return state, t


# --- narrated timing -----------------------------------------------------------------------------------------------
def test_a_cpu_hit_loads_after_the_admitting_forward_and_prefills_two_steps_later():
    # 20 GPU blocks (19 usable), a 32-block tier, a link of 16 MB/s and 1 ms per copy: a 16 KiB block takes
    # 1.024 ms. A (70 tokens: 4 full blocks) is stored; two 150-token floods evict it from the GPU.
    spec = VllmEngineSpec(kv_cache_bytes=20 * 16 * KV, cpu_kv_bytes=32 * 16 * KV, vllm_version="0.33.0")
    link = HostLinkQueue(bandwidth_bytes_per_s=16e6, latency_s=1e-3)
    engine = VllmEngine(spec, kv_bytes_per_token=KV, host_link=link)
    _, t = _serve_one_by_one(engine, ((70, 1), (150, 2), (150, 3)))
    assert engine.counters().cpu_stored_blocks == 4 + 9 + 9
    # A again: GPU miss, CPU hit of its 4 blocks (64 tokens) while a long request keeps the engine busy.
    engine.add_request(_request(10, 150, prefix=4, output=20), worker=0, arrival_s=t)
    t, _ = _step(engine, t, 0.010)
    a2 = engine.add_request(_request(11, 70, prefix=1), worker=0, arrival_s=t)
    admit_start = t
    t, plan = _step(engine, t, 0.010)  # a2's admitting step: 0 tokens, the load starts when this forward ends
    assert a2 not in plan.num_scheduled_tokens and a2.loading
    load_done = t + 1e-3 + 4 * 16 * KV / 16e6
    assert load_done == pytest.approx(admit_start + 0.010 + 0.001 + 0.004096)
    t, plan = _step(engine, t, 0.010)  # the next step's check comes before the load is done: still loading
    assert a2.loading and t > load_done
    t, plan = _step(engine, t, 0.010)  # this step started after load_done: the load is reported at its end
    assert a2.loading
    t, plan = _step(engine, t, 0.010)  # promoted and prefilled: 6 tokens after 64 loaded
    assert plan.num_scheduled_tokens[a2] == 6 and a2.num_cached_tokens == 64 and a2.num_cpu_hit_tokens == 64
    assert a2.first_token_s == pytest.approx(admit_start + 4 * 0.010)


def test_an_idle_engine_sleeps_until_its_copy_is_done_then_prefills_at_once():
    spec = VllmEngineSpec(kv_cache_bytes=20 * 16 * KV, cpu_kv_bytes=32 * 16 * KV, vllm_version="0.33.0")
    engine = VllmEngine(spec, kv_bytes_per_token=KV, host_link=HostLinkQueue(bandwidth_bytes_per_s=16e6,
                                                                              latency_s=1e-3))
    state, _ = _serve_one_by_one(engine, ((70, 1), (150, 2), (150, 3), (70, 1)))
    # The last A: alone on the engine, its load started in its (empty) admitting step and was seen when done.
    assert state.num_cpu_hit_tokens == 64
    load_s = 1e-3 + 4 * 16 * KV / 16e6
    assert state.first_token_s - state.arrival_s == pytest.approx(load_s + 0.010)


def test_a_flushed_store_stalls_the_forward_pass_until_it_is_done():
    # A slow link (1 MB/s): A's 4-block store takes 66.5 ms; B reuses A's freed blocks at once, so the step that
    # allocates them must first wait for the store (vLLM's jobs_to_flush).
    spec = VllmEngineSpec(kv_cache_bytes=6 * 16 * KV, cpu_kv_bytes=32 * 16 * KV, vllm_version="0.33.0")
    engine = VllmEngine(spec, kv_bytes_per_token=KV, host_link=HostLinkQueue(bandwidth_bytes_per_s=1e6,
                                                                              latency_s=1e-3))
    engine.add_request(_request(0, 70, prefix=1, output=1), worker=0, arrival_s=0.0)
    t, _ = _step(engine, 0.0, 0.010)  # A prefills, stores 4 chunks (handed at the next step), finishes
    engine.add_request(_request(1, 70, prefix=2, output=1), worker=0, arrival_s=t)
    t2, plan = _step(engine, t, 0.010)
    assert engine.scheduler.connector.counters.num_flushed_jobs == 1
    assert plan.stall_s == pytest.approx(1e-3 + 4 * 16 * KV / 1e6)
    assert t2 == pytest.approx(t + plan.stall_s + 0.010)


# --- exactness and invariants ----------------------------------------------------------------------------------------
def _tiered(gib: float, **overrides):
    scenario, _ = load_scenario()
    base = scenario.with_overrides(**{"cluster.deployments": [], "engine.vllm_version": "0.33.0", **overrides})
    return with_cpu_kv_gib(base, gib)


@pytest.mark.parametrize("gib, min_cpu_hits", [(0.5, 0), (2, 20)])
@pytest.mark.slow
def test_fast_forward_is_exact_with_a_host_tier(gib, min_cpu_hits):
    # 0.5 GiB holds two prompts: store offers find no room while other stores are in flight and are retried at
    # the request's next (decode) step, which a decode stretch must not skip; 2 GiB gives CPU hits.
    s = _tiered(gib, **{"workload.prefixes": 12, "cluster.workers": 3, "workload.concurrency": 8})
    slow, fast = run(s, fast_forward=False), run(s, fast_forward=True)
    key = [(r.request_id, r.worker, r.cached_tokens, r.cpu_cached_tokens) for r in slow.records]
    assert key == [(r.request_id, r.worker, r.cached_tokens, r.cpu_cached_tokens) for r in fast.records]
    assert [r.first_token_s for r in fast.records] == pytest.approx([r.first_token_s for r in slow.records])
    assert fast.workers == slow.workers
    assert sum(r.cpu_cached_tokens > 0 for r in slow.records) >= min_cpu_hits


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=st.lists(st.tuples(st.integers(1, 6), st.integers(1, 90), st.integers(1, 8)), min_size=1, max_size=30),
       gpu_blocks=st.integers(12, 40), bandwidth=st.sampled_from([1e6, 16e6, 1e9]))
def test_an_ample_tier_holds_every_full_prompt_block_and_no_hit_exceeds_what_was_stored(lengths, gpu_blocks,
                                                                                      bandwidth):
    # The naive model: a tier that never fills holds exactly the union of every finished request's full prompt
    # blocks, and a request's GPU + CPU hit never passes the blocks of its prompt stored or cached before it ran.
    spec = VllmEngineSpec(kv_cache_bytes=gpu_blocks * 16 * KV, cpu_kv_bytes=4096 * 16 * KV, vllm_version="0.33.0")
    engine = VllmEngine(spec, kv_bytes_per_token=KV, host_link=HostLinkQueue(bandwidth_bytes_per_s=bandwidth,
                                                                              latency_s=1e-4))
    t, seen, states = 0.0, set(), []
    for rid, (prefix, extra, output) in enumerate(lengths):
        tokens = min(16 * prefix + extra, 16 * (gpu_blocks - 2) - output)
        if tokens < 1:
            continue
        req = Request(request_id=rid, prompt_tokens=tokens, output_tokens=output,
                      block_hashes=tuple(("p", prefix, i) if i < prefix else ("u", rid, i) for i in range(tokens // 16)))
        states.append((engine.add_request(req, worker=0, arrival_s=t), set(seen)))
        t = _drain(engine, t, 0.005)
        seen.update(req.block_hashes)
    manager = engine.scheduler.connector.manager
    manager.check_invariants()
    assert set(manager.lru_order()) == seen and not engine.scheduler.connector.has_jobs
    for state, before in states:
        hit_blocks = state.num_cached_tokens // 16
        assert all(h in before for h in state.request.block_hashes[:hit_blocks])
        assert 0 <= state.num_cpu_hit_tokens <= state.num_cached_tokens


# --- the built-in workload --------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sixteen_gib_of_host_kv_brings_random_routing_to_the_all_fit_hit_rate():
    # 6 workers, N = 24, random routing: 1 GiB of GPU KV holds ~3.95 prompts per worker. With 16 GiB of host KV a
    # worker holds every prefix, so the hit rate reaches the all-fit level: the same workload with GPU KV for every
    # prefix on every worker (what remains are first visits of a prefix to a worker).
    scenario, _ = load_scenario()
    point = {"workload.prefixes": 24, "cluster.workers": 6, "router.name": "random"}
    none, tiered = summarize(run(scenario.with_overrides(**point))), summarize(run(with_cpu_kv_gib(
        scenario.with_overrides(**point), 16)))
    all_fit = summarize(run(scenario.with_overrides(**point, **{"engine.kv_cache_bytes": 16 * GIB,
                                                                "cluster.deployments": []})))
    assert none.request_hit_rate < 0.2
    assert tiered.request_hit_rate == pytest.approx(all_fit.request_hit_rate, abs=0.03)
    assert tiered.cpu_hit_rate > 0.5 and tiered.engine.cpu_evicted_blocks == 0
    gpu_hit, cpu_hit, miss = (tiered.ttft_ms["gpu_hit_p50"], tiered.ttft_ms["cpu_hit_p50"], tiered.ttft_ms["miss_p50"])
    assert gpu_hit < cpu_hit < miss


# --- the CLI -------------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_sweep_over_host_kv_writes_the_tier_columns(tmp_path):
    res = invoke("sweep", "--cpu-kv-gib", "0,16", "--prefixes", "24", "--workers", "6", "--router", "random",
                 "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    by_gib = {float(r["cpu_kv_gib"]): r for r in rows}
    assert set(by_gib) == {0.0, 16.0}
    assert float(by_gib[0.0]["cpu_hit_rate"]) == 0 and math.isnan(float(by_gib[0.0]["ttft_cpu_hit_p50_ms"]))
    tier = by_gib[16.0]
    assert float(tier["gpu_hit_rate"]) + float(tier["cpu_hit_rate"]) == pytest.approx(float(tier["request_hit_rate"]),
                                                                             abs=1e-5)
    assert float(tier["ttft_gpu_hit_p50_ms"]) < float(tier["ttft_cpu_hit_p50_ms"]) < float(tier["ttft_miss_p50_ms"])
    assert int(tier["cpu_loaded_blocks"]) > 0 and "CPU hit" in res.output
    # The reference (no host tier) is compared with the 0 GiB row only.
    assert "over 1 points" in res.output


@pytest.mark.slow
def test_run_with_host_kv_reports_the_tier_per_worker():
    res = invoke("run", "--prefixes", "24", "--workers", "6", "--cpu-kv-gib", "4")
    assert res.exit_code == 0, res.output
    assert "cpu_hit_rate" in res.output and "CPU loaded" in res.output


@pytest.mark.slow
def test_plan_finds_the_host_kv_for_a_hit_rate():
    res = invoke("plan", "capacity", "--vary", "cpu-kv-gib", "--target-hit-rate", "0.6", "--prefixes", "24", "--workers", "6",
                 "--max", "8", "--step", "0.5", "--horizon", "300", "--repeats", "2", "--jobs", "1")
    assert res.exit_code == 0, res.output
    assert "cpu-kv-gib" in res.output and "GiB" in res.output


@pytest.mark.slow
def test_replay_with_host_kv(tmp_path):
    scenario, _ = load_scenario(SCENARIOS / "trace-replay.yaml")
    s = with_cpu_kv_gib(scenario.with_overrides(**{"engine.num_gpu_blocks_override": 300, "cluster.workers": 2}), 64)
    result = replay(s, read_mooncake(TRACES / "conversation_head400.jsonl", block_size=64))
    row = result.row()
    assert row["cpu_hit_rate"] > 0 and row["cpu_loaded_blocks"] > 0
    res = invoke("replay", str(TRACES / "conversation_head400.jsonl"), "--workers", "2", "--kv-blocks", "300",
                 "--cpu-kv-gib", "64", "--limit", "100", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert "cpu_hit_rate" in (tmp_path / "summary.csv").read_text()


@pytest.mark.parametrize("args, message", [
    (["sweep", "--prefixes", "2", "--cpu-kv-gib", "-1"], "every value must be a number of GiB >= 0"),
    (["sweep", "--prefixes", "2", "--cpu-kv-gib", "lots"], "not a comma-separated list of GiB"),
    (["run", "--cpu-kv-gib", "-2"], "-2"),
    (["plan", "capacity", "--vary", "cpu-kv-gib", "--target-hit-rate", "0.5", "--cpu-kv-gib", "4"], "give one"),
    (["plan", "capacity", "--vary", "cpu-kv-gib", "--target-hit-rate", "0.5", "--min", "-1"], "GiB of host KV >= 0"),
])
def test_bad_host_kv_input_is_one_line(args, message):
    res = CliRunner().invoke(main, args)
    assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output


def test_a_linear_time_model_must_name_its_host_link():
    scenario, _ = load_scenario(SCENARIOS / "tiny-cpu.yaml")
    with pytest.raises(ScenarioError, match="time_model.host_link.bandwidth"):
        with_cpu_kv_gib(scenario.with_overrides(**{"engine.vllm_version": "0.33.0"}), 1)
    ok = with_cpu_kv_gib(scenario.with_overrides(**{"time_model.host_link": {"bandwidth": 1e10}}), 1)
    assert ok.engine.cpu_kv_bytes == GIB


def test_a_whole_prompt_from_cpu_recomputes_its_last_token_and_counts_it_as_gpu_work():
    # A block-aligned 64-token prompt, stored, evicted from the GPU by two floods, sent again: the CPU lookup is not
    # capped at the prompt's length - 1, so all 4 blocks load (vLLM's connector counts 64 host tokens), and the
    # last token is recomputed: the request's hit is 63 tokens, all of them from the host tier.
    spec = VllmEngineSpec(kv_cache_bytes=20 * 16 * KV, cpu_kv_bytes=32 * 16 * KV, vllm_version="0.33.0")
    engine = VllmEngine(spec, kv_bytes_per_token=KV, host_link=HostLinkQueue(bandwidth_bytes_per_s=16e6,
                                                                              latency_s=1e-3))
    state, _ = _serve_one_by_one(engine, ((64, 1), (150, 2), (150, 3), (64, 1)))
    assert (state.num_cached_tokens, state.num_cpu_hit_tokens) == (63, 63)
    assert engine.scheduler.connector.counters.prefix_cache.hits == 64
