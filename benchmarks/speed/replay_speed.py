"""Replay speed: kvsim against Dynamo's mocker on the Mooncake traces, a 1M-request synthetic run, the reference sweep.

    python benchmarks/speed/replay_speed.py [--traces DIR] [--mocker-python .venv-dynamo/bin/python] [--jobs N] [--quick]

The Mooncake traces are read from --traces DIR, else $TRACES, else traces/ at the repository root, where `kvsim traces
fetch` (run from the root) puts them.

Every measurement runs in a fresh subprocess, so each prints its own wall time and peak RSS (the largest of the
process and the processes it split into). kvsim runs each case in one process (`jobs 1`) and, when the router
ignores the cluster's state (round-robin), split by worker over `--jobs` processes (`sim.replay`). The mocker
(`ai-dynamo-runtime` 1.6.1, in a side virtualenv: benchmarks/oracles/dynamo-mocker/README.md) runs the same trace
with the same workers, blocks (64 tokens) and router when its interpreter exists; the ratio kvsim req/s / mocker req/s is
printed beside. The SGLang rows run kvsim's SGLang engine (64-token pages, `scenarios/trace-replay.yaml`) against the
mocker's `--backend sglang`. These machines are shared and noisy: compare the ratios measured in one run, not absolute seconds.

`--sessions N` adds, after the trace table, the long-context agent trace of `session_speed.py` (N sessions x 30 turns,
contexts up to 64k tokens at block 16, as Dynamo's mooncake-delta): requests/s, blocks/s and peak RSS for every router
of the trace table, each beside the mocker on the same file (round robin beside its round robin, the others beside its
KV router; vLLM; `session_speed.py` itself also runs SGLang and cProfile).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MOCKER = REPO / "benchmarks" / "oracles" / "dynamo-mocker" / "run_mocker.py"

PEAK_RSS = """
def peak_rss_mb():
    return max(resource.getrusage(who).ru_maxrss for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)) / 1024
"""

KVSIM_TRACE = """
import json, resource, sys, time
from sim.replay import replay
from sim.scenario import builtin_scenario_path, load_scenario
from sim.workloads.traces import read_mooncake
""" + PEAK_RSS + """
trace, workers, tokens, router, jobs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
engine = sys.argv[6]
s, _ = load_scenario(builtin_scenario_path("trace-replay"))
s = s.with_engine(engine)
name, _, text = router.partition(":")
options = dict(kv.split("=", 1) for kv in text.split(",")) if text else {}
options = {k: (float(v) if v.replace(".", "", 1).isdigit() else v) for k, v in options.items()}
s = s.with_overrides(**{"cluster.workers": workers, **s.engine.capacity_overrides(tokens=tokens),
                        "router.name": name, "router.options": options})
t0 = time.perf_counter()
r = replay(s, lambda: read_mooncake(trace, block_size=64), jobs=jobs)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "requests": r.stats.requests, "prefix_reuse": r.stats.prefix_reuse,
                  "jobs": r.jobs, "peak_rss_mb": peak_rss_mb()}))
"""

KVSIM_SYNTHETIC = """
import json, resource, sys, time
from sim.replay import replay
from sim.scenario import builtin_scenario_path, load_scenario
from sim.workloads.shared_prefix import poisson_requests
""" + PEAK_RSS + """
n, jobs, breakdown = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
s, _ = load_scenario(builtin_scenario_path("trace-replay"))
s = s.with_overrides(**{"cluster.workers": 8, "cluster.reuse_breakdown": breakdown, "engine.num_gpu_blocks_override": 3_000_000 // 64 + 1,
    "router.name": "round-robin", "workload.prefixes": 64, "workload.popularity": "zipf",
    "workload.zipf_exponent": 1.0, "workload.prefix_tokens": 2048,
    "workload.tail_tokens": {"kind": "uniform", "low": 128, "high": 512}, "workload.output_tokens": 64})
t0 = time.perf_counter()
r = replay(s, lambda: poisson_requests(s.workload, block_size=64, seed=0, rate_rps=40.0, num_requests=n), jobs=jobs)
wall = time.perf_counter() - t0
print(json.dumps({"wall_s": wall, "requests": r.stats.requests, "prefix_reuse": r.stats.prefix_reuse,
                  "jobs": r.jobs, "peak_rss_mb": peak_rss_mb()}))
