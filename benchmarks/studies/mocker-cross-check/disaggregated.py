#!/usr/bin/env python3
"""kvsim's prefill/decode disaggregation against Dynamo's mocker in disaggregated mode (findings:
disaggregated.md in this folder; how the mocker models P/D: ../../oracles/dynamo-mocker/disaggregated.md).

Topologies 1P+3D, 2P+4D and 4P+4D on two traces:
  * `seed`: the seed-shaped trace of builtin_shape.py (2,000 requests, Poisson 8 req/s, one of 24 2,048-token
    prefixes + a 339-token tail, 64 output tokens, 64-token hash blocks), written by that script's write_trace;
  * `conversation`: the Mooncake conversation trace (12,031 requests, 512-token hash blocks) from $TRACES
    (default ../shared/data/traces, relative to the repository root, as the other mocker runs), or its first
    --conversation-requests rows.
Routers: round robin on both pools (deterministic in the mocker) and Dynamo's KV routers (the mocker's kv_router:
prefill pool by KV cost, decode pool by load; its tie-break is random, so --repeats runs).

Engines: vLLM, 64-token blocks; per pool `num_gpu_blocks` from POOL_BLOCKS below (the prefill pool of the seed trace
at 146 blocks, the KV pressure of the aggregated builtin_shape study; decode pools large enough not to queue).
Transfer: the mocker's default, zero time (kv_bytes_per_token unset), and kvsim's link set to zero time to match.

Reuse on both sides: prompt tokens reused on the prefill pool at first admission / prompt tokens (the mocker's
prefix_cache_reused_ratio; decode-side hits are not counted by the mocker). TTFT: arrival -> first token from the
decode worker.

Run from the repository root (the mocker runs in a subprocess with the side venv .venv-dynamo):

    .venv/bin/python benchmarks/studies/mocker-cross-check/disaggregated.py                  # all, appends disaggregated.jsonl
    .venv/bin/python benchmarks/studies/mocker-cross-check/disaggregated.py --traces seed --topologies 2P4D --no-append
    .venv/bin/python benchmarks/studies/mocker-cross-check/disaggregated.py --mocker-only   # no kvsim side
    .venv/bin/python benchmarks/studies/mocker-cross-check/disaggregated.py --probe         # the probes of disaggregated.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(HERE))
import builtin_shape  # noqa: E402  (the seed-shaped trace's writer and constants)
from builtin_shape import band  # noqa: E402  (a min–max band as the tables print it)

RESULTS = HERE / "disaggregated.jsonl"
TOPOLOGIES = {"1P3D": (1, 3), "2P4D": (2, 4), "4P4D": (4, 4)}
BLOCK_SIZE = 64
TRACE_BLOCK = {"seed": 64, "conversation": 512}
POOL_BLOCKS = {  # num_gpu_blocks per worker: (prefill pool, decode pool)
    "seed": (146, 2048),
    "conversation": (46_875, 46_875),
}
MOCKER_ROUTERS = {"round-robin": "round_robin", "kv": "kv_router"}


# ---------------------------------------------------------------------------------------------------- traces
def trace_path(name: str, conversation_requests: int | None) -> Path:
    if name == "seed":
        path = HERE / "builtin_shape_trace.jsonl"
        builtin_shape.write_trace(path)
        return path
    src = REPO / os.environ.get("TRACES", "../shared/data/traces") / "conversation_trace.jsonl"
    if not src.exists():
        raise SystemExit(f"{src} not found: run `.venv/bin/kvsim traces fetch --out DIR` and set TRACES=DIR")
    if not conversation_requests:
        return src
    head = HERE / f"conversation_head{conversation_requests}.jsonl"  # git-ignored
    with src.open() as f_in, head.open("w") as f_out:
        for i, line in enumerate(f_in):
            if i >= conversation_requests:
                break
            f_out.write(line)
    return head


# ---------------------------------------------------------------------------------------------------- the mocker
def engine(blocks: int, role: str) -> dict:
    return {"engine": {"backend": "vllm", "block_size": BLOCK_SIZE, "num_gpu_blocks": blocks, "worker_type": role}}


def mocker_main(argv: list[str]) -> int:
    """Runs inside .venv-dynamo: one disaggregated replay, one JSON line on stdout."""
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--prefill", type=int, required=True)
    p.add_argument("--decode", type=int, required=True)
    p.add_argument("--prefill-blocks", type=int, required=True)
    p.add_argument("--decode-blocks", type=int, required=True)
    p.add_argument("--trace-block", type=int, required=True)
    p.add_argument("--router", required=True)
    a = p.parse_args(argv)
    os.environ.setdefault("DYN_LOG", "warn")
    import dynamo._core as core
    t0 = time.perf_counter()
    result = core.run_mocker_trace_replay(
        [a.trace], prefill_engine_args=engine(a.prefill_blocks, "prefill"),
        decode_engine_args=engine(a.decode_blocks, "decode"), num_prefill_workers=a.prefill,
        num_decode_workers=a.decode, router_mode=a.router, replay_mode="offline", trace_block_size=a.trace_block,
        capture_per_request=True)
    wall = time.perf_counter() - t0
    s = dict(result.summary)
    recs = result.per_request
    prefill_share = [sum(r["prefill_worker_idx"] == w for r in recs) for w in range(a.prefill)]
    decode_share = [sum(r["decode_worker_idx"] == w for r in recs) for w in range(a.decode)]
    out = {"wall_s": wall, "requests": s["completed_requests"], "reuse": s["prefix_cache_reused_ratio"],
           "reuse_from_records": sum(r["reused_input_tokens"] for r in recs) / sum(r["input_length"] for r in recs),
           "decode_reused_tokens": sum(r["decode_reused_input_tokens"] for r in recs),
           "ttft_p50_ms": s["median_ttft_ms"], "ttft_p90_ms": s["p90_ttft_ms"], "ttft_p99_ms": s["p99_ttft_ms"],
           "ttft_mean_ms": s["mean_ttft_ms"], "e2e_p50_ms": s["median_e2e_latency_ms"], "itl_mean_ms": s["mean_itl_ms"],
           "transfer_ms_max": max(r["destination_activated_ms"] - max(r["source_held_ms"], r["destination_reserved_ms"])
                                  for r in recs),
           "decode_span_ms_p50": statistics.median(r["first_token_ms"] - r["source_held_ms"] for r in recs),
           "prefill_queue_ms_p50": statistics.median(r["prefill_admit_ms"] - r["arrival_time_ms"] for r in recs),
           "decode_wait_ms_p50": statistics.median(r["decode_admit_ms"] - r["destination_activated_ms"] for r in recs),
           "prefill_requests_per_worker": prefill_share, "decode_requests_per_worker": decode_share}
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


def run_mocker(python: str, trace: Path, trace_name: str, topology: str, router: str) -> dict:
    P, D = TOPOLOGIES[topology]
    pb, db = POOL_BLOCKS[trace_name]
    cmd = [python, str(Path(__file__).resolve()), "_mocker", str(trace), "--prefill", str(P), "--decode", str(D),
           "--prefill-blocks", str(pb), "--decode-blocks", str(db), "--trace-block", str(TRACE_BLOCK[trace_name]),
           "--router", MOCKER_ROUTERS[router]]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"mocker failed: {' '.join(cmd)}\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------- probes
def probe_main(argv: list[str]) -> int:
    """Runs inside .venv-dynamo: the tiny replays behind the [probed] statements of
    ../../oracles/dynamo-mocker/disaggregated.md, printed per request."""
    os.environ.setdefault("DYN_LOG", "warn")
    import dynamo._core as core
    fields = ("arrival_time_ms", "ttft_ms", "reused_input_tokens", "decode_reused_input_tokens", "prefill_worker_idx",
              "decode_worker_idx", "prefill_admit_ms", "source_held_ms", "destination_reserved_ms",
              "destination_activated_ms", "decode_admit_ms", "first_token_ms")

    def rows(gap_ms: int, n: int, output: int) -> list[dict]:
        # 10 blocks of 64 tokens: 8 shared, 2 of its own
        return [{"timestamp": i * gap_ms, "input_length": 640, "output_length": output,
                 "hash_ids": list(range(8)) + [100 + 2 * i, 101 + 2 * i]} for i in range(n)]

    cases = [
        ("1P+1D, 4 requests 2 s apart, defaults (transfer takes no time)", rows(2000, 4, 8), 1, 1, {}, "round_robin", None),
        ("1P+1D, kv_bytes_per_token 131072, 1 GB/s, full_prompt", rows(2000, 4, 8), 1, 1,
         {"kv_bytes_per_token": 131072, "kv_transfer_bandwidth": 1.0, "kv_transfer_timing_mode": "full_prompt"}, "round_robin", None),
        ("1P+1D, the same, destination_missing", rows(2000, 4, 8), 1, 1,
         {"kv_bytes_per_token": 131072, "kv_transfer_bandwidth": 1.0, "kv_transfer_timing_mode": "destination_missing"}, "round_robin", None),
        ("2P+3D round robin, 8 requests 1 ms apart (decode assigned in prefill-completion order)", rows(1, 8, 50), 2, 3, {}, "round_robin", None),
        ("2P+3D, backend sglang (destination-first)", rows(1, 8, 50), 2, 3, {"backend": "sglang"}, "round_robin", None),
        ("2P+2D kv_router with conditional_disagg_enabled (no request bypasses prefill)", rows(2000, 4, 8), 2, 2, {}, "kv_router",
         {"conditional_disagg_enabled": True}),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name, reqs, P, D, extra, router, router_config in cases:
            path = Path(tmp) / "probe.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
            eng = {"backend": "vllm", "block_size": BLOCK_SIZE, "num_gpu_blocks": 1000, **extra}
            kwargs = {"router_config": core.KvRouterConfig(**router_config)} if router_config else {}
            res = core.run_mocker_trace_replay(
                [str(path)], prefill_engine_args={"engine": {**eng, "worker_type": "prefill"}},
                decode_engine_args={"engine": {**eng, "worker_type": "decode"}}, num_prefill_workers=P,
                num_decode_workers=D, router_mode=router, replay_mode="offline", trace_block_size=64,
                capture_per_request=True, **kwargs)
            print(f"{name}: reuse {res.summary['prefix_cache_reused_ratio']}")
            for r in sorted(res.per_request, key=lambda r: r["arrival_time_ms"]):
                vals = {k: round(r[k], 3) if isinstance(r[k], float) else r[k] for k in fields}
                print("    " + " ".join(f"{k}={v}" for k, v in vals.items()),
                      "pools=" + ",".join(h["pool"] for h in r["routing_history"]))
    return 0


# ---------------------------------------------------------------------------------------------------- kvsim
def run_kvsim(trace: Path, trace_name: str, topology: str, router: str, seed: int, time_model: str) -> dict:
    """kvsim's side: the disaggregated cluster (`cluster.disaggregation`), in this process (kvsim_disaggregated.py)."""
    import kvsim_disaggregated  # this folder
    return kvsim_disaggregated.run(trace, trace_name=trace_name, topology=TOPOLOGIES[topology], router=router,
                                   seed=seed, block_size=BLOCK_SIZE, trace_block=TRACE_BLOCK[trace_name],
                                   pool_blocks=POOL_BLOCKS[trace_name], time_model=time_model)


