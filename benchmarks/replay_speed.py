"""Replay speed: kvsim against Dynamo's mocker on the Mooncake traces, a 1M-request synthetic run, the reference sweep.

    python benchmarks/replay_speed.py [--traces DIR] [--mocker-python .venv-dynamo/bin/python] [--quick]

Every measurement runs in a fresh subprocess, so each prints its own wall time and peak RSS. The mocker
(`ai-dynamo-runtime` 1.6.1, in a side virtualenv: benchmarks/dynamo-mocker/README.md) runs the same trace with the
same workers, blocks (64 tokens) and router when its interpreter exists; the ratio kvsim req/s / mocker req/s is
printed beside. These machines are shared and noisy: compare the ratios measured in one run, not absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MOCKER = REPO / "benchmarks" / "dynamo-mocker" / "run_mocker.py"

KVSIM_TRACE = """
import json, resource, sys, time
from sim.runner import replay
from sim.scenario import builtin_scenario_path, load_scenario
from sim.traces import read_mooncake
trace, workers, tokens, router = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
s, _ = load_scenario(builtin_scenario_path("trace-replay"))
s = s.with_overrides(**{"cluster.workers": workers, "engine.num_gpu_blocks_override": tokens // 64 + 1,
                        "router.name": router, "router.options": {}})
t0 = time.perf_counter()
r = replay(s, read_mooncake(trace, block_size=64))
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "requests": r.stats.requests, "prefix_reuse": r.stats.prefix_reuse,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

KVSIM_SYNTHETIC = """
import json, resource, sys, time
from sim.runner import replay
from sim.scenario import builtin_scenario_path, load_scenario
from sim.workload import poisson_requests
n = int(sys.argv[1])
s, _ = load_scenario(builtin_scenario_path("trace-replay"))
s = s.with_overrides(**{"cluster.workers": 8, "engine.num_gpu_blocks_override": 3_000_000 // 64 + 1,
    "router.name": "round-robin", "workload.prefixes": 64, "workload.popularity": "zipf",
    "workload.zipf_exponent": 1.0, "workload.prefix_tokens": 2048,
    "workload.tail_tokens": {"kind": "uniform", "low": 128, "high": 512}, "workload.output_tokens": 64})
t0 = time.perf_counter()
r = replay(s, poisson_requests(s.workload, block_size=64, seed=0, rate_rps=40.0, num_requests=n))
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "requests": r.stats.requests, "prefix_reuse": r.stats.prefix_reuse,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

KVSIM_SWEEP = """
import json, resource, time
from sim.scenario import load_scenario
from sim.sweep import run_sweep, sweep_points
s, _ = load_scenario()
points = sweep_points(workers=[3, 6], prefixes=[2, 7, 12, 24], concurrency=[4, 8, 16], routers=["random"],
                      repeats=3, seed=s.seed)
t0 = time.perf_counter()
rows = run_sweep(s, points)
print(json.dumps({"wall_s": time.perf_counter() - t0, "runs": len(rows),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def _json_run(cmd: list[str]) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} ... failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=Path, default=REPO.parent / "shared" / "data" / "traces",
                        help="folder with conversation_trace.jsonl and synthetic_trace.jsonl")
    parser.add_argument("--mocker-python", type=Path, default=REPO / ".venv-dynamo" / "bin" / "python",
                        help="python of a venv with ai-dynamo-runtime==1.6.1")
    parser.add_argument("--synthetic-requests", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="skip the 1M-request run and the sweep")
    args = parser.parse_args()
    py = sys.executable
    cases = [("conversation", 8, 3_000_000, "round-robin", "round_robin"),
             ("conversation", 8, 3_000_000, "kv-aware", "kv_router"),
             ("conversation", 8, 1_000_000, "round-robin", "round_robin"),
             ("synthetic", 8, 3_000_000, "round-robin", "round_robin")]
    have_mocker = args.mocker_python.exists()
    print(f"{'trace':13s} {'workers x KV':>14s} {'router':12s} {'kvsim reuse':>11s} {'kvsim s':>8s} {'kvsim req/s':>11s} "
          f"{'RSS MB':>7s} {'mocker reuse':>12s} {'mocker s':>8s} {'mocker req/s':>12s} {'ratio':>6s}")
    for trace, workers, tokens, router, mocker_router in cases:
        path = args.traces / f"{trace}_trace.jsonl"
        if not path.exists():
            raise SystemExit(f"--traces: {path} not found")
        k = _json_run([py, "-c", KVSIM_TRACE, str(path), str(workers), str(tokens), router])
        k_rps = k["requests"] / k["wall_s"]
        line = (f"{trace:13s} {f'{workers} x {tokens / 1e6:.1f}M':>14s} {router:12s} {k['prefix_reuse']:11.4f} "
                f"{k['wall_s']:8.2f} {k_rps:11.0f} {k['peak_rss_mb']:7.0f}")
        if have_mocker:
            m = _json_run([str(args.mocker_python), str(MOCKER), str(path), "--workers", str(workers),
                           "--num-gpu-blocks", str(tokens // 64), "--block-size", "64", "--router", mocker_router,
                           "--trace-block-size", "512"])
            m_rps = m["requests"] / m["wall_s"]
            line += f" {m['prefix_cache_reused_ratio']:12.4f} {m['wall_s']:8.2f} {m_rps:12.0f} {k_rps / m_rps:6.2f}"
        else:
            line += "   (no mocker venv: see benchmarks/dynamo-mocker/README.md)"
        print(line, flush=True)
    if args.quick:
        return
    s = _json_run([py, "-c", KVSIM_SYNTHETIC, str(args.synthetic_requests)])
    print(f"synthetic {s['requests']:,} requests (64 Zipf prefixes of 2,048 tokens, tails 128-512, 64 outputs, "
          f"Poisson 40/s, 8 workers x 3.0M, round-robin): {s['wall_s']:.1f} s = {s['requests'] / s['wall_s']:.0f} "
          f"req/s, reuse {s['prefix_reuse']:.4f}, peak RSS {s['peak_rss_mb']:.0f} MB", flush=True)
    w = _json_run([py, "-c", KVSIM_SWEEP])
    print(f"reference sweep ({w['runs']} runs: prefixes 2,7,12,24 x workers 3,6 x concurrency 4,8,16 x 3 repeats): "
          f"{w['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
