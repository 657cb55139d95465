"""Traces and replay: reading Mooncake JSONL (lazily, with clear errors), sub-blocking, open-loop replay, and
decode fast-forwarding that changes nothing but the speed."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.replay import device_groups, replay
from sim.runner import run
from sim.scenario import load_scenario
from sim.workloads.traces import TraceError, read_mooncake
from tests.support.paths import SCENARIOS, TRACES

CONVERSATION = TRACES / "conversation_head400.jsonl"
SYNTHETIC = TRACES / "synthetic_head300.jsonl"


@pytest.fixture(scope="module")
def trace_scenario():
    return load_scenario(SCENARIOS / "trace-replay.yaml")[0]


def test_sub_blocks_keep_the_chain_and_drop_the_partial_block():
    # Line 1: 6,758 tokens = 13 full 512-token blocks + 102 tokens; at block size 64: 105 full sub-blocks.
    first = next(read_mooncake(CONVERSATION, block_size=64))
    assert first.request.prompt_tokens == 6758 and first.request.output_tokens == 500
    hashes = first.request.block_hashes
    assert len(hashes) == 6758 // 64 == 105
    assert hashes[:9] == (0, 1, 2, 3, 4, 5, 6, 7, 8)  # trace block 0 -> sub-blocks 0..7, block 1 -> 8, ...
    assert hashes[-1] == 13 * 8 + 0  # the 14th trace block (id 13) contributes 1 full sub-block (102 // 64)
    # Block size equal to the trace's: the ids themselves, minus the partial last block.
    same = next(read_mooncake(CONVERSATION, block_size=512))
    assert same.request.block_hashes == tuple(range(13))


def test_a_repeated_trace_id_is_another_block_from_the_repeat_on(tmp_path):
    # A trace's ids are prefix hashes: the third block of [4, 5, 4] is not the first (vLLM chains its hashes, and
    # Dynamo's mocker chains the ids). Keyed by the id alone it was the same block twice in one prompt, which the
    # pool's batch free left held: "a popped block carries a hash it is not registered under" a few requests on.
    rows = [[4, 5, 4], [4, 5, 4, 7], [4, 5], [4, 6, 4]]
    path = tmp_path / "repeats.jsonl"
    path.write_text("".join(json.dumps({"timestamp": i, "input_length": 512 * len(ids), "output_length": 2,
                                        "hash_ids": ids}) + "\n" for i, ids in enumerate(rows)))
    a, b, c, d = (t.request.block_hashes for t in read_mooncake(path, block_size=256))
    assert a[:4] == c == (8, 9, 10, 11)  # up to the repeat: the plain keys, shared with [4, 5]
    assert len(set(a)) == 6 and a[4:] == b[4:6]  # past it: new blocks, shared by prompts of the same leading ids
    assert b[6:] != (14, 15) and len(set(b)) == 8  # a block after a repeat chains every id before it
    assert d[:2] == (8, 9) and d[2:4] == (12, 13) and set(d[4:]).isdisjoint(a)  # [4, 6, 4]: another path


def test_a_trace_that_repeats_ids_replays_as_dynamos_mocker_does(tmp_path):
    # 50 requests of ids [1, 2, 1], then 50 of their own, one worker of 128 blocks of 64 tokens: the mocker's
    # prefix_cache_reused_ratio on this file (run_mocker.py, vLLM backend) is 0.469583: 49 repeats with 23 of their
    # 24 blocks cached (1,472 tokens: a full hit recomputes the last block), over 100 prompts of 1,536 tokens.
    rows = [{"timestamp": i * 1000, "input_length": 1536, "output_length": 4, "hash_ids": [1, 2, 1]} for i in range(50)]
    rows += [{"timestamp": 60000 + i * 1000, "input_length": 1536, "output_length": 4,
              "hash_ids": [100 + 3 * i, 101 + 3 * i, 102 + 3 * i]} for i in range(50)]
    path = tmp_path / "repeats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["replay", str(path), "--workers", "1", "--kv-blocks", "128", "--router",
                                       "round-robin", "--out", str(out)])
    assert result.exit_code == 0, result.output
    row = next(csv.DictReader((out / "summary.csv").open()))
    assert float(row["prefix_reuse"]) == pytest.approx(49 * 1472 / (100 * 1536), abs=1e-6)


def test_every_request_shares_the_first_block_of_the_conversation_trace():
    reqs = [t.request for t in read_mooncake(CONVERSATION, block_size=64, limit=50)]
    assert all(r.block_hashes[:8] == tuple(range(8)) for r in reqs)


def test_reading_is_lazy_and_times_are_scaled(tmp_path):
    it = read_mooncake(CONVERSATION, block_size=64, speed=2.0)
    assert next(it).arrival_s == 0.0
    later = [t.arrival_s for t in read_mooncake(CONVERSATION, block_size=64, limit=400)][-1]
    fast = [t.arrival_s for t in read_mooncake(CONVERSATION, block_size=64, limit=400, speed=2.0)][-1]
    assert fast == pytest.approx(later / 2)


@pytest.mark.parametrize("line,message", [
    ('{"timestamp": 0, "input_length": 600, "output_length": 4}', "bad.jsonl:2: missing field 'hash_ids'"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1]}', "bad.jsonl:2: field 'hash_ids' has 1 ids"),
    ('{"timestamp": "x", "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}', "bad.jsonl:2: field 'timestamp' must be a number"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1, "a"]}', "bad.jsonl:2: field 'hash_ids' must hold"),
    ('not json', "bad.jsonl:2: not valid JSON"),
])
def test_malformed_lines_name_the_line_and_the_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [0]}\n' + line + "\n")
    with pytest.raises(TraceError, match=message):
        list(read_mooncake(path, block_size=64))


def test_block_size_must_divide_the_traces():
    with pytest.raises(TraceError, match="must divide"):
        next(read_mooncake(CONVERSATION, block_size=48))


@pytest.mark.slow
def test_fast_forward_changes_nothing_but_the_speed(trace_scenario):
    s = trace_scenario.with_overrides(**{"engine.num_gpu_blocks_override": 4000, "cluster.workers": 4})
    results = [replay(s, read_mooncake(CONVERSATION, block_size=64), fast_forward=ff) for ff in (False, True)]
    slow, fast = results
    assert fast.stats.cached_tokens == slow.stats.cached_tokens and fast.stats.requests == slow.stats.requests
    assert fast.stats.ttft_ms.counts == slow.stats.ttft_ms.counts
    assert fast.stats.last_finished_s == pytest.approx(slow.stats.last_finished_s)
    assert [w.engine.evicted_blocks for w in fast.workers] == [w.engine.evicted_blocks for w in slow.workers]
    assert [w.steps for w in fast.workers] == [w.steps for w in slow.workers]


@pytest.mark.parametrize("router", ["kv-aware", "random"])
def test_fast_forward_is_exact_in_closed_loops_and_under_cache_peeks(router):
    # One worker per device (fast-forward applies), a pool small enough to evict, and a router that peeks.
    scenario, _ = load_scenario()
    s = scenario.with_overrides(**{"cluster.deployments": [], "workload.prefixes": 12, "router.name": router,
                                   "router.options": {}, "workload.concurrency": 16, "engine.kv_cache_bytes": 300 * 16 * 114688})
    slow, fast = run(s, fast_forward=False), run(s, fast_forward=True)
    assert [(r.request_id, r.worker, r.cached_tokens, r.num_preemptions) for r in fast.records] == \
           [(r.request_id, r.worker, r.cached_tokens, r.num_preemptions) for r in slow.records]
    assert [r.first_token_s for r in fast.records] == pytest.approx([r.first_token_s for r in slow.records])
    assert [r.finished_s for r in fast.records] == pytest.approx([r.finished_s for r in slow.records])
    assert fast.workers == slow.workers


def _same_replay(a, b) -> None:
    """Two replays agree on every statistic and counter, exactly."""
    for field in ("requests", "hit_requests", "prompt_tokens", "cached_tokens", "preemptions", "first_sent_s",
                  "last_finished_s", "requests_per_worker", "prompt_tokens_per_worker"):
        assert getattr(a.stats, field) == getattr(b.stats, field), field
    assert a.stats.ttft_ms.counts == b.stats.ttft_ms.counts and a.stats.e2e_ms.counts == b.stats.e2e_ms.counts
    assert {k: (v.requests, v.cached_tokens, v.ttft_ms.counts) for k, v in a.stats.bins.items()} == \
           {k: (v.requests, v.cached_tokens, v.ttft_ms.counts) for k, v in b.stats.bins.items()}
    assert a.workers == b.workers and a.simulated_s == b.simulated_s and a.rejected == b.rejected


@pytest.mark.parametrize("router,workers", [("round-robin", 4), ("random", 5), ("prefix-hash", 4)])
@pytest.mark.slow
def test_a_replay_split_over_processes_gives_the_same_numbers(trace_scenario, router, workers):
    # A pool small enough to evict, some requests too long to serve, and more processes than cores.
    s = trace_scenario.with_overrides(**{"engine.num_gpu_blocks_override": 300, "cluster.workers": workers,
                                         "router.name": router, "router.options": {}})
    one = replay(s, read_mooncake(CONVERSATION, block_size=64))
    split = replay(s, lambda: read_mooncake(CONVERSATION, block_size=64), jobs=3)
    assert (one.jobs, split.jobs) == (1, 3)
    assert one.rejected > 0 and sum(w.engine.evicted_blocks for w in one.workers) > 0
    _same_replay(one, split)


def test_only_routers_blind_to_the_cluster_split_and_devices_stay_whole(trace_scenario):
    s = trace_scenario.with_overrides(**{"cluster.workers": 8})
    assert device_groups(s, 3) == [frozenset({0, 3, 6}), frozenset({1, 4, 7}), frozenset({2, 5})]
    assert device_groups(s, 1) == [frozenset(range(8))]
    for name, options in [("kv-aware", {}), ("prefix-hash", {"load_factor": 1.25})]:
        reads_cluster = s.with_overrides(**{"router.name": name, "router.options": options})
        assert device_groups(reads_cluster, 4) == [frozenset(range(8))]
    baseline, _ = load_scenario()  # 6 workers: four time-share one GPU, one on each of two others
    shared = baseline.with_overrides(**{"cluster.workers": 6})
    assert device_groups(shared, 2) == [frozenset({0, 1, 2, 3}), frozenset({4, 5})]
    assert device_groups(shared, 8) == [frozenset({0, 1, 2, 3}), frozenset({4}), frozenset({5})]


def test_an_error_in_a_replay_process_reaches_the_caller(tmp_path, trace_scenario):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(CONVERSATION.read_text().splitlines()[0] + "\nnot json\n")
    s = trace_scenario.with_overrides(**{"cluster.workers": 4})
    with pytest.raises(TraceError, match="bad.jsonl:2: not valid JSON"):
        replay(s, lambda: read_mooncake(bad, block_size=64), jobs=2)


def test_replay_rejects_requests_too_long_for_the_engine(trace_scenario):
    s = trace_scenario.with_overrides(**{"engine.num_gpu_blocks_override": 60})  # 59 x 64 = 3,776 tokens
    result = replay(s, read_mooncake(CONVERSATION, block_size=64, limit=40))
    assert result.rejected > 0 and result.stats.requests + result.rejected == 40


def test_replay_command_writes_summary_and_figure(tmp_path):
    res = CliRunner().invoke(main, ["replay", str(SYNTHETIC), "--workers", "4", "--kv-tokens", "500000",
                                    "--router", "kv-aware", "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    [row] = list(csv.DictReader((tmp_path / "summary.csv").open()))
    for col in ("requests", "prefix_reuse", "token_hit_rate", "ttft_p50_ms", "ttft_p99_ms", "throughput_rps"):
        assert col in row
    assert int(row["requests"]) == 300 and 0 < float(row["prefix_reuse"]) < 1
    assert float(row["prefix_reuse"]) == pytest.approx(float(row["token_hit_rate"]), abs=1e-9)
    assert len(list(csv.DictReader((tmp_path / "workers.csv").open()))) == 4
    assert (tmp_path / "replay.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
def test_replay_command_splits_over_jobs_with_the_same_summary(tmp_path):
    rows = []
    for jobs in ("1", "2"):
        out = tmp_path / jobs
        res = CliRunner().invoke(main, ["replay", str(SYNTHETIC), "--workers", "4", "--kv-tokens", "200000",
                                        "--router", "round-robin", "--jobs", jobs, "--out", str(out)])
        assert res.exit_code == 0, res.output
        [row] = list(csv.DictReader((out / "summary.csv").open()))
        assert row.pop("jobs") == jobs
        row.pop("wall_s")
        rows.append((row, (out / "workers.csv").read_text()))
    assert rows[0] == rows[1]


def test_replay_command_errors_are_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"timestamp": 0, "input_length": 600, "output_length": 4, "hash_ids": [1]}) + "\n")
    for jobs in ("1", "2"):
        res = CliRunner().invoke(main, ["replay", str(bad), "--workers", "2", "--kv-tokens", "100000", "--jobs", jobs])
        assert res.exit_code != 0 and "bad.jsonl:1: field 'hash_ids'" in res.output and "Traceback" not in res.output
    res = CliRunner().invoke(main, ["replay", str(SYNTHETIC), "--workers", "2", "--kv-tokens", "1000", "--kv-blocks", "9"])
    assert res.exit_code != 0 and "only one of" in res.output