"""

KVSIM_SWEEP = """
import json, resource, time
from sim.scenario import load_scenario
from sim.studies.sweep import run_sweep, sweep_points
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
    parser.add_argument("--traces", type=Path, default=Path(os.environ.get("TRACES", REPO / "traces")),
                        help="folder with conversation_trace.jsonl and synthetic_trace.jsonl (default: $TRACES, else "
                             "traces/ at the repository root: `kvsim traces fetch` puts them there)")
    parser.add_argument("--mocker-python", type=Path, default=REPO / ".venv-dynamo" / "bin" / "python",
                        help="python of a venv with ai-dynamo-runtime==1.6.1")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="processes for the split replays (default: all cores)")
    parser.add_argument("--synthetic-requests", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="skip the 1M-request runs and the sweep")
    parser.add_argument("--sessions", type=int, default=0,
                        help="also replay session_speed.py's agent trace of this many sessions (0: not; 2000: the full one)")
    args = parser.parse_args()
    if args.sessions < 0:
        raise SystemExit(f"--sessions must be >= 0, got {args.sessions}")
    py = sys.executable
    cases = [("conversation", 8, 3_000_000, "round-robin", "round_robin", "vllm"),
             ("conversation", 8, 3_000_000, "kv-aware", "kv_router", "vllm"),
             ("conversation", 8, 1_000_000, "round-robin", "round_robin", "vllm"),
             ("synthetic", 8, 3_000_000, "round-robin", "round_robin", "vllm"),
             ("conversation", 8, 3_000_000, "round-robin", "round_robin", "sglang"),
             ("conversation", 8, 3_000_000, "kv-aware", "kv_router", "sglang"),
             ("conversation", 8, 1_000_000, "round-robin", "round_robin", "sglang")]
    # NOTE: every other router that reads the cluster, against the mocker's KV router on the same trace (the
    # mocker has none of them; its KV router is the bar: "as fast as Dynamo's mocker with its KV router").
    others = ("kv-aware:state=events", "kv-aware:state=approximate", "least-loaded", "p2c", "llm-d",
              "sglang-cache-aware", "aibrix-prefix-cache", "aibrix-least-kv-cache", "vllm-router-loadaware", "preble",
              "kvsim")
    cases += [("conversation", 8, 3_000_000, r, "kv_router", "vllm") for r in others]
    mocker_runs: dict[tuple, dict] = {}
    have_mocker = args.mocker_python.exists()
    job_counts = [1] + ([args.jobs] if args.jobs > 1 else [])
    print(f"{'trace':13s} {'engine':6s} {'workers x KV':>14s} {'router':26s} {'jobs':>4s} {'kvsim reuse':>11s} {'kvsim s':>8s} "
          f"{'kvsim req/s':>11s} {'RSS MB':>7s} {'mocker reuse':>12s} {'mocker s':>8s} {'mocker req/s':>12s} "
          f"{'ratio':>6s}")
    for trace, workers, tokens, router, mocker_router, engine in cases:
        path = args.traces / f"{trace}_trace.jsonl"
        if not path.exists():
            raise SystemExit(f"--traces: {path} not found; `kvsim traces fetch --out {args.traces}` downloads the "
                             "Mooncake traces there")
        mocker = "   (no mocker venv: see benchmarks/oracles/dynamo-mocker/README.md)"
        m_rps = None
        if have_mocker:
            key = (trace, workers, tokens, mocker_router, engine)
            if key not in mocker_runs:
                mocker_runs[key] = _json_run([str(args.mocker_python), str(MOCKER), str(path), "--workers",
                                              str(workers), "--num-gpu-blocks", str(tokens // 64), "--block-size",
                                              "64", "--router", mocker_router, "--trace-block-size", "512",
                                              "--backend", engine])
            m = mocker_runs[key]
            m_rps = m["requests"] / m["wall_s"]
            mocker = f" {m['prefix_cache_reused_ratio']:12.4f} {m['wall_s']:8.2f} {m_rps:12.0f}"
        for jobs in job_counts:
            k = _json_run([py, "-c", KVSIM_TRACE, str(path), str(workers), str(tokens), router, str(jobs), engine])
            if k["jobs"] != jobs:
                continue  # this router reads the cluster: it does not split
            k_rps = k["requests"] / k["wall_s"]
            ratio = f" {k_rps / m_rps:6.2f}" if m_rps else ""
            print(f"{trace:13s} {engine:6s} {f'{workers} x {tokens / 1e6:.1f}M':>14s} {router:26s} {jobs:4d} "
                  f"{k['prefix_reuse']:11.4f} {k['wall_s']:8.2f} {k_rps:11.0f} {k['peak_rss_mb']:7.0f}{mocker}{ratio}",
                  flush=True)
    if args.sessions:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from session_speed import session_table
        session_table(args.sessions, routers=["round-robin", "kv-aware", *others], engines=["vllm"],
                      mocker_python=args.mocker_python,
                      out=Path(__file__).resolve().parent / "session_traces")
    if args.quick:
        return
    # NOTE: the reuse breakdown keeps every distinct block hash ever sent (a million unique tails here), so the
    # 1M-request replay runs both ways: the default, and --no-reuse-breakdown (memory bounded by the caches).
    for breakdown in ("1", "0"):
        for jobs in reversed(job_counts):
            s = _json_run([py, "-c", KVSIM_SYNTHETIC, str(args.synthetic_requests), str(jobs), breakdown])
            print(f"synthetic {s['requests']:,} requests (64 Zipf prefixes of 2,048 tokens, tails 128-512, 64 outputs, "
                  f"Poisson 40/s, 8 workers x 3.0M, round-robin), {s['jobs']} process(es), reuse breakdown "
                  f"{'on' if breakdown == '1' else 'off'}: {s['wall_s']:.1f} s = {s['requests'] / s['wall_s']:.0f} "
                  f"req/s, reuse {s['prefix_reuse']:.4f}, peak RSS {s['peak_rss_mb']:.0f} MB", flush=True)
    w = _json_run([py, "-c", KVSIM_SWEEP])
    print(f"reference sweep ({w['runs']} runs: prefixes 2,7,12,24 x workers 3,6 x concurrency 4,8,16 x 3 repeats): "
          f"{w['wall_s']:.1f} s")


if __name__ == "__main__":
    main()
