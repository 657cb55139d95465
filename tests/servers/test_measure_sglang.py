"""`kvsim measure` and `kvsim validate` against SGLang, over real HTTP to a stub SGLang server: recognising the
engine, its setup in the sidecar, /flush_cache, optional counters, simulating the run on kvsim's SGLang engine, and
describing its prompts by their real token ids."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.engines.sglang.tokens import prompt_tokens
from sim.runner import run as simulate
from sim.scenario import load_scenario
from sim.servers.run_csv import Run, RunFileError, RunSetup, read_run
from sim.studies.validate import scenario_for_run, stream_for_run
from sim.workloads.shared_prefix import SharedPrefixRequests, prompt_token_ids, token_runs_of_ids, with_token_identity
from tests.support.paths import SCENARIOS
from tests.support.stub_server import StubServer

ARGS = ["--prefixes", "3", "--concurrency", "1", "--requests", "20", "--prefix-tokens", "64", "--tail-tokens", "40",
        "--output-tokens", "4", "--retries", "0"]
TINY_CPU = SCENARIOS / "tiny-cpu.yaml"


def measure(tmp_path, *servers, extra=()):
    out = tmp_path / "run.csv"
    endpoints = [arg for s in servers for arg in ("--endpoint", s.url)]
    res = CliRunner().invoke(main, ["measure", *endpoints, *ARGS, *extra, "--out", str(out)])
    return res, out


@pytest.mark.slow
def test_an_sglang_run_records_the_servers_setup_and_counters(tmp_path):
    with StubServer(engine="sglang") as a, StubServer(engine="sglang") as b:
        res, out = measure(tmp_path, a, b)
        assert res.exit_code == 0, res.output
        assert a.state.flushes == b.state.flushes == 1
    run = read_run(out)
    s = run.setup
    assert (s.engine.name, s.engine.version) == ("sglang", "0.5.23")
    # max_total_tokens is the pool SGLang got, max_running_requests its scheduler's effective limit, the context
    # length the model's (the argument is null), chunked_prefill_size SGLang's own value.
    assert (s.page_size, s.max_total_tokens, s.max_model_len, s.chunked_prefill_size, s.max_prefill_tokens,
            s.max_running_requests, s.schedule_policy, s.radix_eviction_policy, s.disable_overlap_schedule) == (
        1, 2496, 8192, 4096, 16384, 1248, "fcfs", "lru", False)
    # No blocks on SGLang: block_size is the router's hash block size (the default scenario's engine.block_size).
    assert s.block_size == load_scenario()[0].engine.block_size and s.num_gpu_blocks is None
    assert len(run.rows) == 3 + 20 and {r.cached_tokens for r in run.measured} <= {0, 64}
    side = json.loads(out.with_suffix(".json").read_text())
    for worker, counters in enumerate(side["counters_measured"]):
        rows = [r for r in run.measured if r.worker == worker]
        assert counters == {"requests": len(rows), "prompt_tokens": sum(r.prompt_tokens for r in rows),
                            "cached_tokens": sum(r.cached_tokens for r in rows), "retractions": 0}


def test_the_hash_block_size_is_the_scenarios(tmp_path):
    with StubServer(engine="sglang") as a:
        res, out = measure(tmp_path, a, extra=["--scenario", str(TINY_CPU)])
        assert res.exit_code == 0, res.output
    assert read_run(out).setup.block_size == 32


@pytest.mark.slow
def test_validate_simulates_an_sglang_run_on_sglang_and_one_at_a_time_it_is_exact(tmp_path):
    """Concurrency 1 and no eviction: the stub's hits (longest prefix seen, at most prompt - 1) are SGLang's."""
    with StubServer(engine="sglang") as a, StubServer(engine="sglang") as b:
        res, out = measure(tmp_path, a, b)
        assert res.exit_code == 0, res.output
    run = read_run(out)
    base, _ = load_scenario()
    assert base.engine.kind == "vllm"
    scenario = scenario_for_run(base, run)
    e = scenario.engine
    assert (e.kind, e.page_size, e.max_total_tokens, e.max_model_len, e.chunked_prefill_size,
            e.max_running_requests) == ("sglang", 1, 2496, 8192, 4096, 1248)
    result = simulate(scenario, stream_for_run(run, block_size=e.block_size))
    assert {r.request_id: r.cached_tokens for r in result.records} == {r.request_id: r.cached_tokens for r in run.rows}
    res = CliRunner().invoke(main, ["validate", str(out), "--tolerance", "request_hit_rate=0",
                                    "--tolerance", "token_hit_rate=0"])
    assert res.exit_code == 0, res.output


def test_a_refused_flush_is_a_one_line_error_and_no_reset_skips_it(tmp_path):
    with StubServer(engine="sglang", flush_refuses=True) as a:
        res, _ = measure(tmp_path, a)
        assert res.exit_code != 0 and "Traceback" not in res.output
        assert "/flush_cache refused" in res.output and "--no-reset" in res.output
        res, _ = measure(tmp_path, a, extra=["--no-reset"])
        assert res.exit_code == 0, res.output


def test_without_metrics_the_counters_are_null_and_the_run_is_still_written(tmp_path):
    with StubServer(engine="sglang", metrics=False) as a:
        res, out = measure(tmp_path, a)
        assert res.exit_code == 0, res.output
    side = json.loads(out.with_suffix(".json").read_text())
    assert side["counters_measured"] == [None] and side["counters_total"] == [None]
    assert len(read_run(out).measured) == 20


@pytest.mark.slow
def test_one_run_may_not_mix_engines_or_setups(tmp_path):
    with StubServer() as v, StubServer(engine="sglang") as s:
        res, _ = measure(tmp_path, v, s)
        assert res.exit_code != 0 and "Traceback" not in res.output
        assert "different engines" in res.output and f"{v.url} vllm" in res.output
    with StubServer(engine="sglang") as a, StubServer(engine="sglang", server_info={"max_total_num_tokens": 4096}) as b:
        res, _ = measure(tmp_path, a, b)
        assert res.exit_code != 0 and "differ in max_total_tokens: [2496, 4096]" in res.output


def test_sglang_without_cache_report_is_refused(tmp_path):
    with StubServer(engine="sglang", server_info={"enable_cache_report": False}) as a:
        res, _ = measure(tmp_path, a)
        assert res.exit_code != 0 and "--enable-cache-report" in res.output and "Traceback" not in res.output


def _sglang_setup(**changes) -> dict:
    setup = {"workers": 2, "prefixes": 2, "concurrency": 4, "requests": 20, "block_size": 32, "prefix_tokens": 512,
             "prompt_tokens": 612, "output_tokens": 64, "router": "random", "warmup_per_prefix": 1, "seed": 0,
             "engine": {"name": "sglang", "version": "0.5.23"}, "page_size": 16, "max_total_tokens": 2496,
             "chunked_prefill_size": -1, "max_running_requests": 8, "schedule_policy": "lpm",
             "disable_overlap_schedule": True, "max_model_len": 8192}
    setup.update(changes)
    return {k: v for k, v in setup.items() if v is not None}


def test_an_sglang_sidecar_needs_its_kv_slots(tmp_path):
    RunSetup.model_validate(_sglang_setup())
    RunSetup.model_validate(_sglang_setup(max_total_tokens=None, kv_cache_bytes=2555904, kv_bytes_per_token=1024))
    path = tmp_path / "run.csv"
    path.write_text("request_id,warmup,prefix_id,worker,prompt_tokens,cached_tokens,ttft_ms,e2e_ms,start_s,end_s\n"
                    "0,true,0,0,612,0,1,2,0,1\n")
    path.with_suffix(".json").write_text(json.dumps(_sglang_setup(max_total_tokens=None)))
    with pytest.raises(RunFileError, match="give max_total_tokens, or kv_cache_bytes with kv_bytes_per_token"):
        read_run(path)
    vllm = _sglang_setup(engine={"name": "vllm", "version": "0.32.0"})  # vLLM still needs its block count
    with pytest.raises(ValueError, match="give num_gpu_blocks"):
        RunSetup.model_validate(vllm)


def test_the_run_decides_the_engine_and_its_settings():
    tiny_cpu = load_scenario(TINY_CPU)[0]
    rows = ()
    sglang_run = Run("s", Path("s.csv"), RunSetup.model_validate(_sglang_setup()), rows)
    e = scenario_for_run(tiny_cpu, sglang_run).engine
    assert (e.kind, e.page_size, e.max_total_tokens, e.chunked_prefill_size, e.max_running_requests,
            e.schedule_policy, e.disable_overlap_schedule, e.max_model_len, e.block_size) == (
        "sglang", 16, 2496, None, 8, "lpm", True, 8192, 32)  # -1: chunking disabled
    # Only bytes: KV slots = bytes / bytes per token.
    by_bytes = Run("s", Path("s.csv"), RunSetup.model_validate(
        _sglang_setup(max_total_tokens=None, kv_cache_bytes=2555904, kv_bytes_per_token=1024)), rows)
    assert scenario_for_run(tiny_cpu, by_bytes).engine.max_total_tokens == 2496
    # A vLLM run on an SGLang base scenario runs on vLLM with its block count.
    vllm_run = Run("v", Path("v.csv"), RunSetup.model_validate(
        _sglang_setup(engine={"name": "vllm", "version": "0.32.0"}, num_gpu_blocks=78)), rows)
    e = scenario_for_run(tiny_cpu.with_engine("sglang"), vllm_run).engine
    assert (e.kind, e.num_gpu_blocks_override, e.vllm_version, e.block_size) == ("vllm", 78, "0.32.0", 32)


def test_token_runs_follow_the_trie_of_the_ids():
    """Three prompts: a and b share 5 9 9 and then differ; c shares nothing; an identical prompt shares all."""
    a, b, c, a2 = token_runs_of_ids([[5, 9, 9, 2, 7], [5, 9, 9, 4], [8, 1], [5, 9, 9, 2, 7]])
    assert [n for _, n in a] == [3, 2] and [n for _, n in b] == [3, 1] and [n for _, n in c] == [2]
    assert a[0] == b[0] and a[1] != b[1] and c[0] not in (a[0], b[0]) and a2 == a


def test_real_token_ids_make_a_513_token_hit():
    """Seed 0: the tails of requests 58 and 72 start with the same id (3418). Of one 512-token prefix, with their
    real ids, request 72 shares 513 tokens with request 58; by the stream's own runs, 512."""
    maker = SharedPrefixRequests(block_size=32)
    r58, r72 = (maker.make(rid, 4, prefix_tokens=512, prompt_tokens=612, output_tokens=64) for rid in (58, 72))
    assert prompt_tokens(r72, 32).match(prompt_tokens(r58, 32)) == 512
    e58, e72 = with_token_identity([r58, r72], seed=0)
    assert prompt_token_ids(r58, seed=0)[512] == prompt_token_ids(r72, seed=0)[512] == 3418
    assert prompt_tokens(e72, 32).match(prompt_tokens(e58, 32)) == 513
    assert e72.block_hashes == r72.block_hashes
