"""The figures of sweeps, plans and replays: intervals over repeats, the panels they draw, and what can be checked
without eyes (tests/support/figure_checks.py): no text over another, every point inside its axes, every axis
named with its unit, no line through simulated points that would suggest values never simulated."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
from matplotlib.collections import PathCollection

from sim.results.figures import (
    draw_engines,
    draw_hit_rate,
    draw_plan,
    draw_replay,
    draw_ttft_cdf,
    hit_rate_figure,
    ms_log_axis,
    ttft_cdf_figure,
    ttft_panel_rows,
)
from sim.results.report import AGGREGATED_COLUMNS, aggregate
from sim.results.stats import t_interval
from sim.studies.plan import Evaluation, RouterPlan
from tests.support.figure_checks import (
    data_outside_axes,
    overlapping_texts,
    unlabelled_axes,
    visible_lines,
)

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


def _sweep_rows():
    return [_row(w, n, c, r, k, min(1.0, 0.9 / n ** 0.5 + 0.02 * k)) for w in (3, 6) for n in (2, 7, 12, 24)
            for c in (4, 8) for r in ("random", "kv-aware") for k in range(3)]


def test_hit_rate_figure_draws_simulated_points_without_a_line_between_them():
    fig = draw_hit_rate(aggregate(_sweep_rows()), capacity_requests=3.95, measured={(6, 7, 4): 0.525},
                        title="t", measured_label="measured (random, vllm)")
    for ax in fig.axes:
        # NOTE: only the formula is a curve; kvsim's N = 2, 7, 12, 24 are markers with their intervals
        assert [line.get_label() for line in visible_lines(ax)] == [
            "formula min(1, C/N), C = 3.95 prompts per worker"]
        series = [line for line in ax.lines if line.get_marker() in ("o", "s")]
        assert [(line.get_linestyle(), len(line.get_xydata())) for line in series] == [("None", 4), ("None", 4)]
    assert overlapping_texts(fig) == [] and data_outside_axes(fig) == [] and unlabelled_axes(fig) == []


def _outcome(workers, n, conc, repeat, *, router="random"):
    """One run's TTFTs: hits at 30-70 ms, misses at 100-400 ms, a tail of 1.5-2.4 s, and one of 5 s beyond the
    99.5th percentile (a curve drawn to it left the axes)."""
    hits = [30.0 + (i * 7 + repeat) % 40 for i in range(300 - 10 * n)]
    misses = [100.0 + (i * 13 + 5 * repeat) % 300 for i in range(10 * n)]
    misses += [1500.0 + 100 * i + 10 * repeat for i in range(10)] + [5000.0]
    return SimpleNamespace(point=SimpleNamespace(router=router, workers=workers, concurrency=conc, prefixes=n),
                           row={"engine": "vllm"}, ttft=SimpleNamespace(hit_ms=hits, miss_ms=misses))


MEASURED_TTFT = {(6, 7, 4): {"ttft_hit_p50": 41.0, "ttft_hit_p90": 63.0, "ttft_miss_p50": 107.0,
                             "ttft_miss_p90": 140.0, "ttft_p50": 63.0, "ttft_p99": 184.0}}


def test_ttft_cdf_draws_a_curve_per_n_inside_its_axes_on_named_ms_ticks():
    outcomes = [_outcome(w, n, 4, k) for w in (3, 6) for n in (2, 7, 12, 24) for k in range(3)]
    fig = draw_ttft_cdf(outcomes, title="t", measured=MEASURED_TTFT, measured_group=("random", "vllm"))
    for ax in fig.axes:
        assert len(visible_lines(ax)) == 4  # all requests, one curve per N (not hits and misses apart)
        assert [t.get_text() for t in ax.get_xticklabels()] == ["50", "100", "200", "500", "1,000", "2,000"]
        assert ax.get_ylim() == (0.005, 0.995)
        assert max(x for line in visible_lines(ax) for x in line.get_xdata()) < 5000.0
    assert data_outside_axes(fig) == [] and overlapping_texts(fig) == [] and unlabelled_axes(fig) == []
    assert [ax.get_xlabel() for ax in fig.axes] == ["TTFT (ms, log scale)"] * 2
    assert [ax.get_ylabel() for ax in fig.axes] == ["requests with TTFT ≤ x (%, logit scale)", ""]


def test_ttft_cdf_draws_the_measured_percentiles_beside_kvsims_with_its_interval():
    outcomes = [_outcome(w, n, 4, k) for w in (3, 6) for n in (2, 7) for k in range(3)]
    fig = draw_ttft_cdf(outcomes, title="t", measured=MEASURED_TTFT, measured_group=("random", "vllm"))
    by_title = {ax.get_title(): ax for ax in fig.axes}
    def diamonds(ax):
        return sorted(tuple(xy) for c in ax.collections if isinstance(c, PathCollection) for xy in c.get_offsets())

    assert diamonds(by_title["random, 6 workers, concurrency 4"]) == [(63.0, 0.5), (184.0, 0.99)]
    assert diamonds(by_title["random, 3 workers, concurrency 4"]) == []
    per_run = [o.ttft.hit_ms + o.ttft.miss_ms for o in outcomes if (o.point.workers, o.point.prefixes) == (6, 7)]
    kvsim = t_interval(float(np.percentile(run, 50)) for run in per_run)
    medians = [line for line in by_title["random, 6 workers, concurrency 4"].lines if line.get_marker() == "o"]
    assert [tuple(line.get_xydata()[0]) for line in medians][0] == pytest.approx((kvsim.mean, 0.5))
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert labels[-2:] == ["measured: all requests\np50 and p99",
                           "kvsim: the same percentiles,\nmean ± 95% CI over 3 runs"]


def test_ms_ticks_are_written_out_at_1_2_5_steps():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.set_xscale("log")
    ax.set_xlim(25, 3500)
    ms_log_axis(ax.xaxis, 25, 3500)
    fig.canvas.draw()
    assert [t.get_text() for t in ax.get_xticklabels()] == ["50", "100", "200", "500", "1,000", "2,000"]
    ms_log_axis(ax.xaxis, 60, 140)  # a narrow range: finer steps, still three or more
    assert list(ax.xaxis.get_major_locator().tick_values(60, 140)) == [60, 70, 80, 90, 100, 120]
    plt.close(fig)


def test_engine_figure_draws_markers_at_each_simulated_n_only():
    rows = [{**r, "engine": e} for e in ("vllm", "sglang") for r in _sweep_rows() if r["concurrency"] == 8]
    fig = draw_engines(aggregate(rows), capacity_requests=3.95, measured={(6, 7, 8): 0.55}, measured_engine="vllm",
                       title="t")
    for ax in fig.axes:
        assert [line.get_label() for line in visible_lines(ax)] == [
            "formula min(1, C/N), C = 3.95 prompts per worker"]
    assert overlapping_texts(fig) == [] and data_outside_axes(fig) == [] and unlabelled_axes(fig) == []


def test_plan_figure_draws_the_bisections_values_as_points_and_names_what_varies():
    evaluations = tuple(Evaluation(gib, (h - 0.02, h, h + 0.02), (200.0, 210.0, 220.0))
                        for gib, h in ((4.0, 0.6), (6.0, 0.85), (6.5, 0.88), (7.0, 0.91)))
    plan = RouterPlan("random", "kv-gib", 7.0, 7.0, evaluations,
                      tuple((g, min(1.0, g / 7.5)) for g in (1.0, 2.0, 4.0, 8.0, 16.0)))
    fig = draw_plan([plan], target_hit_rate=0.9, target_ttft_p99_ms=None, unit="GiB", title="t")
    [ax] = fig.axes
    assert ax.get_xlabel() == "GPU KV cache per worker (GiB)"
    assert sorted(line.get_label() for line in visible_lines(ax)) == [
        "random: analytic screen", "random: answer 7 GiB", "target"]
    assert ax.get_legend() is not None
    assert overlapping_texts(fig) == [] and unlabelled_axes(fig) == []


def test_replay_figure_names_its_axes_with_units():
    bins = {k: SimpleNamespace(prefix_reuse=0.1 * k, ttft_ms=SimpleNamespace(percentile=lambda q, k=k: 40 + k * q))
            for k in range(5)}
    fig = draw_replay(SimpleNamespace(bins=bins, bin_s=60.0), title="t")
    assert [ax.get_ylabel() for ax in fig.axes] == ["prefix reuse\n(cached / prompt tokens)", "TTFT (ms, log scale)"]
    assert overlapping_texts(fig) == [] and data_outside_axes(fig) == [] and unlabelled_axes(fig) == []
