"""`kvsim compare`: routers on the same request stream, intervals over repeats, the bound and the Pareto frontier."""

from __future__ import annotations

import csv
import math

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.runner import run
from sim.scenario import load_scenario
from sim.studies.compare import aggregate_routers, trace_points
from sim.studies.sweep import sweep_points
from tests.support.paths import TRACES

SYNTHETIC = TRACES / "synthetic_head300.jsonl"


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_every_router_sees_the_same_request_stream():
    base, _ = load_scenario(None)
    routers = ["random", "round-robin", "prefix-hash", "kv-aware"]
    streams = {}
    for point in sweep_points(workers=[3], prefixes=[7], concurrency=[4], routers=routers, repeats=1, seed=11):
        records = sorted(run(point.scenario(base)).records, key=lambda r: r.request_id)
        streams[point.router] = [(r.request_id, r.prefix_id, r.prompt_tokens, r.warmup) for r in records]
    first = streams["random"]
    assert len(first) == 200 + 7 and len({p for _, p, _, _ in first}) == 7
    assert all(s == first for s in streams.values())
    # and a router does change where they go: the streams are equal, the choices are not
    chosen = {}
    for point in sweep_points(workers=[3], prefixes=[7], concurrency=[4], routers=["random", "prefix-hash"],
                              repeats=1, seed=11):
        chosen[point.router] = [r.worker for r in sorted(run(point.scenario(base)).records, key=lambda r: r.request_id)]
    assert chosen["random"] != chosen["prefix-hash"]


def test_repeat_r_of_a_trace_uses_seed_plus_r_for_every_router():
    points = trace_points(workers=[2, 4], routers=["random", "kv-aware"], repeats=3, seed=40)
    assert [(p.workers, p.router, p.repeat, p.seed) for p in points[:3]] == [
        (2, "random", 0, 40), (2, "random", 1, 41), (2, "random", 2, 42)]
    assert {p.seed for p in points if p.router == "kv-aware" and p.workers == 4} == {40, 41, 42}


def test_aggregate_routers_adds_the_interval_the_bound_and_the_front():
    def row(router, repeat, hit, p99):
        return {"workers": 2, "prefixes": 8, "concurrency": 4, "router": router, "engine": "vllm", "repeat": repeat,
                "request_hit_rate": hit, "ttft_p99_ms": p99, "token_hit_rate": hit / 2}
    rows = [row("slow", 0, 0.5, 300.0), row("slow", 1, 0.7, 500.0),
            row("fast", 0, 0.2, 100.0), row("fast", 1, 0.2, 120.0),
            row("bad", 0, 0.1, 400.0), row("bad", 1, 0.2, 400.0)]
    agg = aggregate_routers(rows, capacity_requests=2.0)
    assert [a["router"] for a in agg] == ["slow", "fast", "bad"]  # by hit rate, highest first
    slow = agg[0]
    assert slow["request_hit_rate"] == pytest.approx(0.6) and slow["repeats"] == 2
    assert slow["request_hit_rate_ci95"] == pytest.approx(12.706204736 * 0.1, rel=1e-8)
    assert slow["bound"] == 0.5 and slow["random_expectation"] == 0.25  # min(1, 2·2/8), min(1, 2/8)
    assert slow["fraction_of_bound"] == pytest.approx(1.2)
    assert [a["on_front"] for a in agg] == [True, True, False]
    assert "prefix_reuse" not in slow and "goodput_rps" not in slow  # only metrics the rows have


def test_a_router_leads_only_beyond_the_intervals():
    def row(router, repeat, hit, rps):
        return {"workers": 2, "prefixes": 8, "concurrency": 4, "router": router, "engine": "vllm", "repeat": repeat,
                "request_hit_rate": hit, "ttft_p99_ms": 100.0, "throughput_rps": rps}
    rows = [row("a", 0, 0.90, 10.0), row("a", 1, 0.92, 10.4), row("a", 2, 0.91, 9.6),
            row("b", 0, 0.50, 10.1), row("b", 1, 0.52, 10.5), row("b", 2, 0.51, 9.7),
            row("c", 0, 0.49, 5.0), row("c", 1, 0.53, 5.2), row("c", 2, 0.51, 5.1)]
    agg = {a["router"]: a for a in aggregate_routers(rows, capacity_requests=2.0)}
    # hit rate: a (0.91 ± 0.02) leads beyond the intervals; b and c (0.51) are both behind it
    assert [agg[r]["verdict"] for r in "abc"] == ["best", "behind", "behind"]
    # throughput: b (10.1) and a (10.0) are within each other's intervals; c (5.1) is behind
    assert [agg[r]["objective_verdict"] for r in "abc"] == ["indistinguishable", "not settled", "behind"]
    # sd 0.4 each, a gap of 0.1: t(0.975, n - 1) x 0.8 / sqrt(n) < 0.1 first at n = 249 (an estimate)
    assert agg["b"]["objective"] == "throughput_rps" and agg["b"]["objective_repeats_to_separate"] == 249
    assert math.isnan(agg["c"]["objective_repeats_to_separate"])  # behind: nothing to estimate


