"""Where a whole `kvsim replay` command's CPU goes: start-up, reading the trace, simulating, the garbage collector,
printing and writing, exit, and the figure process.

    python benchmarks/speed/command_parts.py [--runs 3] [--tree DIR ...] [--router R ...] [--traces DIR] [--limit N]

Each run is a fresh process running `kvsim replay TRACE --workers 8 --kv-tokens 3000000 --router R --jobs 1 --out DIR`
(the conversation trace) through a small wrapper that times, in CPU seconds of the process (`time.process_time`):
the start-up up to the replay's first request (interpreter, imports, scenario, router, cluster), the trace reader's
own time (each `next` of `read_mooncake`), the simulation (`sim.replay._run` less the reader), the output (all that
follows: the result, printing, CSVs, waiting for the figure), and the garbage collector's passes (`gc.callbacks`, taken out of the phase they
interrupted); the exit is the process's CPU (from outside) after `main` returned, and the figure process is the
children's CPU. With several --tree DIR the trees are interleaved in each round, so that the load of a shared
machine hits them alike; the medians of --runs are printed, then the whole process's CPU (user + system, children
included) of plain runs of the same command, median of --runs, also interleaved. Issue 27: whole commands against
Dynamo's mocker. The trace is read from --traces DIR, else $TRACES, else traces/ at the repository root.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trees import add_tree_options, trace_and_trees, tree_env  # benchmarks/speed/trees.py, beside this script

_WRAPPER = r"""
import gc, json, resource, sys, time
acc, phase, mark, gc_start = {}, ["start-up"], [0.0], [0.0]

def enter(name):
    t = time.process_time()
    acc[phase[0]] = acc.get(phase[0], 0.0) + t - mark[0]
    mark[0], phase[0] = t, name

def on_gc(stage, info):
    if stage == "start":
        gc_start[0] = time.process_time()
    else:
        spent = time.process_time() - gc_start[0]
        acc["collector"] = acc.get("collector", 0.0) + spent
        acc[phase[0]] = acc.get(phase[0], 0.0) - spent  # NOTE: the phase it interrupted gets its time back

sim_replay_run = None

def simulate(*args, **kwargs):
    enter("simulate")
    try:
        return sim_replay_run(*args, **kwargs)
    finally:
        enter("output")  # NOTE: all that follows: the result, the tables, the CSVs, waiting for the figure

gc.callbacks.append(on_gc)
import sim.replay
import sim.workloads.traces as traces
from sim.cli import main

read_mooncake = traces.read_mooncake
def timed_reader(*args, **kwargs):
    requests = read_mooncake(*args, **kwargs)
    while True:
        before = phase[0]
        enter("read")
        try:
            item = next(requests)
        except StopIteration:
            enter(before)
            return
        enter(before)
        yield item
traces.read_mooncake = timed_reader
sim_replay_run, sim.replay._run = sim.replay._run, simulate
try:
    main(sys.argv[1:], standalone_mode=False)
finally:
    enter("after")
    acc.pop("after", None)
    acc["main"] = time.process_time()
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    acc["figure process"] = children.ru_utime + children.ru_stime
    print(json.dumps(acc), file=sys.stderr)
"""
"""Run as `python -c _WRAPPER ARGS`: kvsim's `main` with the phases timed; one JSON line on stderr at the end."""

PARTS = ("start-up", "read", "simulate", "collector", "output", "exit", "figure process", "total")


def _cpu_of(cmd: list[str], tree: Path) -> tuple[float, str]:
    """CPU seconds (user + system) of `cmd` run in `tree` and its children, and its stderr."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    # NOTE: cwd=tree: `python -c` and `python -m` put the working directory first on the path, before PYTHONPATH.
    proc = subprocess.run(cmd, env=tree_env(tree), cwd=tree, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:4])} ... failed:\n{proc.stderr[-2000:]}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), proc.stderr


def parts_of_one_run(tree: Path, args: list[str]) -> dict[str, float]:
    """One run's parts, in CPU seconds (`PARTS`)."""
    total, err = _cpu_of([sys.executable, "-c", _WRAPPER, *args], tree)
    acc = json.loads(err.strip().splitlines()[-1])
    return {"start-up": acc.get("start-up", 0.0), "read": acc.get("read", 0.0), "simulate": acc.get("simulate", 0.0),
            "collector": acc.get("collector", 0.0), "output": acc.get("output", 0.0),
            "exit": total - acc["figure process"] - acc["main"], "figure process": acc["figure process"],
            "total": total}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_tree_options(parser, runs=3, runs_help="rounds (the median is printed)")
    parser.add_argument("--router", action="append", default=None, help="router (repeatable; default round-robin)")
    parser.add_argument("--limit", type=int, default=None, help="replay only the first N requests")
    args = parser.parse_args()
    trace, trees = trace_and_trees(args)
    routers = args.router or ["round-robin"]
    parts: dict[tuple[str, Path], list[dict[str, float]]] = {}
    plain: dict[tuple[str, Path], list[float]] = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.runs):
            for router in routers:
                command = ["replay", str(trace), "--workers", "8", "--kv-tokens", "3000000", "--router", router,
                           "--jobs", "1", "--out", str(Path(tmp) / "out"), *(["--limit", str(args.limit)]
                                                                              if args.limit else [])]
                for tree in trees:
                    parts.setdefault((router, tree), []).append(parts_of_one_run(tree, command))
                for tree in trees:
                    plain.setdefault((router, tree), []).append(
                        _cpu_of([sys.executable, "-m", "sim.cli", *command], tree)[0])
    print(f"CPU seconds, median of {args.runs} rounds ({time.perf_counter() - t0:.0f} s); load average "
          f"{os.getloadavg()[0]:.1f} at the end")
    for router in routers:
        print(f"\n{router}: {'part':16s}" + "".join(f" {str(t)[-20:]:>20s}" for t in trees))
        for part in PARTS:
            print(f"{'':{len(router) + 2}s}{part:16s}" + "".join(
                f" {statistics.median(r[part] for r in parts[router, tree]):20.3f}" for tree in trees))
        print(f"{'':{len(router) + 2}s}{'plain runs':16s}" + "".join(
            f" {statistics.median(plain[router, tree]):20.3f}" for tree in trees))


if __name__ == "__main__":
    main()
