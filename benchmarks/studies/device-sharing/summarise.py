"""The device-sharing measurements at a glance: `python benchmarks/studies/device-sharing/summarise.py [DIR]`.

For every setup of tests/fixtures/real-vllm-sharing/ (prompt length, servers W, concurrency C; reniced and starved
apart) the median and range over the repeats of the server's and the client's TTFT p50 and p99, the throughput, and
the CPU each kind of process used, in cores' worth over the run (CPU seconds / measured duration; from the
`.cpu.json` files measure_sharing.sh writes). Standard output, Markdown.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from sim.results.stats import percentile
from sim.servers.run_csv import read_run

REPO = Path(__file__).resolve().parents[3]
ROLES = ("worker", "engine_core", "api_server", "client")


def figures(path: Path) -> dict[str, float]:
    run = read_run(path)
    rows = run.measured
    duration = max(r.end_s for r in rows) - min(r.start_s for r in rows)
    out = {
        "server_p50": percentile([r.ttft("server") for r in rows], 50),
        "server_p99": percentile([r.ttft("server") for r in rows], 99),
        "client_p50": percentile([r.ttft("client") for r in rows], 50),
        "client_p99": percentile([r.ttft("client") for r in rows], 99),
        "rps": len(rows) / duration,
    }
    cpu_path = path.with_suffix(".cpu.json")
    if cpu_path.exists():
        cpu = json.loads(cpu_path.read_text())
        whole = run.setup.model_extra.get("measured_duration_s") or duration
        for role in ROLES:
            out[role] = cpu.get(role, float("nan")) / whole
    return out


def cell(values: list[float], spec: str = ".1f") -> str:
    if len(values) == 1:
        return format(values[0], spec)
    return f"{format(float(np.median(values)), spec)} ({format(min(values), spec)}–{format(max(values), spec)})"


def main() -> None:
    root = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "tests" / "fixtures" / "real-vllm-sharing"
    for sub in sorted(p for p in root.iterdir() if p.is_dir()):
        groups: dict[tuple[int, int], list[dict[str, float]]] = defaultdict(list)
        for path in sorted(sub.glob("w*-c*-r*.csv")):
            w, _, c, _ = path.stem.split("-")
            groups[(int(w[1:]), int(c[1:]))].append(figures(path))
        print(f"\n### {sub.name}\n")
        print("| W | C | repeats | server TTFT p50 ms | server p99 | client p50 | client p99 | req/s | "
              + " | ".join(f"{r} cores" for r in ROLES) + " |")
        print("|---|---|---:|" + "---:|" * (5 + len(ROLES)))
        for (w, c), runs in sorted(groups.items()):
            cols = [cell([r[k] for r in runs]) for k in ("server_p50", "server_p99", "client_p50", "client_p99", "rps")]
            cols += [cell([r.get(k, float("nan")) for r in runs], ".2f") for k in ROLES]
            print(f"| {w} | {c} | {len(runs)} | " + " | ".join(cols) + " |")


if __name__ == "__main__":
    main()