@pytest.mark.slow
def test_compare_command_writes_the_table_and_files(tmp_path):
    res = invoke("compare", "--prefixes", 7, "--workers", 3, "--concurrency", 4,
                 "--router", "random,prefix-hash,kvsim", "--repeats", 2, "--jobs", 1, "--out", tmp_path)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # rich wraps titles and captions to the table's width
    assert "kvsim†" in text and "† kvsim's own policy (policies/kvsim_router.py)" in text
    assert "request_hit_rate: " in text and "throughput_rps: " in text  # a verdict line on each
    assert "3 workers, N = 7, concurrency 4" in text and "★" in text
    assert "bound min(1, W·C/N) = min(1, 3·3.95/7) = 1.000" in text
    rows = list(csv.DictReader((tmp_path / "compare.csv").open()))
    assert len(rows) == 3 and {r["router"] for r in rows} == {"random", "prefix-hash", "kvsim"}  # not marked
    for col in ("workers", "prefixes", "concurrency", "router", "repeats", "bound", "random_expectation",
                "fraction_of_bound", "on_front", "request_hit_rate", "request_hit_rate_sd", "request_hit_rate_ci95",
                "token_hit_rate", "ttft_p50_ms", "ttft_p99_ms", "ttft_p99_ms_ci95", "throughput_rps"):
        assert col in rows[0], col
    hits = [float(r["request_hit_rate"]) for r in rows]
    assert hits == sorted(hits, reverse=True)
    assert any(r["on_front"] == "True" for r in rows)
    assert all(r["repeats"] == "2" and r["primary_metric"] == "request_hit_rate" for r in rows)
    assert list(rows[0])[-5:] == ["verdict", "repeats_to_separate", "objective", "objective_verdict",
                                  "objective_repeats_to_separate"]
    runs = list(csv.DictReader((tmp_path / "summary.csv").open()))
    seeds = sorted({int(r["seed"]) for r in runs})
    assert len(runs) == 6 and seeds == [seeds[0], seeds[0] + 1]  # repeat r: seed + r, for every router
    for name in ("compare.png", "compare_hit_rate.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_compare_on_a_trace_uses_the_prefix_reuse_and_the_reuse_available(tmp_path):
    res = invoke("compare", "--trace", SYNTHETIC, "--limit", 80, "--workers", 2, "--kv-tokens", 200000,
                 "--router", "round-robin,kv-aware", "--repeats", 2, "--jobs", 1, "--out", tmp_path)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "prefix reuse" in text and "bound: reuse available" in text
    rows = list(csv.DictReader((tmp_path / "compare.csv").open()))
    assert len(rows) == 2 and {r["primary_metric"] for r in rows} == {"prefix_reuse"}
    for r in rows:
        assert r["prefixes"] == "" and r["concurrency"] == ""
        assert float(r["bound"]) == pytest.approx(float(r["reuse_available"]))
        assert float(r["fraction_of_bound"]) == pytest.approx(float(r["prefix_reuse"]) / float(r["reuse_available"]),
                                                              rel=1e-4)
    rr = next(r for r in rows if r["router"] == "round-robin")
    assert float(rr["prefix_reuse_sd"]) == 0.0  # no randomness in round-robin: the repeats agree
    runs = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert len(runs) == 4 and all(int(r["requests"]) == 80 for r in runs)
    assert (tmp_path / "compare.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.parametrize("args,message", [
    ([], "give --prefixes (the built-in workload) or --trace FILE"),
    (["--prefixes", "2", "--router", "recorded"], "recorded replays a recorded run's choices"),
    (["--prefixes", "2", "--router", "magic"], "unknown router magic; allowed: "),
    (["--prefixes", "2", "--kv-tokens", "1000"], "--kv-tokens goes with --trace"),
    (["--trace", str(SYNTHETIC), "--prefixes", "2"], "--prefixes does not apply to --trace"),
    (["--trace", "/nonexistent.jsonl"], "does not exist"),
    (["--prefixes", "2", "--repeats", "0"], "--repeats"),
    (["--prefixes", "2,x"], "is not a comma-separated list of whole numbers"),
])
def test_bad_input_is_a_one_line_usage_error(args, message):
    res = CliRunner().invoke(main, ["compare", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert "Traceback" not in res.output and res.exception is None or isinstance(res.exception, SystemExit)
