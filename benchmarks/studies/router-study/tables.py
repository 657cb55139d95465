"""The router-study tables of docs/studies/router-study.md, in Markdown, from the study's CSVs (run `run_study.sh` first).

    .venv/bin/python benchmarks/studies/router-study/tables.py
"""

from __future__ import annotations

import csv
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
OTHERS_SHOWN = 1  # the best production router besides kvsim's own


def read(path: Path) -> list[dict[str, str]]:
    with path.open() as f:
        return list(csv.DictReader(f))


def f(row: dict[str, str], key: str) -> float:
    return float(row[key])


def cell(row: dict[str, str], primary: str) -> str:
    return f"{f(row, primary):.3f} / {f(row, 'ttft_p99_ms'):.0f}"


def grid_table() -> None:
    rows = read(HERE / "builtin" / "compare.csv")
    points = sorted({(int(r["workers"]), int(r["concurrency"]), int(r["prefixes"])) for r in rows})
    print("| W | C | N | bound | kvsim | kv-aware (defaults) | best other router | random |")
    print("|---|---|---|---|---|---|---|---|")
    for w, c, n in points:
        at = {r["router"]: r for r in rows if (int(r["workers"]), int(r["concurrency"]), int(r["prefixes"])) == (w, c, n)}
        others = sorted((r for name, r in at.items() if name not in ("kvsim", "kv-aware", "random")),
                        key=lambda r: -f(r, "request_hit_rate"))
        best = others[0]
        print(f"| {w} | {c} | {n} | {f(at['kvsim'], 'bound'):.3f} | {cell(at['kvsim'], 'request_hit_rate')} "
              f"({f(at['kvsim'], 'fraction_of_bound'):.2f}) | {cell(at['kv-aware'], 'request_hit_rate')} | "
              f"{best['router']} {cell(best, 'request_hit_rate')} | {cell(at['random'], 'request_hit_rate')} |")


def trace_table() -> None:
    parts = ["conversation-3.0M", "conversation-1.0M", "synthetic-3.0M", "synthetic-1.0M"]
    print("| router | " + " | ".join(parts) + " |")
    print("|---|" + "---|" * len(parts))
    tables = {p: {r["router"]: r for r in read(HERE / p / "compare.csv")} for p in parts if (HERE / p).exists()}
    print("| reuse available | " + " | ".join(f"{f(next(iter(t.values())), 'bound'):.3f}" for t in tables.values()) + " |")
    order = sorted(next(iter(tables.values())), key=lambda r: -f(tables[parts[0]][r], "token_hit_rate"))
    for router in order:
        cells = []
        for t in tables.values():
            r = t[router]
            cells.append(f"{f(r, 'token_hit_rate'):.3f} / {f(r, 'ttft_p99_ms'):.0f} / {f(r, 'goodput_fraction'):.3f}")
        print(f"| {router} | " + " | ".join(cells) + " |")


def failure_table() -> None:
    rows = read(HERE / "failure_modes.csv")
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    routers = sorted({r["router"] for r in rows},
                     key=lambda name: -statistics.fmean(f(r, "request_hit_rate") for r in rows if r["router"] == name))
    print("| router | " + " | ".join(modes) + " |")
    print("|---|" + "---|" * len(modes))
    for name in routers:
        cells = []
        for m in modes:
            runs = [r for r in rows if r["mode"] == m and r["router"] == name]
            cells.append(f"{statistics.fmean(f(r, 'request_hit_rate') for r in runs):.2f} / "
                         f"{statistics.fmean(f(r, 'ttft_p99_ms') for r in runs):.0f} / "
                         f"{statistics.fmean(f(r, 'max_worker_share') for r in runs):.2f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    print("Built-in workload: request hit rate / TTFT p99 ms (kvsim: fraction of the bound)\n")
    grid_table()
    print("\nTraces: prefix reuse / TTFT p99 ms / goodput fraction\n")
    trace_table()
    print("\nFailure modes: request hit rate / TTFT p99 ms / busiest worker's share\n")
    failure_table()
