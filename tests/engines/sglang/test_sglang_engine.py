"""The SGLang engine through kvsim's worker and cluster: narrated timing, decode stretches that change nothing but
the speed, cache events, its scenario section and the CLI. (Decision-by-decision fidelity to SGLang's own
scheduler is tests/engines/sglang/test_sglang_engine_oracle.py.)"""

from __future__ import annotations


import pytest
import simpy
from click.testing import CliRunner

from sim.cli import main
from sim.cluster.device import Device
from sim.cluster.worker import Worker
from sim.engines.registry import ENGINES, build_engine
from sim.engines.sglang.engine import SglangEngine
from sim.engines.sglang.spec import SglangEngineSpec
from sim.replay import replay
from sim.runner import run
from sim.scenario import ScenarioError, load_scenario, validate_scenario
from sim.timing.linear import LinearStepTimeModel
from sim.workloads.request import Request
from sim.workloads.traces import read_mooncake
from tests.support.paths import SCENARIOS, TRACES

TM = LinearStepTimeModel(base_s=0.01, prefill_token_s=0.001, decode_seq_s=0.002)
TRACE = TRACES / "conversation_head400.jsonl"


def _request(rid: int, prefix: int, tail: int, out: int, prefix_id: int = 0) -> Request:
    return Request(rid, prefix + tail, out, (), token_runs=((("p", prefix_id), prefix), (("u", rid), tail)))


def _worker(env, *, overlap: bool = True, **spec):
    engine = SglangEngine(SglangEngineSpec(kv_cache_bytes=1, max_total_tokens=10_000,
                                           disable_overlap_schedule=not overlap, **spec), kv_bytes_per_token=1)
    events = []
    w = Worker(env, 0, engine, Device(env, "d"), TM,
               on_first_token=lambda s: events.append(("first", s.request.request_id, round(env.now, 6))),
               on_finished=lambda s: events.append(("done", s.request.request_id, round(env.now, 6))))
    return w, events


@pytest.mark.parametrize("overlap", [True, False])
def test_one_request_prefills_then_decodes_in_separate_batches(overlap):
    # 40 prompt tokens, 3 outputs: the prefill batch takes 0.01 + 0.040 s (first token at 0.05), then two decode
    # batches of 0.01 + 0.002 s each (done at 0.074 s), overlap or not: alone, nothing waits for a result.
    env = simpy.Environment()
    w, events = _worker(env, overlap=overlap)
    w.submit(_request(1, 30, 10, 3), env.now)
    env.run()
    assert events == [("first", 1, 0.05), ("done", 1, 0.074)]


def test_under_overlap_the_batch_formed_before_a_prefill_result_misses_its_prompt():
    # Two identical-prefix requests; the second arrives while the first's prefill runs. Without overlap it is
    # admitted after the first's result is in the tree (hit 2,032); with overlap the next batch is formed while the
    # prefill runs (a decode of the first), and the one after that, when the result is processed: still a hit.
    # A third request arriving in the same window as the second is admitted with it and misses alike.
    for overlap, expected in ((False, [0, 2032, 2032]), (True, [0, 2032, 2032])):
        env = simpy.Environment()
        w, _ = _worker(env, overlap=overlap, chunked_prefill_size=None, max_prefill_tokens=2400)
        states = [w.submit(_request(0, 2032, 339, 4), 0.0)]

        def later():
            yield env.timeout(0.1)
            states.append(w.submit(_request(1, 2032, 339, 4), env.now))
            states.append(w.submit(_request(2, 2032, 339, 4), env.now))

        env.process(later())
        env.run()
        assert [s.num_cached_tokens for s in states] == expected, overlap


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.slow
def test_decode_stretches_change_nothing_but_the_speed_in_a_replay(overlap, page_size):
    s, _ = load_scenario(SCENARIOS / "trace-replay.yaml")
    s = s.with_engine("sglang").with_overrides(**{
        "cluster.workers": 3, "engine.max_total_tokens": 60_000, "engine.page_size": page_size,
        "engine.disable_overlap_schedule": not overlap, "router.name": "kv-aware", "router.options": {}})
    slow, fast = (replay(s, read_mooncake(TRACE, block_size=64), fast_forward=ff) for ff in (False, True))
    for field in ("requests", "hit_requests", "prompt_tokens", "cached_tokens", "preemptions",
                  "requests_per_worker"):
        assert getattr(fast.stats, field) == getattr(slow.stats, field), field
    assert fast.stats.ttft_ms.counts == slow.stats.ttft_ms.counts
    assert fast.stats.e2e_ms.counts == slow.stats.e2e_ms.counts
    assert fast.stats.last_finished_s == pytest.approx(slow.stats.last_finished_s)
    assert fast.workers == slow.workers
    assert sum(w.engine.evicted_tokens for w in slow.workers) > 0


