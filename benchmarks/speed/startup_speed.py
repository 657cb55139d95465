"""Start-up and output speed: `kvsim --help` and a 50-request replay, whole commands as a user runs them.

    python benchmarks/speed/startup_speed.py [--runs 5] [--tree DIR ...] [--traces DIR] [--top 15]

Each case is a fresh `python -m sim.cli ...` process (what the `kvsim` script runs), timed from outside: wall seconds
and CPU seconds (user + system, of the process and its children), median of --runs. With several --tree DIR (e.g.
`--tree ../main --tree .`), each tree's code is put first on PYTHONPATH and the trees are interleaved within each
round (tree A, tree B, tree A, ...), so that the load of a shared machine hits them alike; the last column is each
tree's median over the first tree's. Then `python -X importtime` of the replay with outputs (the last tree): the
imports that cost most, by top-level package and by module (self time), in milliseconds of one run.

The cases: `kvsim --help`; `kvsim replay --help`; the first 50 requests of the Mooncake conversation trace on 8
workers x 3.0M tokens (round robin, one process), printed only, then with `--out DIR` (summary.csv, workers.csv and
the figure replay.png). Goals (issue 27): `--help` < 0.4 s and the 50-request replay with its outputs < 1.0 s.
The trace is read from --traces DIR, else $TRACES, else traces/ at the repository root (`kvsim traces fetch`).
"""

from __future__ import annotations

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from trees import add_tree_options, trace_and_trees, tree_env  # benchmarks/speed/trees.py, beside this script


def _cases(trace: Path, out_dir: str) -> list[tuple[str, list[str], float | None]]:
    """(label, kvsim arguments, goal in wall seconds or None)."""
    replay = ["replay", str(trace), "--limit", "50", "--workers", "8", "--kv-tokens", "3000000", "--jobs", "1"]
    return [("kvsim --help", ["--help"], 0.4),
            ("kvsim replay --help", ["replay", "--help"], None),
            ("replay 50 requests, printed", replay, None),
            ("replay 50 requests, --out DIR", [*replay, "--out", out_dir], 1.0)]


def _timed(tree: Path, args: list[str]) -> tuple[float, float]:
    """(wall s, CPU s) of one `python -m sim.cli ARGS` with `tree` first on the path."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "sim.cli", *args], env=tree_env(tree), cwd=tree,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"kvsim {' '.join(args)} failed in {tree}:\n{proc.stderr.decode()[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def import_costs(tree: Path, args: list[str]) -> list[tuple[int, int, int, str]]:
    """`python -X importtime`'s rows of one run: (self us, cumulative us, depth, module)."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "sim.cli", *args], env=tree_env(tree), cwd=tree,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    rows = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append((int(m[1]), int(m[2]), (len(m[3]) - 1) // 2, m[4]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser, runs=5, runs_help="runs of each case per tree (the median is printed)")
    parser.add_argument("--top", type=int, default=15, help="rows of each importtime table (0: none)")
    args = parser.parse_args()
    trace, trees = trace_and_trees(args)
    with tempfile.TemporaryDirectory() as tmp:
        cases = _cases(trace, str(Path(tmp) / "out"))
        times: dict[tuple[str, Path], list[tuple[float, float]]] = {}
        for _ in range(args.runs):
            for label, kvsim_args, _goal in cases:
                for tree in trees:
                    times.setdefault((label, tree), []).append(_timed(tree, kvsim_args))
        print(f"median of {args.runs} runs (wall s / CPU s); load average {os.getloadavg()[0]:.1f} at the end")
        print(f"{'case':32s} {'tree':28s} {'wall s':>7s} {'CPU s':>7s} {'goal':>6s} {'wall/first':>10s} "
              f"{'CPU/first':>9s}")
        for label, _args, goal in cases:
            first = None
            for tree in trees:
                wall = statistics.median(w for w, _ in times[label, tree])
                cpu = statistics.median(c for _, c in times[label, tree])
                first = first or (wall, cpu)
                print(f"{label:32s} {str(tree)[-28:]:28s} {wall:7.3f} {cpu:7.3f} "
                      f"{f'{goal:.1f}' if goal else '':>6s} {wall / first[0]:10.2f} {cpu / first[1]:9.2f}")
        if args.top:
            rows = import_costs(trees[-1], cases[-1][1])
            by_package = Counter()
            for self_us, _cum, _depth, module in rows:
                by_package[module.split(".")[0]] += self_us
            total = sum(by_package.values())
            print(f"\n`python -X importtime` of `{cases[-1][0]}` ({trees[-1]}): {len(rows)} modules, "
                  f"{total / 1e3:.0f} ms of imports; by top-level package (self times summed), ms:")
            for package, us in by_package.most_common(args.top):
                print(f"  {us / 1e3:8.1f}  {package}")
            print("by module (self time), ms:")
            for self_us, _cum, _depth, module in sorted(rows, reverse=True)[:args.top]:
                print(f"  {self_us / 1e3:8.1f}  {module}")


if __name__ == "__main__":
    main()