# ---------------------------------------------------------------------------------------------------- driver
def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_mocker"]:
        return mocker_main(argv[1:])
    if argv[:1] == ["_probe"]:
        return probe_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--traces", default="seed,conversation")
    p.add_argument("--topologies", default=",".join(TOPOLOGIES))
    p.add_argument("--routers", default="round-robin,kv")
    p.add_argument("--repeats", type=int, default=3, help="runs per point of the KV routers (random ties)")
    p.add_argument("--conversation-requests", type=int, default=None,
                   help="replay only the first N rows of the conversation trace")
    p.add_argument("--mocker-only", action="store_true")
    p.add_argument("--time-model", default="poly", choices=["poly", "linear"],
                   help="kvsim's step times: the mocker's polynomial per pool, or linear fits in the scenario")
    p.add_argument("--no-append", action="store_true")
    p.add_argument("--mocker-python", default=str(REPO / ".venv-dynamo" / "bin" / "python"))
    p.add_argument("--probe", action="store_true", help="only run the mocker probes and print them")
    a = p.parse_args(argv)
    if a.probe:
        return subprocess.run([a.mocker_python, str(Path(__file__).resolve()), "_probe"], cwd=REPO).returncode
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    table = []

    def emit(row: dict) -> None:
        row = {"utc": stamp, "kvsim_commit": commit, **row}
        if not a.no_append:
            with RESULTS.open("a") as f:
                f.write(json.dumps(row) + "\n")

    for trace_name in a.traces.split(","):
        trace = trace_path(trace_name, a.conversation_requests if trace_name == "conversation" else None)
        rel = os.path.relpath(trace, REPO)
        for topology in a.topologies.split(","):
            for router in a.routers.split(","):
                runs = a.repeats if router == "kv" else 1
                base = {"trace": rel, "time_model": a.time_model, "topology": topology, "router": router,
                        "prefill_blocks": POOL_BLOCKS[trace_name][0], "decode_blocks": POOL_BLOCKS[trace_name][1]}
                m = [run_mocker(a.mocker_python, trace, trace_name, topology, router) for _ in range(runs)]
                for i, r in enumerate(m):
                    emit({"sim": "mocker", "run": i, **base, **r})
                k = []
                if not a.mocker_only:
                    k = [run_kvsim(trace, trace_name, topology, router, seed, a.time_model) for seed in range(runs)]
                    for i, r in enumerate(k):
                        emit({"sim": "kvsim", "run": i, **base, **r})
                row = (trace_name, topology, router, band([r["reuse"] for r in m]),
                       band([r["reuse"] for r in k]) if k else "—",
                       band([r["ttft_p50_ms"] for r in m], ".1f"),
                       band([r["ttft_p50_ms"] for r in k], ".1f") if k else "—",
                       band([r["ttft_p99_ms"] for r in m], ".0f"),
                       band([r["ttft_p99_ms"] for r in k], ".0f") if k else "—",
                       band([r["decode_span_ms_p50"] for r in m], ".1f"),
                       band([r["decode_span_ms_p50"] for r in k], ".1f") if k else "—",
                       band([r["wall_s"] for r in m], ".2f"), band([r["wall_s"] for r in k], ".2f") if k else "—")
                table.append(row)
                print(*row, sep=" | ", flush=True)
    print()
    print("| trace | P+D | router | reuse mocker | reuse kvsim | TTFT p50 ms mocker | kvsim | TTFT p99 ms mocker | kvsim "
          "| prefill done -> first token p50 ms mocker | kvsim | wall s mocker | kvsim |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
