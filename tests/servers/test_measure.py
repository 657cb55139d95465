"""`kvsim measure` over real HTTP against a stub OpenAI-compatible server: the stream, the files, faults."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.scenario import load_scenario
from sim.servers.openai_client import Endpoint, EndpointError, parse_prometheus, stream_completion
from sim.servers.run_csv import read_run
from sim.workloads.shared_prefix import prompt_token_ids, shared_prefix_stream
from tests.support.stub_server import StubServer

ARGS = ["--prefixes", "3", "--concurrency", "2", "--requests", "20", "--prefix-tokens", "64", "--tail-tokens", "40",
        "--output-tokens", "4", "--retries", "2"]


@pytest.mark.slow
def test_measure_writes_the_run_and_the_stream_matches_the_simulated_one(tmp_path):
    with StubServer() as a, StubServer() as b:
        out = tmp_path / "run.csv"
        res = CliRunner().invoke(main, ["measure", "--endpoint", a.url, "--endpoint", b.url, *ARGS,
                                        "--out", str(out)])
        assert res.exit_code == 0, res.output
        run = read_run(out)
        assert run.setup.workers == 2 and run.setup.block_size == 32 and run.setup.num_gpu_blocks == 81
        assert run.setup.engine.version == "0.0.0-stub" and run.setup.max_num_seqs == 8
        assert len(run.rows) == 3 + 20 and sum(r.warmup for r in run.rows) == 3
        # The same prefixes in the same order as the simulator's stream.
        scenario, _ = load_scenario()
        spec = scenario.with_overrides(**{"workload.prefixes": 3, "workload.prefix_tokens": 64,
                                          "workload.tail_tokens": 40, "workload.output_tokens": 4,
                                          "workload.min_requests": 20, "workload.requests_per_prefix": 0}).workload
        stream = shared_prefix_stream(spec, block_size=32, seed=scenario.seed)
        assert [r.prefix_id for r in run.rows] == [q.prefix_id for q in stream.warmups + stream.requests]
        # Warm-ups miss; a measured request of an already-sent prefix on a server that saw it hits 64 tokens.
        assert all(r.cached_tokens == 0 for r in run.rows if r.warmup)
        assert {r.cached_tokens for r in run.measured} <= {0, 64}
        assert all(r.ttft_ms > 0 and r.e2e_ms >= r.ttft_ms for r in run.measured)
        # vLLM's per-request metrics as the stub sends them: queue, time to first token, first to last token
        assert {(r.server_queue_ms, r.server_ttft_ms, r.server_generation_ms) for r in run.rows} == {(0.1, 1.0, 2.5)}
        side = json.loads(out.with_suffix(".json").read_text())
        total_queries = sum(c["queries"] for c in side["counters_measured"])
        assert total_queries == 20 * 104
        assert sum(c["hits"] for c in side["counters_measured"]) == sum(r.cached_tokens for r in run.measured)


def test_prompt_token_ids_are_deterministic_and_share_exactly_the_prefix():
    scenario, _ = load_scenario()
    spec = scenario.workload
    stream = shared_prefix_stream(spec, block_size=16, seed=5)
    a, b = [r for r in stream.requests if r.prefix_id == stream.requests[0].prefix_id][:2]
    ids_a, ids_b = (prompt_token_ids(r, seed=5) for r in (a, b))
    assert ids_a == prompt_token_ids(a, seed=5)
    assert ids_a[: spec.prefix_tokens] == ids_b[: spec.prefix_tokens]
    assert ids_a[spec.prefix_tokens] != ids_b[spec.prefix_tokens] or ids_a[-5:] != ids_b[-5:]
    assert len(ids_a) == spec.prompt_tokens and all(3 <= t <= 8191 for t in ids_a)


def test_transient_server_errors_are_retried():
    with StubServer(fail_first=2) as s:
        c = stream_completion(Endpoint.parse(s.url), model="stub-model", prompt_ids=[5] * 40, max_tokens=3,
                              retries=2, backoff_s=0.01)
        assert c.attempts == 3 and c.output_tokens == 3 and c.prompt_tokens == 40
        assert (c.server_ttft_ms, c.server_queue_ms, c.server_generation_ms) == (1.0, 0.1, 2.5)


def test_a_timeout_is_retried():
    with StubServer(delay_first_s=1.0) as s:
        c = stream_completion(Endpoint.parse(s.url), model="stub-model", prompt_ids=[5] * 40, max_tokens=2,
                              timeout_s=0.3, retries=1, backoff_s=0.01)
        assert c.attempts == 2


def test_a_failing_server_gives_a_clear_error_and_a_nonzero_exit(tmp_path):
    with StubServer(always_fail=True) as s:
        try:
            stream_completion(Endpoint.parse(s.url), model="m", prompt_ids=[5] * 8, max_tokens=1, retries=1,
                              backoff_s=0.01)
            raise AssertionError("expected EndpointError")
        except EndpointError as err:
            assert "failed after 2 attempts: HTTP 500" in str(err)
        out = tmp_path / "run.csv"
        res = CliRunner().invoke(main, ["measure", "--endpoint", s.url, *ARGS, "--retries", "0", "--out", str(out)])
        assert res.exit_code != 0
        assert "request(s) failed after retries" in res.output and "Traceback" not in res.output
        run = read_run(out)  # what was measured is still written
        assert all(r.error for r in run.rows)


def test_unreachable_endpoint_and_bad_router_are_one_line_errors(tmp_path):
    res = CliRunner().invoke(main, ["measure", "--endpoint", "http://127.0.0.1:9", *ARGS, "--out", str(tmp_path / "x.csv")])
    assert res.exit_code != 0 and "Error:" in res.output and "Traceback" not in res.output
    with StubServer() as s:
        res = CliRunner().invoke(main, ["measure", "--endpoint", s.url, *ARGS, "--router", "kv-aware",
                                        "--out", str(tmp_path / "x.csv")])
        assert res.exit_code != 0 and "needs the servers' cache state" in res.output


def test_prometheus_parsing_sums_labels_and_reads_info_labels():
    totals, info = parse_prometheus(
        '# HELP x\nvllm:prefix_cache_hits_total{engine="0"} 5.0\nvllm:prefix_cache_hits_total{engine="1"} 2.0\n'
        'vllm:cache_config_info{block_size="32",num_gpu_blocks="81"} 1.0\n')
    assert totals["vllm:prefix_cache_hits_total"] == 7.0
    assert info["vllm:cache_config_info"] == {"block_size": "32", "num_gpu_blocks": "81"}
