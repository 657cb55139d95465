"""The sweep's figures: intervals over repeats, the panels they draw, and that they render."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

from sim.results.figures import hit_rate_figure, ttft_cdf_figure, ttft_panel_rows
from sim.results.report import AGGREGATED_COLUMNS, aggregate
from sim.results.stats import t_interval

PNG = b"\x89PNG\r\n\x1a\n"


def _row(workers, n, conc, router, repeat, hit):
    return {**dict.fromkeys(AGGREGATED_COLUMNS, 1.0), "workers": workers, "prefixes": n, "concurrency": conc, "router": router, "engine": "vllm",
            "repeat": repeat, "request_hit_rate": hit, "full_hit_rate": hit, "token_hit_rate": hit,
            "ttft_p50_ms": 50.0, "ttft_p99_ms": 200.0, "throughput_rps": 10.0, "preemptions": 0,
            "max_worker_share": 0.2, "reuse_available": 0.8, "reuse_captured": 0.6, "reuse_delivered": hit,
            "view_false_hit_rate": float("nan")}


def test_aggregate_gives_the_t_interval_of_the_repeats():
    rows = [_row(3, 7, 4, "random", k, h) for k, h in enumerate((0.50, 0.56, 0.59))]
    [agg] = aggregate(rows)
    assert agg["request_hit_rate"] == pytest.approx(0.55)
    assert agg["request_hit_rate_ci95"] == pytest.approx(t_interval([0.50, 0.56, 0.59]).half_width)
    # t(0.975, 2) = 4.302653 x sd 0.045826 / sqrt(3)
    assert agg["request_hit_rate_ci95"] == pytest.approx(4.302653 * 0.0458258 / 3 ** 0.5, rel=1e-5)
    [one] = aggregate(rows[:1])  # one run says nothing of the spread: NaN, as every aggregation of runs gives
    assert one["request_hit_rate"] == 0.50
    assert math.isnan(one["request_hit_rate_sd"]) and math.isnan(one["request_hit_rate_ci95"])


def test_hit_rate_figure_draws_a_panel_per_workers_and_concurrency():
    rows = [_row(w, n, c, r, k, 0.9 / n ** 0.5) for w in (3, 6) for n in (2, 7) for c in (4, 8)
            for r in ("random", "kv-aware") for k in range(2)]
    png = hit_rate_figure(aggregate(rows), capacity_requests=3.95, measured={(6, 7, 4): 0.525, (3, 2, 8): 0.98},
                          title="t", measured_label="measured (random, vllm)")
    assert png[:8] == PNG and len(png) > 20_000


def test_ttft_panels_are_a_row_per_router_and_concurrency_until_too_many():
    keys = [(r, "vllm", c) for r in ("kv-aware", "random") for c in (4, 8)]
    rows, note = ttft_panel_rows(keys, ("random", "vllm"))
    assert rows == sorted(keys) and note == ""
    many = [(f"r{i:02d}", "vllm", 8) for i in range(9)] + [("random", "vllm", 8)]
    rows, note = ttft_panel_rows(many, ("random", "vllm"))
    assert rows == [("random", "vllm", 8)] and "random only (10 routers or engines ran" in note
    rows, _ = ttft_panel_rows(many, ("absent", "vllm"))
    assert rows == [("r00", "vllm", 8)]


def test_ttft_cdf_figure_draws_measured_percentiles_beside_the_curves():
    outcomes = [SimpleNamespace(point=SimpleNamespace(router="random", workers=w, concurrency=4, prefixes=n),
                                row={"engine": "vllm"},
                                ttft=SimpleNamespace(hit_ms=[30.0 + i for i in range(40)],
                                                     miss_ms=[100.0 + 3 * i for i in range(40)]))
                for w in (3, 6) for n in (2, 7)]
    measured = {(6, 7, 4): {"ttft_hit_p50": 41.0, "ttft_hit_p90": 63.0, "ttft_miss_p50": 107.0,
                            "ttft_miss_p90": 140.0, "ttft_p50": 63.0, "ttft_p99": 184.0}}
    png = ttft_cdf_figure(outcomes, title="t", measured=measured, measured_group=("random", "vllm"))
    assert png[:8] == PNG and len(png) > 20_000
