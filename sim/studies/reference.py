"""Measured results that a scenario can be compared with: the tidy reference CSV."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from pathlib import Path

from sim.csv_fields import finite_float, read_text, whole_number
from sim.scenario import Scenario, scenario_file_path

REQUIRED_COLUMNS = ("workers", "prefixes", "concurrency", "metric", "value")
METRICS = ("request_hit_rate", "token_hit_rate", "hit_requests", "miss_requests", "throughput_rps",
           *(f"ttft{kind}_p{q}" for kind in ("", "_hit", "_miss") for q in (50, 90, 99)))
"""The metrics a measured CSV may hold (rates as fractions, counts, TTFTs in ms, throughput in requests/s)."""


@dataclass(frozen=True, slots=True)
class Measurement:
    workers: int
    prefixes: int
    concurrency: int
    metric: str
    value: float
    unit: str
    aggregation: str


def reference_path(scenario: Scenario, scenario_path: Path) -> Path | None:
    """The file of the scenario's `reference:` (None without one): relative to the scenario file at `scenario_path`,
    or `kvsim:PATH` for one that ships with kvsim (`sim.scenario.SHIPPED`)."""
    return None if scenario.reference is None else scenario_file_path(scenario.reference, scenario_path.parent)


def load_reference(path: str | Path) -> list[Measurement]:
    """Read a tidy measurement file: one row per (workers, prefixes, concurrency, metric)."""
    path = Path(path)
    reader = csv.DictReader(io.StringIO(read_text(path), newline=""))
    missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
    if missing:
        raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; required: {', '.join(REQUIRED_COLUMNS)}")
    out = []
    seen: dict[tuple[int, int, int, str, str], int] = {}
    for line, row in enumerate(reader, start=2):
        values = {}
        for col, parse in (("workers", whole_number), ("prefixes", whole_number), ("concurrency", whole_number),
                           ("value", finite_float)):
            try:
                values[col] = parse(row[col], least=1 if parse is whole_number else 0)
            except ValueError as err:
                raise ValueError(f"{path}:{line}: column {col}: {err}") from None
        metric = (row["metric"] or "").strip()
        if metric not in METRICS:
            raise ValueError(f"{path}:{line}: column metric: unknown metric {metric!r}; allowed: {', '.join(METRICS)}")
        aggregation = row.get("aggregation") or ""
        key = (values["workers"], values["prefixes"], values["concurrency"], metric, aggregation)
        if key in seen:
            raise ValueError(f"{path}:{line}: duplicate row: workers={key[0]}, prefixes={key[1]}, "
                             f"concurrency={key[2]}, metric {metric} is already on line {seen[key]}")
        seen[key] = line
        out.append(Measurement(metric=metric, unit=row.get("unit") or "", aggregation=aggregation, **values))
    if not out:
        raise ValueError(f"{path}: no rows")
    return out


def measured(reference: list[Measurement], metric: str) -> dict[tuple[int, int, int], float]:
    """{(workers, prefixes, concurrency): value} for one metric."""
    return {(m.workers, m.prefixes, m.concurrency): m.value for m in reference if m.metric == metric}
