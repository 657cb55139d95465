"""SLOs, goodput, TPOT/E2E percentiles and load imbalance: tiny hand-built runs with exact figures, properties of
goodput and Jain's index, the scenario's slo block and --slo at the edge, and replays reporting the same."""

from __future__ import annotations

import csv
import math
import re
from dataclasses import replace

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.replay import replay
from sim.engines.interface import EngineCounters, PrefixCacheStats
from sim.results.records import RequestRecord, RunResult, Slo, WorkerCounters, total_counters
from sim.results.cost import COST_COLUMNS
from sim.results.report import SUMMARY_COLUMNS, TIER_COLUMNS, aggregate
from sim.results.streaming_stats import StreamingStats
from sim.results.summary import RequestCounts, imbalance_max_mean, jain_index, summarize
from sim.scenario import ScenarioError, SloSpec, load_scenario
from sim.workloads.traces import read_mooncake
from tests.support.paths import SCENARIOS, TRACES

SYNTHETIC = TRACES / "synthetic_head300.jsonl"

NEW_COLUMNS = ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms", "slo_met_requests", "goodput_rps", "goodput_fraction",
               "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p99_ms", "imbalance_max_mean", "jain_index")


def record(request_id: int, worker: int, sent_s: float, first_token_s: float, finished_s: float, output_tokens: int,
           *, warmup: bool = False) -> RequestRecord:
    return RequestRecord(
        request_id=request_id, prefix_id=0, warmup=warmup, worker=worker, prompt_tokens=100,
        output_tokens=output_tokens, cached_tokens=0, shareable_tokens=64, sent_s=sent_s, arrival_s=sent_s,
        admitted_s=sent_s, engine_first_token_s=first_token_s, first_token_s=first_token_s, finished_s=finished_s,
        num_preemptions=0,
    )


# Four measured requests on two workers over 2 s (times in eighths of a second, so every sum is exact), and one
# warm-up that no figure may count:
#   id  worker  sent   first    finished  outputs   TTFT ms  TPOT ms              E2E ms
#   0   0       0      0.125    0.625     5         125      500/4   = 125        625
#   1   0       0      0.25     0.25      1         250      none (one token)     250
#   2   0       1.0    1.0625   1.3125    9         62.5     250/8   = 31.25      312.5
#   3   1       1.0    1.125    2.0       15        125      875/14  = 62.5       1000
RECORDS = (
    record(0, 0, 0.0, 0.125, 0.625, 5),
    record(1, 0, 0.0, 0.25, 0.25, 1),
    record(2, 0, 1.0, 1.0625, 1.3125, 9),
    record(3, 1, 1.0, 1.125, 2.0, 15),
    record(4, 1, -5.0, 0.0, 9.0, 2, warmup=True),
)


def hand_built(slo: Slo = Slo()) -> RunResult:
    return RunResult(scenario_name="hand-built", num_workers=2, records=RECORDS, workers=(), measured_start_s=0.0,
                     measured_end_s=2.0, slo=slo)


def test_tpot_is_the_gap_between_tokens_and_a_one_token_request_has_none():
    assert [r.tpot_s for r in RECORDS[:4]] == [0.125, None, 0.03125, 0.0625]
    assert [r.e2e_s for r in RECORDS[:4]] == [0.625, 0.25, 0.3125, 1.0]