@pytest.mark.parametrize("ignore_eos", [True, False])
def test_decode_stretches_are_exact_in_closed_loops_with_retractions_and_peeks(ignore_eos):
    # Short prompts, long outputs, 4,000 slots per worker: without ignore_eos, admission reserves the running
    # requests' outputs at new_token_ratio only (decaying to 0.098), over-admits, and decode retracts.
    scenario, _ = load_scenario()
    s = scenario.with_engine("sglang").with_overrides(**{
        "cluster.deployments": [], "cluster.workers": 2, "workload.prefixes": 6, "workload.prefix_tokens": 100,
        "workload.tail_tokens": 50, "router.name": "kv-aware", "router.options": {}, "workload.concurrency": 24,
        "workload.output_tokens": 300, "engine.kv_cache_bytes": 4000 * 114688, "engine.ignore_eos": ignore_eos})
    slow, fast = run(s, fast_forward=False), run(s, fast_forward=True)
    key = [(r.request_id, r.worker, r.cached_tokens, r.num_preemptions) for r in slow.records]
    assert [(r.request_id, r.worker, r.cached_tokens, r.num_preemptions) for r in fast.records] == key
    assert [r.finished_s for r in fast.records] == pytest.approx([r.finished_s for r in slow.records])
    assert fast.workers == slow.workers
    if not ignore_eos:
        assert sum(w.engine.preemptions for w in slow.workers) > 0  # admission reserved at new_token_ratio: retractions


def test_cache_events_report_stored_and_evicted_pages_once_per_processed_batch():
    engine = build_engine(SglangEngineSpec(kv_cache_bytes=1, max_total_tokens=480, page_size=4), kv_bytes_per_token=1)
    batches = []
    engine.cache.subscribe(lambda events, now: batches.append((now, [(e.kind, len(e.block_hashes)) for e in events])))
    env = simpy.Environment()
    w = Worker(env, 0, engine, Device(env, "d"), TM, on_first_token=lambda s: None, on_finished=lambda s: None)
    for rid in range(4):
        w.submit(_request(rid, 100, 98, 2, prefix_id=rid), 0.0)  # 198 distinct tokens, 49 pages; 480 slots hold 2
    env.run()
    kinds = [k for _, evs in batches for k, _ in evs]
    assert kinds.count("stored") >= 4 and kinds.count("removed") >= 1
    assert engine.counters().evicted_tokens > 0
    assert all(n >= 1 for _, evs in batches for _, n in evs)
    assert [t for t, _ in batches] == sorted(t for t, _ in batches)
    first_stored = next(evs for _, evs in batches if evs and evs[0][0] == "stored")
    assert first_stored[0] == ("stored", 49)  # the first prompt, page-aligned: 196 of 198 tokens


def test_the_scenario_section_switches_engines_and_rejects_bad_options():
    scenario, _ = load_scenario()
    sg = scenario.with_engine("sglang")
    assert sg.engine.kind == "sglang" and sg.engine.kv_cache_bytes == scenario.engine.kv_cache_bytes
    assert sg.engine.chunked_prefill_size == 2048  # engine_options.sglang of the built-in scenario
    assert sg.capacity_tokens == 1073741824 // 114688 == 9362
    back = sg.with_engine("vllm").engine  # shared options carry over, vLLM's own take its defaults
    assert (back.kind, back.block_size, back.kv_cache_bytes, back.max_model_len) == ("vllm", 16, 1073741824, 4096)
    data = scenario.model_dump()
    data["engine_options"] = {"sglang": {"page_sise": 16}}
    with pytest.raises(ScenarioError, match="engine_options.sglang.page_sise: unknown option; did you mean page_size"):
        validate_scenario(data, source="x")
    data["engine_options"] = {"tensorrt": {}}
    with pytest.raises(ScenarioError, match="engine_options.tensorrt: unknown engine; allowed: sglang, vllm"):
        validate_scenario(data, source="x")
    data = sg.model_dump()
    data["engine"]["radix_eviction_policy"] = "random"
    with pytest.raises(ScenarioError, match="engine.radix_eviction_policy"):
        validate_scenario(data, source="x")
    assert set(ENGINES) == {"vllm", "sglang"}


