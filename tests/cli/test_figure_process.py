"""A figure drawn by a second process (`sim.cli.figure_process`): the same PNG bytes as drawing it here, and drawn here
whenever the child cannot draw it (it failed, or the arguments do not pickle)."""

from __future__ import annotations

from types import SimpleNamespace

from sim.cli import figure_process
from sim.cli.figure_process import Painter
from sim.results.figures import replay_figure
from sim.results.streaming_stats import TimeBin


def _stats():
    bins = {}
    for k in range(4):
        b = bins[k] = TimeBin(requests=3, prompt_tokens=1000, cached_tokens=200 * k)
        for ttft_ms in (40.0 + k, 90.0 * (k + 1), 700.0):
            b.ttft_ms.add(ttft_ms)
    return SimpleNamespace(bins=bins, bin_s=60.0)


def test_the_child_draws_the_same_bytes_as_this_process():
    stats = _stats()
    painter = Painter(start=True)
    assert painter.png("replay_figure", stats, title="t") == replay_figure(stats, title="t")
    assert painter.drew_in_child


def test_a_failing_child_leaves_the_figure_to_this_process(monkeypatch):
    monkeypatch.setattr(figure_process, "_CHILD", "raise SystemExit(3)")
    stats = _stats()
    painter = Painter(start=True)
    assert painter.png("replay_figure", stats, title="t") == replay_figure(stats, title="t")
    assert not painter.drew_in_child


def test_arguments_that_do_not_pickle_are_drawn_here():
    bins = {k: SimpleNamespace(prefix_reuse=0.1 * k, ttft_ms=SimpleNamespace(percentile=lambda q, k=k: 40 + k * q))
            for k in range(3)}
    stats = SimpleNamespace(bins=bins, bin_s=60.0)
    painter = Painter(start=True)
    child = painter._child
    assert painter.png("replay_figure", stats, title="t") == replay_figure(stats, title="t")
    assert not painter.drew_in_child and child.poll() is not None  # ended, not left waiting


def test_an_unused_child_is_ended():
    painter = Painter(start=True)
    child = painter._child
    painter.close()
    assert child.poll() is not None