def test_without_an_slo_every_request_meets_it_and_the_slo_columns_are_nan():
    row = summarize(hand_built()).row()
    assert row["requests"] == row["slo_met_requests"] == 4
    assert row["goodput_rps"] == row["throughput_rps"] == 2.0
    assert row["goodput_fraction"] == 1.0
    assert (row["ttft_slo_met"], row["tpot_slo_met"], row["e2e_slo_met"]) == (4, 4, 4)
    assert all(math.isnan(row[c]) for c in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2e_ms"))


def test_goodput_counts_the_requests_meeting_every_objective_that_is_set():
    # TTFT <= 125 ms: requests 0, 2, 3 (125 is at the threshold, which meets it); TPOT <= 100 ms: 1 (no TPOT), 2, 3.
    # Both: requests 2 and 3, so 2 of 4 requests, 1 per second over the 2 s.
    row = summarize(hand_built(Slo(ttft_ms=125, tpot_ms=100))).row()
    assert (row["ttft_slo_met"], row["tpot_slo_met"], row["e2e_slo_met"]) == (3, 3, 4)
    assert row["slo_met_requests"] == 2
    assert row["goodput_rps"] == 1.0 and row["goodput_fraction"] == 0.5
    assert (row["slo_ttft_ms"], row["slo_tpot_ms"]) == (125.0, 100.0) and math.isnan(row["slo_e2e_ms"])


def test_a_one_token_request_always_meets_a_tpot_objective():
    # TPOT <= 40 ms: request 1 (one output token) and request 2 (31.25 ms) only.
    summary = summarize(hand_built(Slo(tpot_ms=40)))
    assert summary.slo_met_requests == summary.tpot_slo_met == 2


def test_e2e_objective():
    # E2E <= 625 ms: requests 0 (at the threshold), 1, 2.
    assert summarize(hand_built(Slo(e2e_ms=625))).slo_met_requests == 3


def test_tpot_and_e2e_percentiles_of_the_measured_requests():
    row = summarize(hand_built()).row()
    # TPOT over the three multi-token requests, sorted [31.25, 62.5, 125]: the median, and p99 by linear interpolation
    # at rank 0.99 x 2 = 1.98: 62.5 + 0.98 x 62.5.
    assert row["tpot_p50_ms"] == pytest.approx(62.5)
    assert row["tpot_p99_ms"] == pytest.approx(123.75)
    # E2E sorted [250, 312.5, 625, 1000]: p50 between the middle two, p99 at rank 2.97: 625 + 0.97 x 375.
    assert row["e2e_p50_ms"] == pytest.approx(468.75)
    assert row["e2e_p99_ms"] == pytest.approx(988.75)


def test_load_imbalance_of_three_requests_on_one_worker_and_one_on_the_other():
    # Per worker [3, 1]: max / mean = 3 / 2; Jain = (3 + 1)^2 / (2 x (9 + 1)) = 16 / 20.
    row = summarize(hand_built()).row()
    assert row["imbalance_max_mean"] == 1.5
    assert row["jain_index"] == 0.8
    assert row["max_worker_share"] == 0.75  # the same imbalance as a share, unchanged


def test_idle_workers_count_in_the_imbalance():
    assert jain_index([4, 0, 0, 0]) == 0.25 and imbalance_max_mean([4, 0, 0, 0]) == 4.0
    assert jain_index([5, 5]) == 1.0 and imbalance_max_mean([5, 5]) == 1.0
    assert math.isnan(jain_index([0, 0])) and math.isnan(imbalance_max_mean([0, 0]))


def test_an_empty_run_has_nan_rates_not_errors():
    empty = RunResult(scenario_name="empty", num_workers=2, records=(), workers=(), measured_start_s=0.0,
                      measured_end_s=0.0, slo=Slo(ttft_ms=1))
    row = summarize(empty).row()
    assert row["slo_met_requests"] == 0
    for col in ("goodput_rps", "goodput_fraction", "tpot_p50_ms", "e2e_p99_ms", "imbalance_max_mean", "jain_index"):
        assert math.isnan(row[col]), col


def test_the_new_columns_are_appended_and_aggregated():
    # the host tier's appended after these, then the cost columns after those
    tail = len(TIER_COLUMNS) + len(COST_COLUMNS)
    assert SUMMARY_COLUMNS[-tail:] == TIER_COLUMNS + COST_COLUMNS
    assert SUMMARY_COLUMNS[-15 - tail:-3 - tail] == NEW_COLUMNS
    assert SUMMARY_COLUMNS[:8] == ("workers", "prefixes", "concurrency", "router", "engine", "repeat", "seed",
                                   "requests")
    key = {"workers": 2, "prefixes": 1, "concurrency": 1, "router": "random", "engine": "vllm"}
    rows = [key | summarize(hand_built(slo)).row() for slo in (Slo(ttft_ms=125, tpot_ms=100), Slo())]
    [agg] = aggregate(rows)
    assert agg["goodput_fraction"] == 0.75 and agg["goodput_rps"] == 1.5
    assert agg["jain_index"] == 0.8 and agg["jain_index_sd"] == 0.0
    for col in ("tpot_p50_ms", "tpot_p99_ms", "e2e_p99_ms", "imbalance_max_mean"):
        assert col in agg and f"{col}_sd" in agg


# --- properties ---------------------------------------------------------------------------------------------------

latency_s = st.floats(min_value=0.0, max_value=10.0, allow_nan=False)


@st.composite
def runs(draw):
    """A run of 1-30 measured requests on 1-6 workers, with arbitrary latencies and output lengths."""
    workers = draw(st.integers(1, 6))
    records = []
    for i in range(draw(st.integers(1, 30))):
        sent = draw(latency_s)
        first = sent + draw(latency_s)
        records.append(record(i, draw(st.integers(0, workers - 1)), sent, first, first + draw(latency_s),
                              draw(st.integers(1, 50))))
    return RunResult(scenario_name="drawn", num_workers=workers, records=tuple(records), workers=(),
                     measured_start_s=0.0, measured_end_s=30.0)


thresholds_ms = st.floats(min_value=1e-3, max_value=2e4, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(run=runs(), objective=st.sampled_from(["ttft_ms", "tpot_ms", "e2e_ms"]), a=thresholds_ms, b=thresholds_ms)
def test_goodput_fraction_grows_with_the_threshold_and_matches_a_naive_count(run, objective, a, b):
    low, high = sorted((a, b))
    fractions = []
    for threshold in (low, high):
        summary = summarize(replace(run, slo=Slo(**{objective: threshold})))
        latency = {"ttft_ms": lambda r: r.ttft_s * 1000, "e2e_ms": lambda r: r.e2e_s * 1000,
                   "tpot_ms": lambda r: 0.0 if r.tpot_s is None else r.tpot_s * 1000}[objective]
        assert summary.slo_met_requests == sum(latency(r) <= threshold for r in run.records)
        fractions.append(summary.goodput_fraction)
    assert 0.0 <= fractions[0] <= fractions[1] <= 1.0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 1000), min_size=1, max_size=12).filter(any))