def test_sglang_truncates_outputs_that_would_not_fit_at_intake():
    engine = SglangEngine(SglangEngineSpec(kv_cache_bytes=1, max_total_tokens=1000, max_model_len=600),
                          kv_bytes_per_token=1)
    state = engine.add_request(_request(1, 400, 100, 300), worker=0, arrival_s=0.0)
    # max_req_len = min(600 - 1, 1000 - 1) = 599: at most 599 - 500 - 1 = 98 new tokens
    assert state.max_new_tokens == 98


def test_a_pool_too_small_names_the_field_that_sized_it():
    spec = SglangEngineSpec(kv_cache_bytes=10**9, max_total_tokens=100)
    with pytest.raises(ValueError, match=r"needs 2435 tokens but engine.max_total_tokens=100 gives 100 KV slots: "
                                         r"raise engine.max_total_tokens$"):
        spec.check_fits(2435, kv_bytes_per_token=1)
    with pytest.raises(ValueError, match=r"engine.kv_cache_bytes=20 gives 16 KV slots; need at least two pages "
                                         r"of engine.page_size=16"):
        SglangEngineSpec(kv_cache_bytes=20, page_size=16).check_fits(10, kv_bytes_per_token=1)


def test_cli_runs_the_sglang_engine_and_names_bad_engines(tmp_path):
    runner = CliRunner()
    res = runner.invoke(main, ["sweep", "--prefixes", "2", "--workers", "3", "--concurrency", "4",
                               "--engine", "vllm,sglang", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rows = (tmp_path / "summary.csv").read_text().splitlines()
    assert rows[0].split(",")[4] == "engine" and {r.split(",")[4] for r in rows[1:]} == {"vllm", "sglang"}
    assert (tmp_path / "engines.png").stat().st_size > 0
    res = runner.invoke(main, ["run", "--engine", "trtllm"])
    assert res.exit_code != 0 and "unknown engine trtllm; allowed: sglang, vllm" in res.output
    assert "Traceback" not in res.output
    res = runner.invoke(main, ["engines"])
    assert res.exit_code == 0 and "radix_eviction_policy" in res.output and "free_order" in res.output


class _RecordingTimeModel:
    """The test time model, keeping each extend step's (prefill tokens, KV tokens before them)."""

    def __init__(self) -> None:
        self.extends: list[tuple[int, int]] = []

    def step_seconds(self, plan) -> float:
        if plan.num_prefill_tokens:
            self.extends.append((plan.num_prefill_tokens, plan.num_prefill_context_tokens))
        return TM.step_seconds(plan)

    def decode_steps(self, num_decodes: int, context_tokens: int):
        return TM.decode_steps(num_decodes, context_tokens)


def test_extend_steps_count_the_kv_their_chunks_attend_to():
    # A 2,371-token prompt in 2,048-token chunks: the second chunk's 323 tokens come after 2,048 computed ones.
    # A later request with the same 2,032-token prefix extends 339 tokens after its 2,032 cached ones.
    env = simpy.Environment()
    engine = SglangEngine(SglangEngineSpec(kv_cache_bytes=1, max_total_tokens=10_000, disable_overlap_schedule=True,
                                           chunked_prefill_size=2048), kv_bytes_per_token=1)
    recorder = _RecordingTimeModel()
    w = Worker(env, 0, engine, Device(env, "d"), recorder, on_first_token=lambda s: None, on_finished=lambda s: None)
    w.submit(_request(0, 2032, 339, 2), 0.0)

    def later():
        yield env.timeout(10.0)
        w.submit(_request(1, 2032, 339, 2), env.now)

    env.process(later())
    env.run()
    assert recorder.extends == [(2048, 0), (323, 2048), (339, 2032)]


@pytest.mark.parametrize("start", [None, 0.5, 0.1])
def test_new_token_ratio_decays_many_steps_as_one_at_a_time(start):
    from sim.engines.sglang.scheduler import NewTokenRatio
    for conservativeness in (1.0, 0.3, 1.5):
        for n in (0, 1, 5, 599, 600, 601, 2000):
            ratio, stepped = NewTokenRatio(conservativeness), NewTokenRatio(conservativeness)
            if start is not None:
                ratio.current = stepped.current = start
            ratio.decay_steps(n)
            for _ in range(n):
                stepped.decay_step()
            assert ratio.current == stepped.current
