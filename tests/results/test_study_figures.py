"""The figures of router studies (`kvsim compare`, `tune`, `plan router`): labels that never cover each other, a
point or a leader line; routers on the same spot under one label; a frontier drawn (and in the legend) as a line only
where it has two or more routers; intervals that stop where their quantity does; units on every axis."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from matplotlib.lines import Line2D
from matplotlib.text import Annotation

from sim.results.study_figures import (
    _coincident,
    compare_figure,
    draw_choose_router,
    draw_compare,
    draw_compare_bars,
    draw_tune,
)
from sim.studies.tune import Constraint, Metric
from tests.support.figure_checks import (
    data_outside_axes,
    leaders_through_texts,
    overlapping_texts,
    unlabelled_axes,
    visible_lines,
)

# (router, TTFT p99 ms ± , request hit rate ±, on the frontier): the shape of `kvsim compare` at 6 workers, N = 24,
# concurrency 8 (3 runs): one router ahead, a band near 0.8, a low cluster of load-only routers on random routing's
# line, and two routers on exactly the same spot.
ROUTERS = [
    ("kvsim", 199, 8, 0.912, 0.005, True),
    ("vllm-router-prefix-aware", 400, 350, 0.831, 0.129, False),
    ("aibrix-prefix-cache", 400, 350, 0.831, 0.129, False),
    ("vllm-router-session", 553, 240, 0.808, 0.047, False),
    ("llm-d", 258, 125, 0.784, 0.034, False),
    ("preble", 285, 130, 0.754, 0.023, False),
    ("prefix-hash", 1011, 20, 0.677, 0.041, False),
    ("kv-aware", 210, 5, 0.439, 0.079, False),
    ("vllm-router-loadaware", 255, 110, 0.324, 0.031, False),
    ("least-loaded", 330, 40, 0.177, 0.018, False),
    ("aibrix-least-kv-cache", 1050, 250, 0.170, 0.036, False),
    ("sglang-cache-aware", 835, 40, 0.167, 0.029, False),
    ("random", 765, 120, 0.163, 0.044, False),
    ("sticky", 388, 30, 0.163, 0.023, False),
    ("p2c", 310, 60, 0.156, 0.052, False),
    ("round-robin", 210, 2, 0.149, 0.003, False),
]


def _aggregated(routers=ROUTERS):
    return [{"workers": 6, "prefixes": 24, "concurrency": 8, "router": name, "primary_metric": "request_hit_rate",
             "request_hit_rate": hit, "request_hit_rate_ci95": hit_ci, "ttft_p99_ms": float(p99),
             "ttft_p99_ms_ci95": float(p99_ci), "on_front": front, "bound": 0.987, "random_expectation": 0.165,
             "fraction_of_bound": hit / 0.987} for name, p99, p99_ci, hit, hit_ci, front in routers]


def _labels(fig) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in ax.texts if isinstance(t, Annotation) and t.xycoords == "data"]


def test_compare_labels_cover_no_text_point_or_leader_and_stay_inside():
    fig = draw_compare(_aggregated(), capacity_requests=3.95, title="t")
    assert overlapping_texts(fig) == []
    assert leaders_through_texts(fig) == []
    assert data_outside_axes(fig) == []
    assert unlabelled_axes(fig) == []
    [ax] = fig.axes
    inside = ax.get_window_extent()
    for text in ax.texts:
        if isinstance(text, Annotation) and text.xycoords == "data":
            box = text.get_window_extent()
            assert inside.x0 <= box.x0 and box.x1 <= inside.x1 and inside.y0 <= box.y0 and box.y1 <= inside.y1


def test_routers_on_the_same_spot_share_one_label_and_every_router_is_named_once():
    labels = _labels(draw_compare(_aggregated(), capacity_requests=3.95, title="t"))
    assert "vllm-router-prefix-aware\naibrix-prefix-cache" in labels
    assert sorted(name for label in labels for name in label.split("\n")) == sorted(r[0] for r in ROUTERS)


def test_coincident_points_group_by_complete_linkage():
    # 0 and 1 overlap, 2 is 6 px from 1 but 10 px from 0: a chain, not one spot
    assert _coincident([(0, 0), (4, 0), (10, 0), (100, 100)]) == [[0, 1], [2], [3]]
    assert _coincident([(0, 0), (0, 0), (0, 3)]) == [[0, 1, 2]]


def _frontier_legend(fig):
    [legend] = fig.legends
    [handle] = [h for h, t in zip(legend.legend_handles, legend.get_texts()) if "frontier" in t.get_text()]
    return handle


def test_a_frontier_of_one_router_is_a_point_not_a_line():
    fig = draw_compare(_aggregated(), capacity_requests=3.95, title="t")
    [ax] = fig.axes
    assert [line for line in visible_lines(ax) if line.get_drawstyle() == "steps-post"] == []
    handle = _frontier_legend(fig)
    assert handle.get_linewidth() == 0 and handle.get_marker() == "o"


def test_a_frontier_of_two_routers_is_a_step_line_in_the_legend_too():
    routers = [(*r[:5], r[0] in ("kvsim", "round-robin")) for r in ROUTERS]
    fig = draw_compare(_aggregated(routers), capacity_requests=3.95, title="t")
    [ax] = fig.axes
    [step] = [line for line in visible_lines(ax) if line.get_drawstyle() == "steps-post"]
    assert step.get_xydata().tolist() == [[199.0, 0.912], [210.0, 0.149]]
    assert _frontier_legend(fig).get_linewidth() > 0


def test_on_a_trace_the_legend_speaks_of_reuse():
    rows = [{**r, "primary_metric": "prefix_reuse", "prefix_reuse": r["request_hit_rate"] * 0.35,
             "prefix_reuse_ci95": r["request_hit_rate_ci95"] * 0.35, "bound": 0.32, "random_expectation": math.nan,
             "prefixes": None, "concurrency": None} for r in _aggregated()]
    fig = draw_compare(rows, capacity_requests=None, title="t")
    assert "dominated: another router reuses more at a lower TTFT p99" in [
        t.get_text() for t in fig.legends[0].get_texts()]
    assert fig.axes[0].get_ylabel() == "prefix reuse (cached / prompt tokens)"
    assert overlapping_texts(fig) == [] and leaders_through_texts(fig) == [] and data_outside_axes(fig) == []


def test_compare_intervals_stop_at_zero_ms_and_at_a_hit_rate_of_one():
    fig = draw_compare(_aggregated([("a", 100, 300, 0.95, 0.2, True), ("b", 500, 50, 0.5, 0.1, False)]),
                       capacity_requests=3.95, title="t")
    [ax] = fig.axes
    ends = [seg for c in ax.collections for seg in c.get_segments()]
    assert min(x for seg in ends for x, _ in seg) == 0.0
    assert max(y for seg in ends for _, y in seg) == 1.0
    assert data_outside_axes(fig) == []


def test_compare_is_drawn_the_same_way_twice():
    def drawn():
        fig = draw_compare(_aggregated(), capacity_requests=3.95, title="t")
        return [(t.get_text(), t.xyann, t.get_ha(), t.get_va()) for t in fig.axes[0].texts]

    assert drawn() == drawn()
    assert compare_figure(_aggregated(), capacity_requests=3.95, title="t")[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("capacity", [3.95, None], ids=["builtin", "trace"])
def test_compare_bars_are_readable_with_every_value_beside_its_bar(capacity):
    rows = _aggregated()
    if capacity is None:  # a trace: prefix reuse of a few tenths, the axis ends near 0.4
        rows = [{**r, "primary_metric": "reuse_captured", "reuse_captured": r["request_hit_rate"] * 0.35,
                 "reuse_captured_ci95": r["request_hit_rate_ci95"] * 0.35, "bound": 0.32,
                 "random_expectation": math.nan} for r in rows]
    fig = draw_compare_bars(rows, capacity_requests=capacity, title="t")
    assert overlapping_texts(fig) == [] and unlabelled_axes(fig) == []
    [ax] = [ax for ax in fig.axes if ax.get_visible()]
    assert len([t for t in ax.texts if "of bound" in t.get_text()]) == len(ROUTERS)
    assert "hit rate" in fig._suptitle.get_text() if capacity else "prefix reuse and TTFT" in fig._suptitle.get_text()


def _trial(number, x, p99, *, feasible=True, front=False, ci=(0.02, 30.0), column="request_hit_rate"):
    return SimpleNamespace(number=number, params={"w": float(number)}, router=f"kv-aware:w={number}",
                           means={column: x, "ttft_p99_ms": p99}, ci95={column: ci[0], "ttft_p99_ms": ci[1]},
                           feasible=feasible, on_front=front, is_baseline=number == 0)


def _tune_result(front_numbers):
    trials = [_trial(0, 0.46, 210.0), _trial(1, 0.8, 203.0), _trial(2, 0.3, 450.0, feasible=False),
              _trial(3, 0.7, 150.0)]
    trials = [SimpleNamespace(**{**vars(t), "on_front": t.number in front_numbers}) for t in trials]
    return SimpleNamespace(pareto=(Metric("request_hit_rate", True), Metric("ttft_p99_ms", False)), trials=trials,
                           front=[t for t in trials if t.on_front], baseline=trials[0], answer=trials[1], best=1,
                           constraints=(Constraint("ttft_p99_ms", "<=", 215.0),), router="kv-aware")


@pytest.mark.parametrize("front, line", [((1,), False), ((1, 3), True)])
def test_tune_draws_its_front_as_a_staircase_only_with_two_or_more_trials(front, line):
    fig = draw_tune(_tune_result(front), title="t")
    [ax] = fig.axes
    assert bool([ln for ln in visible_lines(ax) if ln.get_drawstyle().startswith("steps")]) is line
    [entry] = [h for h, t in zip(ax.get_legend().legend_handles, ax.get_legend().get_texts())
               if t.get_text().startswith("Pareto front")]
    assert (isinstance(entry, Line2D) and entry.get_linestyle() not in ("None", "none", "")) is line
    assert overlapping_texts(fig) == [] and data_outside_axes(fig) == [] and unlabelled_axes(fig) == []


def test_plan_router_intervals_stop_at_zero():
    default, wide = _trial(0, 9.2, 210.0, column="goodput_rps"), _trial(1, 9.7, 260.0, ci=(1.5, 310.0),
                                                                         column="goodput_rps")
    result = SimpleNamespace(pareto=(Metric("goodput_rps", True), Metric("ttft_p99_ms", False)),
                             trials=[default, wide], baseline=default, answer=wide, router="llm-d",
                             constraints=(Constraint("ttft_p99_ms", "<=", 250.0),))
    fig = draw_choose_router(SimpleNamespace(results=[result], best=0), title="t")
    [ax] = fig.axes
    lows = [y for c in ax.collections if hasattr(c, "get_segments") for seg in c.get_segments() for _, y in seg]
    assert min(lows) == 0.0  # 260 - 310 ms would be a negative TTFT
    assert ax.get_xlabel() == "goodput_rps (requests/s), higher is better"
    assert overlapping_texts(fig) == [] and unlabelled_axes(fig) == []