def test_jain_index_lies_between_one_over_n_and_one(per_worker):
    n = len(per_worker)
    assert 1 / n - 1e-12 <= jain_index(per_worker) <= 1 + 1e-12
    assert 1 - 1e-12 <= imbalance_max_mean(per_worker) <= n + 1e-12


# --- the scenario's slo block and --slo ---------------------------------------------------------------------------

SCENARIO_HEAD = ("name: s\nmodel: {kv_bytes_per_token: 114688}\nengine: {kind: vllm, kv_cache_bytes: 1073741824}\n"
                 "workload: {prefixes: 2, prefix_tokens: 256, tail_tokens: 32, output_tokens: 8, min_requests: 20,"
                 " requests_per_prefix: 0, concurrency: 2}\ncluster: {workers: 2}\n")


def test_the_built_in_scenario_sets_no_slo():
    scenario, _ = load_scenario()
    assert scenario.slo == SloSpec() and not scenario.slo.to_slo().is_set


def test_a_scenario_slo_block_reaches_the_summary(tmp_path):
    from sim.runner import run

    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO_HEAD + "slo: {ttft_ms: 1.0e6, e2e_ms: 250}\n")
    scenario, _ = load_scenario(path)
    assert scenario.slo.to_slo() == Slo(ttft_ms=1e6, e2e_ms=250)
    result = run(scenario)
    summary = summarize(result)
    assert result.slo == summary.slo == Slo(ttft_ms=1e6, e2e_ms=250)
    assert summary.ttft_slo_met == summary.requests == 20
    assert summary.slo_met_requests == summary.e2e_slo_met == sum(r.e2e_s * 1000 <= 250 for r in result.measured)


