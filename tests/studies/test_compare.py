"""`kvsim compare`: routers on the same request stream, intervals over repeats, the bound and the Pareto frontier."""

from __future__ import annotations

import csv
import math

import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from sim.cli import main
from sim.results.stats import over_runs, pareto_front, t_interval
from sim.runner import run
from sim.scenario import load_scenario
from sim.studies.compare import aggregate_routers, hit_rate_bound, trace_points
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


def test_t_interval_of_four_values_is_the_textbook_one():
    # mean 2.5, sd sqrt(5/3), t(0.975, 3) = 3.182446305 (Student's table): 3.182446305 x 1.290994449 / 2
    iv = t_interval([1.0, 2.0, 3.0, 4.0])
    assert iv.n == 4 and iv.mean == 2.5
    assert iv.sd == pytest.approx(math.sqrt(5 / 3), rel=1e-12)
    assert iv.half_width == pytest.approx(3.182446305284263 * math.sqrt(5 / 3) / 2, rel=1e-9)
    assert iv.half_width == pytest.approx(2.0543, abs=1e-4)


def test_t_interval_of_two_values_and_of_one():
    # n = 2: the half-width is t(0.975, 1) x |a - b| / 2 = 12.7062047 x 0.1
    assert t_interval([0.1, 0.3]).half_width == pytest.approx(1.270620474, rel=1e-8)
    one = t_interval([0.4, float("nan")])  # a nan (e.g. no misses in a run) is left out
    assert one.n == 1 and one.mean == 0.4 and math.isnan(one.sd) and math.isnan(one.half_width)
    assert t_interval([]).n == 0 and math.isnan(t_interval([]).mean)


def test_over_runs_is_the_interval_of_each_column_with_gaps_left_out():
    # Three runs: b is missing from one and None in another (left out, as a NaN is); c is in one run only.
    rows = [{"a": 1.0, "b": 2.0, "c": 5.0}, {"a": 2.0, "b": None}, {"a": 3.0}]
    iv = over_runs(rows, ("a", "b", "c", "d"))
    assert iv["a"] == t_interval([1.0, 2.0, 3.0]) and iv["a"].mean == 2.0 and iv["a"].n == 3
    assert (iv["b"].mean, iv["b"].n, iv["c"].n, iv["d"].n) == (2.0, 1, 1, 0)
    assert math.isnan(iv["b"].sd) and math.isnan(iv["b"].half_width)  # one run: NaN, never 0
    assert iv["a"].columns("a") == {"a": 2.0, "a_sd": 1.0, "a_ci95": iv["a"].half_width}


def test_pareto_front_on_a_hand_made_case():
    #            (hit rate, TTFT p99 ms)
    points = [(0.8, 400.0),   # best hit rate: on the front
              (0.7, 500.0),   # dominated by the first (lower hit rate, higher p99)
              (0.4, 180.0),   # lowest p99: on the front
              (0.4, 190.0),   # dominated by the third (same hit rate, higher p99)
              (0.8, 400.0),   # equal to the first: on the front with it
              (0.6, 250.0),   # between: on the front
              (float("nan"), 100.0)]  # no hit rate: never on the front
    assert pareto_front(points) == [True, False, True, False, True, True, False]


def _dominated_naive(p, others):
    return any(q[0] >= p[0] and q[1] <= p[1] and q != p for q in others)


@given(st.lists(st.tuples(st.sampled_from([0.1, 0.2, 0.5, 0.9]), st.sampled_from([100.0, 200.0, 300.0])),
                max_size=12))
@pytest.mark.slow
def test_pareto_front_matches_a_naive_check(points):
    front = pareto_front(points)
    for i, p in enumerate(points):
        assert front[i] == (not _dominated_naive(p, points[:i] + points[i + 1:]))


def test_the_bound_is_what_the_cluster_holds():
    assert hit_rate_bound(6, 3.95, 24) == pytest.approx(6 * 3.95 / 24)
    assert hit_rate_bound(3, 3.95, 7) == 1.0
    with pytest.raises(ValueError, match="prefixes >= 1"):
        hit_rate_bound(3, 3.95, 0)


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


@pytest.mark.slow
def test_compare_command_writes_the_table_and_files(tmp_path):
    res = invoke("compare", "--prefixes", 7, "--workers", 3, "--concurrency", 4,
                 "--router", "random,prefix-hash,kv-aware", "--repeats", 2, "--jobs", 1, "--out", tmp_path)
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())  # rich wraps titles and captions to the table's width
    assert "3 workers, N = 7, concurrency 4" in text and "★" in text
    assert "bound min(1, W·C/N) = min(1, 3·3.95/7) = 1.000" in text
    rows = list(csv.DictReader((tmp_path / "compare.csv").open()))
    assert len(rows) == 3 and {r["router"] for r in rows} == {"random", "prefix-hash", "kv-aware"}
    for col in ("workers", "prefixes", "concurrency", "router", "repeats", "bound", "random_expectation",
                "fraction_of_bound", "on_front", "request_hit_rate", "request_hit_rate_sd", "request_hit_rate_ci95",
                "token_hit_rate", "ttft_p50_ms", "ttft_p99_ms", "ttft_p99_ms_ci95", "throughput_rps"):
        assert col in rows[0], col
    hits = [float(r["request_hit_rate"]) for r in rows]
    assert hits == sorted(hits, reverse=True)
    assert any(r["on_front"] == "True" for r in rows)
    assert all(r["repeats"] == "2" and r["primary_metric"] == "request_hit_rate" for r in rows)
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
