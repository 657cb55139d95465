#!/usr/bin/env python3
"""Replay a Mooncake JSONL trace through the Dynamo mocker (offline mode).

Run with the side venv (see README.md in this folder):

    .venv-dynamo/bin/python benchmarks/oracles/dynamo-mocker/run_mocker.py TRACE.jsonl \
        --workers 8 --num-gpu-blocks 46875 --block-size 64 --router round_robin \
        [--trace-block-size 512]

Prints ONE JSON line on stdout. Only the run_mocker_trace_replay() call is
timed (time.perf_counter); import and argument parsing are excluded. The trace
is recorded by its path relative to the working directory (so that results
files name no machine's directories).
"""
import argparse
import json
import os
import sys
import time


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("trace", help="Mooncake-format JSONL trace")
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--num-gpu-blocks", type=int, required=True,
                   help="KV blocks per worker")
    p.add_argument("--block-size", type=int, default=64,
                   help="engine KV block size in tokens")
    p.add_argument("--router", choices=["round_robin", "kv_router"],
                   default="round_robin")
    p.add_argument("--trace-block-size", type=int, default=512,
                   help="tokens per hash_id in the trace (Mooncake: 512); "
                        "0 = pass None and let Dynamo choose")
    p.add_argument("--backend", default="vllm", choices=["vllm", "sglang"])
    p.add_argument("--extra-engine-json", default=None,
                   help="JSON object merged into the 'engine' section")
    p.add_argument("--log", default="warn",
                   help="Dynamo Rust log level (sets DYN_LOG unless already "
                        "set); kv_router logs one INFO line per request")
    a = p.parse_args(argv)
    os.environ.setdefault("DYN_LOG", a.log)

    import dynamo._core as core  # noqa: E402  (import excluded from timing)

    engine = {"backend": a.backend, "block_size": a.block_size,
              "num_gpu_blocks": a.num_gpu_blocks}
    if a.extra_engine_json:
        engine.update(json.loads(a.extra_engine_json))
    engine_args = {"engine": engine}
    tbs = a.trace_block_size or None

    c0 = time.process_time()
    t0 = time.perf_counter()
    result = core.run_mocker_trace_replay(
        [a.trace],
        extra_engine_args=engine_args,
        num_workers=a.workers,
        router_mode=a.router,
        replay_mode="offline",
        trace_block_size=tbs,
    )
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0

    report = dict(result.summary)
    n = report.get("completed_requests", report.get("num_requests"))
    try:
        import importlib.metadata as md
        version = md.version("ai-dynamo-runtime")
    except Exception:  # pragma: no cover
        version = None
    out = {
        "trace": os.path.relpath(a.trace),
        "workers": a.workers,
        "num_gpu_blocks": a.num_gpu_blocks,
        "block_size": a.block_size,
        "capacity_tokens_per_worker": a.num_gpu_blocks * a.block_size,
        "router": a.router,
        "trace_block_size": tbs,
        "ai_dynamo_runtime": version,
        "wall_s": round(wall, 4),
        "cpu_s": round(cpu, 4),
        "dyn_log": os.environ.get("DYN_LOG"),
        "requests": n,
        "requests_per_s": round(n / wall, 1) if n else None,
        "prefix_cache_reused_ratio": report.get("prefix_cache_reused_ratio"),
        "ttft_mean_ms": report.get("mean_ttft_ms"),
        "ttft_p99_ms": report.get("p99_ttft_ms"),
        "simulator_wall_time_ms": report.get("wall_time_ms"),
        "simulated_duration_ms": report.get("duration_ms"),
        "engine_args": engine_args,
        "report": report,
    }
    sys.stdout.write(json.dumps(out, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