@pytest.mark.parametrize("block,message", [
    ("{ttft_ms: -5}", "slo.ttft_ms: Input should be greater than 0"),
    ("{tpot_ms: 0}", "slo.tpot_ms: Input should be greater than 0"),
    ("{e2e_ms: .inf}", "slo.e2e_ms: Input should be a finite number"),
    ("{ttft_ms: .nan}", "slo.ttft_ms: Input should be a finite number"),
    ("{ttft: 200}", "slo.ttft: unknown key; did you mean ttft_ms?"),
    ("{fast: 200}", "slo.fast: unknown key; allowed: ttft_ms, tpot_ms, e2e_ms"),
    ("{ttft_ms: fast}", "slo.ttft_ms: Input should be a valid number"),
])
def test_a_bad_slo_block_names_the_field(tmp_path, block, message):
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO_HEAD + f"slo: {block}\n")
    with pytest.raises(ScenarioError, match="^" + re.escape(str(path)) + r":\d+:\d+: ") as err:
        load_scenario(path)
    assert message in str(err.value) and "\n" not in str(err.value)
    res = CliRunner().invoke(main, ["run", str(path)])
    assert res.exit_code == 1 and message in res.output and "Traceback" not in res.output


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_run_with_slo_writes_the_slo_and_goodput(tmp_path):
    res = invoke("run", "--prefixes", "2", "--workers", "2", "--concurrency", "2",
                 "--slo", "ttft_ms=150, e2e_ms=100000", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert "goodput_fraction" in res.output and "jain_index" in res.output
    [row] = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert set(NEW_COLUMNS) <= set(row)
    assert (row["slo_ttft_ms"], row["slo_tpot_ms"], row["slo_e2e_ms"]) == ("150", "nan", "100000")
    assert int(row["slo_met_requests"]) == int(row["ttft_slo_met"]) <= int(row["requests"])
    assert float(row["goodput_fraction"]) == pytest.approx(int(row["slo_met_requests"]) / int(row["requests"]))
    requests = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert all(float(r["tpot_ms"]) > 0 for r in requests)


def test_sweep_with_slo_shows_and_writes_goodput(tmp_path):
    res = invoke("sweep", "--prefixes", "2", "--workers", "2", "--concurrency", "2", "--jobs", "1",
                 "--slo", "tpot_ms=1000", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert "SLO met" in res.output
    [row] = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert row["slo_tpot_ms"] == "1000" and row["goodput_fraction"] == "1"
    assert row["slo_met_requests"] == row["requests"]


def test_sweep_without_slo_has_goodput_equal_to_throughput(tmp_path):
    res = invoke("sweep", "--prefixes", "2", "--workers", "2", "--concurrency", "2", "--jobs", "1", "--out",
                 str(tmp_path))
    assert res.exit_code == 0, res.output
    assert "SLO met" not in res.output
    [row] = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert row["goodput_rps"] == row["throughput_rps"] and row["goodput_fraction"] == "1"
    assert (row["slo_ttft_ms"], row["slo_tpot_ms"], row["slo_e2e_ms"]) == ("nan", "nan", "nan")


@pytest.mark.parametrize("command", [["run"], ["sweep", "--prefixes", "2"],
                                     ["replay", str(SYNTHETIC), "--workers", "2"]])
@pytest.mark.parametrize("value,message", [
    ("ttft=200", "unknown key 'ttft'; did you mean ttft_ms?"),
    ("fast=200", "unknown key 'fast'; allowed: ttft_ms, tpot_ms, e2e_ms"),
    ("ttft_ms=-1", "ttft_ms=-1: Input should be greater than 0"),
    ("e2e_ms=inf", "e2e_ms=inf: Input should be a finite number"),
    ("tpot_ms=soon", "tpot_ms=soon: Input should be a valid number"),
    ("tpot_ms", "'tpot_ms' is not KEY=MS with KEY one of ttft_ms, tpot_ms, e2e_ms"),
    ("tpot_ms=", "tpot_ms: give a value in ms"),
    ("ttft_ms=1,ttft_ms=2", "ttft_ms: given twice"),
    (",", "give KEY=MS,... with keys ttft_ms, tpot_ms, e2e_ms"),
])
def test_bad_slo_option_is_a_one_line_usage_error(command, value, message):
    res = CliRunner().invoke(main, [*command, "--slo", value])
    assert res.exit_code == 2
    assert "Traceback" not in res.output
    [error] = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert error.startswith("Error: Invalid value for '--slo': ") and message in error


def test_help_texts_explain_slo():
    for command in ("run", "sweep", "replay"):
        text = " ".join(invoke(command, "--help").output.split())
        assert "--slo" in text and "ttft_ms, tpot_ms, e2e_ms" in text and "goodput" in text, command


# --- hit rates and counters: one derivation for runs, replays and validation ----------------------------------------
# The four measured requests again (prompts of 100 tokens, a shareable prefix of 64), now with hits:
#   id  cached  of which from the host tier   hit  full hit  CPU hit
#   0   64      0                             yes  yes       no
#   1   32      32                            yes  no        yes
#   2   0       0                             no   no        no
#   3   64      16                            yes  yes       yes
HITS = tuple(replace(r, cached_tokens=c, cpu_cached_tokens=cpu)
             for r, (c, cpu) in zip(RECORDS[:4], ((64, 0), (32, 32), (0, 0), (64, 16))))


def test_runs_replays_and_validation_derive_the_same_hit_rates():
    summary = summarize(replace(hand_built(), records=HITS))
    stats = StreamingStats(num_workers=2)
    for r in HITS:
        stats.add(r)
    counts = RequestCounts(requests=4, hit_requests=3, full_hit_requests=2, prompt_tokens=400, cached_tokens=160,
                           span_s=2.0, cpu_hit_requests=2, cpu_cached_tokens=48)
    for rates in (summary, stats, counts):
        assert (rates.request_hit_rate, rates.full_hit_rate, rates.gpu_hit_rate, rates.cpu_hit_rate) == \
               (0.75, 0.5, 0.25, 0.5)
        assert (rates.prefix_reuse, rates.cpu_prefix_reuse, rates.throughput_rps) == (0.4, 0.12, 2.0)
    assert (summary.token_hit_rate, summary.cpu_token_hit_rate) == (0.4, 0.12)  # vLLM's names for the same rates
    assert math.isnan(RequestCounts(requests=0, hit_requests=0, full_hit_requests=0, prompt_tokens=0,
                                    cached_tokens=0, span_s=0.0).request_hit_rate)


def _counters(queries: int, hits: int, evicted: int, preempted: int, stored: int) -> EngineCounters:
    return EngineCounters(prefix_cache=PrefixCacheStats(requests=queries // 100, queries=queries, hits=hits),
                          evicted_blocks=evicted, evicted_tokens=16 * evicted, preemptions=preempted,
                          cpu_stored_blocks=stored, cpu_loaded_blocks=stored // 2, cpu_evicted_blocks=1)


def test_worker_counters_wrap_the_engine_counters_and_sum_into_the_summary():
    # Worker 0 at the end of the warm-ups and at the end; its measured phase is the difference.
    warm = WorkerCounters(0, "gpu-a", _counters(200, 64, 2, 0, 4), steps=10)
    end = WorkerCounters(0, "gpu-a", _counters(600, 224, 7, 1, 10), steps=25)
    measured = end.minus(warm)
    assert measured == WorkerCounters(0, "gpu-a", EngineCounters(
        prefix_cache=PrefixCacheStats(requests=4, queries=400, hits=160), evicted_blocks=5, evicted_tokens=80,
        preemptions=1, cpu_stored_blocks=6, cpu_loaded_blocks=3, cpu_evicted_blocks=0), steps=15)
    assert measured.token_hit_rate == 0.4
    other = WorkerCounters(1, "gpu-b", _counters(100, 0, 1, 2, 2), steps=3)
    total = total_counters([measured, other])
    assert (total.prefix_cache.queries, total.prefix_cache.hits, total.evicted_blocks, total.evicted_tokens,
            total.preemptions, total.cpu_stored_blocks, total.cpu_loaded_blocks, total.cpu_evicted_blocks) == \
           (500, 160, 6, 96, 3, 8, 4, 1)
    row = summarize(replace(hand_built(), workers=(measured, other))).row()
    assert (row["prefix_cache_queries"], row["prefix_cache_hits"], row["evicted_blocks"], row["evicted_tokens"],
            row["preemptions"], row["cpu_stored_blocks"], row["cpu_loaded_blocks"], row["cpu_evicted_blocks"]) == \
           (500, 160, 6, 96, 3, 8, 4, 1)
    assert total_counters([]) == EngineCounters(PrefixCacheStats(), 0, 0, 0)  # a run without workers counts nothing


# --- replay -------------------------------------------------------------------------------------------------------

def test_streaming_stats_count_like_the_summary():
    slo = Slo(ttft_ms=125, tpot_ms=100)
    stats = StreamingStats(num_workers=2, slo=slo)
    for r in RECORDS[:4]:
        stats.add(r)
    summary = summarize(hand_built(slo))
    assert (stats.slo_met_requests, stats.ttft_slo_met, stats.tpot_slo_met, stats.e2e_slo_met) == \
           (summary.slo_met_requests, summary.ttft_slo_met, summary.tpot_slo_met, summary.e2e_slo_met) == (2, 3, 3, 4)
    assert stats.goodput_fraction == 0.5 and stats.goodput_rps == 1.0  # 2 requests over 0 s .. 2 s
    assert stats.imbalance_max_mean == 1.5 and stats.jain_index == 0.8
    assert stats.tpot_ms.total == 3  # the one-token request has no TPOT
    assert stats.tpot_ms.percentile(50) == pytest.approx(62.5, rel=0.01)
    # The histogram's rank rule: the first bin whose running count passes 0.99 x (4 - 1) = 2.97, the third of
    # [250, 312.5, 625, 1000] (within its 1 % bin).
    assert stats.e2e_ms.percentile(99) == pytest.approx(625, rel=0.01)


def test_streaming_stats_of_different_slos_do_not_merge():
    with pytest.raises(ValueError, match="SLO"):
        StreamingStats(num_workers=2, slo=Slo(ttft_ms=1)).merge(StreamingStats(num_workers=2))


def test_a_replay_counts_against_the_scenario_slo_and_splits_exactly():
    scenario, _ = load_scenario(SCENARIOS / "trace-replay.yaml")
    scenario = scenario.with_overrides(**{"cluster.workers": 4, "router.name": "round-robin", "router.options": {},
                                          "slo": {"ttft_ms": 200, "tpot_ms": 10}})
    one = replay(scenario, read_mooncake(SYNTHETIC, block_size=64))
    split = replay(scenario, lambda: read_mooncake(SYNTHETIC, block_size=64), jobs=2)
    a, b = one.stats, split.stats
    assert a.slo == Slo(ttft_ms=200, tpot_ms=10)
    assert 0 < a.slo_met_requests < a.requests == 300
    assert a.slo_met_requests <= min(a.ttft_slo_met, a.tpot_slo_met) and a.e2e_slo_met == 300
    assert (a.slo_met_requests, a.ttft_slo_met, a.tpot_slo_met) == (b.slo_met_requests, b.ttft_slo_met,
                                                                       b.tpot_slo_met)
    assert a.tpot_ms.counts == b.tpot_ms.counts
    assert a.jain_index == b.jain_index == 1.0  # round-robin: 75 requests each


def test_replay_command_reports_slo_goodput_and_imbalance(tmp_path):
    res = invoke("replay", str(SYNTHETIC), "--workers", "4", "--kv-tokens", "500000", "--router", "round-robin",
                 "--slo", "ttft_ms=200", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    [row] = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert set(NEW_COLUMNS) <= set(row)
    assert row["slo_ttft_ms"] == "200" and row["slo_tpot_ms"] == "nan"
    assert int(row["slo_met_requests"]) == int(row["ttft_slo_met"]) < int(row["requests"]) == 300
    assert float(row["goodput_fraction"]) == pytest.approx(int(row["slo_met_requests"]) / 300)
    assert row["imbalance_max_mean"] == "1" and row["jain_index"] == "1"
    for col in NEW_COLUMNS:
        assert col in res.output, col
