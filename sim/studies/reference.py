"""Measured results that a scenario can be compared with: the tidy reference CSV."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

REQUIRED_COLUMNS = ("workers", "prefixes", "concurrency", "metric", "value")


@dataclass(frozen=True, slots=True)
class Measurement:
    workers: int
    prefixes: int
    concurrency: int
    metric: str
    value: float
    unit: str
    aggregation: str


def load_reference(path: str | Path) -> list[Measurement]:
    """Read a tidy measurement file: one row per (workers, prefixes, concurrency, metric)."""
    path = Path(path)
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {', '.join(missing)}; required: {', '.join(REQUIRED_COLUMNS)}")
        out = []
        for line, row in enumerate(reader, start=2):
            try:
                out.append(Measurement(
                    workers=int(row["workers"]), prefixes=int(row["prefixes"]),
                    concurrency=int(row["concurrency"]), metric=row["metric"], value=float(row["value"]),
                    unit=row.get("unit", ""), aggregation=row.get("aggregation", ""),
                ))
            except (TypeError, ValueError) as err:
                raise ValueError(f"{path}:{line}: {err}") from None
    return out


def measured(reference: list[Measurement], metric: str) -> dict[tuple[int, int, int], float]:
    """{(workers, prefixes, concurrency): value} for one metric."""
    return {(m.workers, m.prefixes, m.concurrency): m.value for m in reference if m.metric == metric}
