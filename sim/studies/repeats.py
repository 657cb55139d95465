"""Repeated measurements of one setup, compared as a group (`kvsim validate`): a figure's range over the repeats.

On a small shared machine the same run measured twice does not give the same tail (tests/fixtures/
real-vllm-sharing/README.md), so a prediction is held to the measured *range*: its error is how far it lies outside
[lowest, highest] over the repeats (0 inside), relative to the nearer end. The prediction's own sampling noise is
shown as a bootstrap interval of the percentile over the simulated requests (a p99 of 200 requests is the 2nd
largest of them).

Runs are repeats when their sidecars describe the same setup (every field kvsim reads: engine, workers, prefixes,
concurrency, requests, lengths, seed, capacity and limits); what only a measurement has (its times, counters,
endpoints) does not count.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from sim.servers.run_csv import Run, RunSetup

BOOTSTRAP_RESAMPLES = 1000
INTERVAL = (5.0, 95.0)  # a 90 % interval
_REPEAT_SUFFIX = re.compile(r"-r\d+$")
_PERCENTILE_METRIC = re.compile(r"^(ttft|e2e)_p(\d+)_ms$")


def setup_key(run: Run) -> str:
    """The sidecar's declared fields (what kvsim simulates), not what only a measurement has."""
    return json.dumps(run.setup.model_dump(include=set(RunSetup.model_fields)), sort_keys=True)


def repeat_groups(runs: Iterable[Run]) -> list[list[Run]]:
    """Runs of one setup, in the order first seen; only groups of two or more."""
    groups: dict[str, list[Run]] = {}
    for run in runs:
        groups.setdefault(setup_key(run), []).append(run)
    return [g for g in groups.values() if len(g) >= 2]


def group_label(runs: Sequence[Run]) -> str:
    """'w2-n7-c4-r* (3 repeats)': the first run's name with a trailing -rN starred."""
    stem = _REPEAT_SUFFIX.sub("-r*", runs[0].name)
    return f"{stem} ({len(runs)} repeats)"


def bootstrap_interval(values: np.ndarray, q: float, *, seed: int = 0) -> tuple[float, float]:
    """A 90 % percentile-bootstrap interval of the q-th percentile of `values` (seeded: the same every time)."""
    if len(values) < 10:
        return (math.nan, math.nan)
    rng = np.random.default_rng(seed)
    resamples = rng.choice(values, size=(BOOTSTRAP_RESAMPLES, len(values)), replace=True)
    stats = np.percentile(resamples, q, axis=1)
    lo, hi = np.percentile(stats, INTERVAL)
    return float(lo), float(hi)


@dataclass(frozen=True, slots=True)
class RepeatComparison:
    run: str
    """The group's label (group_label)."""
    metric: str
    measured_values: tuple[float, ...]
    predicted_values: tuple[float, ...]
    predicted_interval: tuple[float, float]
    """Bootstrap 90 % interval over the first repeat's simulated requests (NaN for figures that are no percentile)."""

    @property
    def measured(self) -> float:
        return float(np.median(self.measured_values))

    @property
    def measured_low(self) -> float:
        return min(self.measured_values)

    @property
    def measured_high(self) -> float:
        return max(self.measured_values)

    @property
    def predicted(self) -> float:
        return float(np.median(self.predicted_values))

    @property
    def error(self) -> float:
        """How far the predicted median lies outside the measured range (0 inside), in the metric's unit."""
        p = self.predicted
        if p > self.measured_high:
            return p - self.measured_high
        if p < self.measured_low:
            return p - self.measured_low
        return 0.0

    @property
    def relative_error(self) -> float:
        """`error` relative to the nearer end of the measured range."""
        err = self.error
        end = self.measured_high if err > 0 else self.measured_low
        return err / end if end else float("nan")


def compare_repeats(group: Sequence[Run], measured: dict[str, dict[str, float]],
                    predicted: dict[str, tuple[dict[str, float], dict[str, np.ndarray]]],
                    *, metrics: Sequence[str]) -> list[RepeatComparison]:
    """One comparison per metric for a group of repeats, from each run's measured and predicted figures, keyed by
    the run's file (and the first run's simulated per-request values, for the bootstrap)."""
    first_samples = predicted[str(group[0].csv_path)][1]
    out = []
    for metric in metrics:
        m = tuple(measured[str(r.csv_path)][metric] for r in group)
        p = tuple(predicted[str(r.csv_path)][0][metric] for r in group)
        if all(math.isnan(v) for v in m + p):
            continue
        found = _PERCENTILE_METRIC.match(metric)
        interval = (bootstrap_interval(first_samples[found.group(1)], float(found.group(2))) if found
                    else (math.nan, math.nan))
        out.append(RepeatComparison(group_label(group), metric, m, p, interval))
    return out
