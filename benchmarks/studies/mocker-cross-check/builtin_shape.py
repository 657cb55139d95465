#!/usr/bin/env python3
"""kvsim's kv-aware router against Dynamo's KV router in Dynamo's mocker, on a trace shaped like kvsim's built-in
workload (findings: builtin_shape.md in this folder).

The trace (Mooncake JSONL, hash_ids of 64-token blocks): 2,000 requests, Poisson arrivals at 8 req/s, each a
2,048-token prefix drawn uniformly from 24 (32 shared blocks per prefix) plus a unique 339-token tail (6 blocks of
its own, the last one partial): 2,387 prompt tokens, 64 output tokens. Fixed seed, so the file is identical each
time.

Both simulators get vLLM workers with 64-token blocks and 146 GPU blocks each (null block included in kvsim's
count, as `kvsim replay --kv-blocks`), 6/10/16/24 workers, and two routers:
  * mocker: `dynamo._core.run_mocker_trace_replay` (ai-dynamo-runtime 1.6.1, offline mode, default router config,
    default polynomial timing), `router_mode` kv_router and round_robin. kv_router is not deterministic (random
    tie-break), so it runs --repeats times; plus one extra run with capture_per_request=True whose per-request
    records are summarised (that run is not timed).
  * kvsim: `sim.replay.replay` with router kv-aware (--repeats scenario seeds) and round-robin, in one process
    (jobs=1, to compare speed like with like), under two time models:
      - `trace-replay`: scenarios/trace-replay.yaml as shipped (matched to the mocker's timing on the Mooncake
        conversation trace at 46,875 blocks per worker);
      - `fitted`: builtin_shape.yaml in this folder, the same scenario with step times fitted to the mocker's
        polynomial on this workload's steps (see builtin_shape.md for how);
      - `scratch-polynomial` (not in the default list): the mocker's polynomial itself. Needs a kvsim tree with
        builtin_shape_scratch_polynomial.patch applied (a git worktree, never the main checkout) given as
        --kvsim-root; the patch reads the capacity from KVSIM_DYNAMO_POLY_CAPACITY, which this script sets.

Reuse on both sides is reused (cached) prompt tokens / prompt tokens at first admission (the mocker's
`prefix_cache_reused_ratio`, kvsim's `prefix_reuse`); there are no warm-ups in a replay.
Wall times are of the replay call only (trace written beforehand, imports excluded), one run after the other.

Run from the repository root (the mocker runs in a subprocess with the side venv .venv-dynamo):

    .venv/bin/python benchmarks/studies/mocker-cross-check/builtin_shape.py                 # everything, appends builtin_shape.jsonl
    .venv/bin/python benchmarks/studies/mocker-cross-check/builtin_shape.py --workers 10 --repeats 2 --no-append

    .venv/bin/python benchmarks/studies/mocker-cross-check/builtin_shape.py --timing-probe  # the mocker's step times, probed

Options: --workers LIST, --repeats N, --time-models LIST (trace-replay,fitted), --trace PATH (default
builtin_shape_trace.jsonl in this folder, git-ignored), --no-append, --mocker-python PATH, --kv-event-lag-ms X (mocker side check;
default: none, the mocker's own default of synchronous events), --kvsim-root PATH (the kvsim source tree to import;
default: this repository). Results record the trace and the kvsim tree relative to the repository when they are
inside it, else by their directory's name, never by a machine's absolute path.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
RESULTS = HERE / "builtin_shape.jsonl"
TIME_MODELS = {"trace-replay": REPO / "scenarios" / "trace-replay.yaml", "fitted": HERE / "builtin_shape.yaml",
               "scratch-polynomial": REPO / "scenarios" / "trace-replay.yaml"}

# Workload (kvsim's built-in shape) and engine
NUM_REQUESTS, NUM_PREFIXES, RATE_PER_S, SEED = 2000, 24, 8.0, 20261201
PREFIX_TOKENS, TAIL_TOKENS, OUTPUT_TOKENS, TRACE_BLOCK = 2048, 339, 64, 64
BLOCK_SIZE, NUM_GPU_BLOCKS = 64, 146


# ---------------------------------------------------------------------------------------------------- the trace
def write_trace(path: Path) -> None:
    """Mooncake JSONL: timestamp (ms, integer), input_length, output_length, hash_ids (64-token blocks, chained:
    prefix p's block j is p * 32 + j; every request's 6 tail blocks are new ids)."""
    rng = random.Random(SEED)
    per_prefix = PREFIX_TOKENS // TRACE_BLOCK
    n_in = PREFIX_TOKENS + TAIL_TOKENS
    tail_blocks = -(-n_in // TRACE_BLOCK) - per_prefix
    next_id = NUM_PREFIXES * per_prefix
    t = 0.0
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        for _ in range(NUM_REQUESTS):
            t += rng.expovariate(RATE_PER_S)
            p = rng.randrange(NUM_PREFIXES)
            ids = [p * per_prefix + j for j in range(per_prefix)] + list(range(next_id, next_id + tail_blocks))
            next_id += tail_blocks
            f.write(json.dumps({"timestamp": round(t * 1000), "input_length": n_in,
                                "output_length": OUTPUT_TOKENS, "hash_ids": ids}) + "\n")
    tmp.replace(path)


# ---------------------------------------------------------------------------------------------------- the mocker
def mocker_main(argv: list[str]) -> int:
    """Runs inside .venv-dynamo: one replay, one JSON line on stdout."""
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--router", required=True)
    p.add_argument("--capture", action="store_true")
    p.add_argument("--kv-event-lag-ms", type=float, default=None)
    a = p.parse_args(argv)
    os.environ.setdefault("DYN_LOG", "warn")
    import dynamo._core as core
    kwargs = {"kv_event_lag_ms": a.kv_event_lag_ms} if a.kv_event_lag_ms else {}
    t0 = time.perf_counter()
    result = core.run_mocker_trace_replay(
        [a.trace], extra_engine_args={"engine": {"backend": "vllm", "block_size": BLOCK_SIZE,
                                                 "num_gpu_blocks": NUM_GPU_BLOCKS}},
        num_workers=a.workers, router_mode=a.router, replay_mode="offline", trace_block_size=TRACE_BLOCK,
        capture_per_request=a.capture, **kwargs)
    wall = time.perf_counter() - t0
    s = dict(result.summary)
    out = {"wall_s": wall, "requests": s["completed_requests"], "reuse": s["prefix_cache_reused_ratio"],
           "first_admission_reuse": s["first_admission_prefix_cache_reused_ratio"],
           "ttft_p50_ms": s["median_ttft_ms"], "ttft_p99_ms": s["p99_ttft_ms"], "ttft_mean_ms": s["mean_ttft_ms"],
           "e2e_mean_ms": s["mean_e2e_latency_ms"], "itl_mean_ms": s["mean_itl_ms"]}
    if a.capture:
        out["per_request"] = summarise_mocker_records(result.per_request)
    sys.stdout.write(json.dumps(out) + "\n")
    return 0


def summarise_mocker_records(records: list[dict]) -> dict:
    """What the per-request records show: did the router pick the best-cached worker, did the engine reuse what the
    router saw at routing time (event lag), who waited for admission, readmissions; reuse recomputed from them."""
    n = len(records)
    chose_less, reuse_differs, waited, readmitted = 0, 0, 0, 0
    reused = prompt = 0
    for r in records:
        route = r["routing_history"][0]
        if route["selected_overlap_blocks"] is not None and route["selected_overlap_blocks"] < route["best_available_overlap_blocks"]:
            chose_less += 1
        if route["selected_overlap_blocks"] is not None and r["reused_input_tokens"] != route["selected_overlap_blocks"] * BLOCK_SIZE:
            reuse_differs += 1
        waited += (r["first_admit_ms"] - r["arrival_time_ms"]) > 100.0
        readmitted += r["readmission_count"] > 0
        reused += r["reused_input_tokens"]
        prompt += r["input_length"]
    e2e = sorted(r["e2e_latency_ms"] for r in records)
    return {"requests": n, "reuse_from_records": reused / prompt,
            "chose_less_than_best_overlap": chose_less,
            "engine_reuse_differs_from_routed_overlap": reuse_differs,
            "waited_over_100ms_for_admission": waited, "readmitted": readmitted,
            "e2e_p50_ms": e2e[n // 2], "full_prefix_hits": sum(r["reused_input_tokens"] >= PREFIX_TOKENS for r in records),
            "zero_hits": sum(r["reused_input_tokens"] == 0 for r in records)}


def poly_prefill_ms(t: int) -> float:
    """The mocker's default prefill time for t new tokens in a step (lib/mocker/src/common/perf_model.rs)."""
    return 4.209989e-07 * t * t + 1.518344e-02 * t + 1.650142e+01 if t > 0 else 0.0


def poly_decode_ms(context_tokens: int, capacity_tokens: int = NUM_GPU_BLOCKS * BLOCK_SIZE) -> float:
    """The mocker's default decode time: u = decode context tokens / KV capacity tokens."""
    u = context_tokens / capacity_tokens
    return max(-25.74 * u * u + 54.01 * u + 5.74, 1.0)


def probe_main(argv: list[str]) -> int:
    """Runs inside .venv-dynamo: tiny traces on one worker (146 blocks) whose timings pin down the step-time model:
    measured TTFT/TTST against the polynomial."""
    os.environ.setdefault("DYN_LOG", "warn")
    import tempfile
    import dynamo._core as core
    n_in = PREFIX_TOKENS + TAIL_TOKENS

    def req(t, ids):
        return {"timestamp": t, "input_length": n_in, "output_length": OUTPUT_TOKENS, "hash_ids": ids}

    cold = lambda k: list(range(1000 * k, 1000 * k + 38))  # noqa: E731
    cases = {
        "one cold request": ([req(0, cold(0))], [("TTFT", poly_prefill_ms(n_in)), ("TTST", poly_decode_ms(n_in + 1))]),
        "three cold at t=0 (one prefill step of 7,161 tokens)": (
            [req(0, cold(k)) for k in range(3)], [("TTFT", poly_prefill_ms(3 * n_in)), ("TTST", poly_decode_ms(3 * (n_in + 1)))]),
        "cold at 0, cold at 200 ms (mixed step: 2nd's first step = prefill + 1 decode)": (
            [req(0, cold(0)), req(200, cold(1))], [("2nd TTFT - wait for step boundary", poly_prefill_ms(n_in) + poly_decode_ms(n_in + 10))]),
        "cold at 0, same prefix at 200 ms (339-token tail + 1 decode)": (
            [req(0, cold(0)), req(200, cold(0)[:32] + list(range(5000, 5006)))],
            [("2nd TTFT - wait for step boundary", poly_prefill_ms(TAIL_TOKENS) + poly_decode_ms(n_in + 10))]),
        "five cold at t=0 (only three fit in 146 blocks)": ([req(0, cold(k)) for k in range(5)], []),
    }
    with tempfile.TemporaryDirectory() as tmp:
        for name, (reqs, expect) in cases.items():
            path = Path(tmp) / "probe.jsonl"
            path.write_text("".join(json.dumps(r) + "\n" for r in reqs))
            res = core.run_mocker_trace_replay(
                [str(path)], extra_engine_args={"engine": {"backend": "vllm", "block_size": BLOCK_SIZE,
                                                          "num_gpu_blocks": NUM_GPU_BLOCKS}},
                num_workers=1, router_mode="round_robin", replay_mode="offline", trace_block_size=TRACE_BLOCK,
                capture_per_request=True)
            recs = sorted(res.per_request, key=lambda r: (r["arrival_time_ms"], r["first_admit_ms"]))
            print(name)
            for r in recs:
                print(f"    arrival {r['arrival_time_ms']:7.1f}  admitted {r['first_admit_ms']:7.1f}  TTFT {r['ttft_ms']:8.3f}"
                      f"  TTST {r['ttst_ms']:7.3f}  mean ITL {r['itl_ms']:7.3f}  reused {r['reused_input_tokens']}")
            for label, value in expect:
                print(f"    polynomial {label}: {value:.3f} ms")
    return 0


def run_mocker(python: str, trace: Path, workers: int, router: str, *, capture: bool = False,
               lag_ms: float | None = None) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "_mocker", str(trace), "--workers", str(workers), "--router", router]
    if capture:
        cmd.append("--capture")
    if lag_ms:
        cmd += ["--kv-event-lag-ms", str(lag_ms)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=REPO)
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------- kvsim
def kvsim_scenario(time_model: str, workers: int, router: str, seed: int):
    from sim.scenario import load_scenario
    base, _ = load_scenario(TIME_MODELS[time_model])
    engine = base.engine.model_copy(update={"block_size": BLOCK_SIZE})
    return base.with_overrides(**{"cluster.workers": workers, "engine.block_size": BLOCK_SIZE, "seed": seed,
                                  "router.name": router, "router.options": {},
                                  **engine.capacity_overrides(tokens=None, blocks=NUM_GPU_BLOCKS, kv_bytes=None)})


def use_time_model(time_model: str) -> None:
    """`scratch-polynomial` switches the patched tree's build_time_model to the mocker's polynomial."""
    if time_model == "scratch-polynomial":
        import sim.timing.linear as tm
        if not hasattr(tm, "DynamoPolynomialTimeModel"):
            raise SystemExit("scratch-polynomial needs --kvsim-root at a tree with builtin_shape_scratch_polynomial.patch")
        os.environ["KVSIM_DYNAMO_POLY_CAPACITY"] = str(NUM_GPU_BLOCKS * BLOCK_SIZE)
    else:
        os.environ.pop("KVSIM_DYNAMO_POLY_CAPACITY", None)


def run_kvsim(trace: Path, time_model: str, workers: int, router: str, seed: int) -> dict:
    from sim.replay import replay
    use_time_model(time_model)
    from sim.workloads.traces import read_mooncake
    scenario = kvsim_scenario(time_model, workers, router, seed)
    t0 = time.perf_counter()
    result = replay(scenario, lambda: read_mooncake(trace, block_size=BLOCK_SIZE, trace_block_tokens=TRACE_BLOCK),
                    jobs=1)
    wall = time.perf_counter() - t0
    st = result.stats
    return {"wall_s": wall, "requests": st.requests, "reuse": st.prefix_reuse,
            "ttft_p50_ms": st.ttft_ms.percentile(50), "ttft_p99_ms": st.ttft_ms.percentile(99),
            "e2e_p50_ms": st.e2e_ms.percentile(50), "preemptions": sum(w.engine.preemptions for w in result.workers)}


def kvsim_per_request(trace: Path, time_model: str, workers: int, seed: int) -> dict:
    """kvsim's counterpart of the mocker's per-request summary: the same replay loop as sim.replay._replay, keeping
    each RequestRecord and, at routing time, the chosen and the best overlap (read from the router's own costs)."""
    import simpy
    from sim.cluster.cluster import Cluster
    from sim.runner import build_router
    from sim.workloads.traces import read_mooncake
    use_time_model(time_model)
    scenario = kvsim_scenario(time_model, workers, "kv-aware", seed)
    env = simpy.Environment()
    router = build_router(scenario)
    cluster = Cluster(env, scenario, router)
    records, routed = [], {}

    def arrivals():
        for item in read_mooncake(trace, block_size=BLOCK_SIZE, trace_block_tokens=TRACE_BLOCK):
            if item.arrival_s > env.now:
                yield env.timeout(item.arrival_s - env.now)
            req = item.request
            overlaps = [cluster.cached_prefix_tokens(w, req) // BLOCK_SIZE for w in range(workers)]
            worker = cluster.route(req)
            routed[req.request_id] = (overlaps[worker], max(overlaps))
            cluster.dispatch(req, worker, records.append)

    env.process(arrivals())
    env.run()
    n = len(records)
    e2e = sorted(r.e2e_s * 1000 for r in records)
    return {"requests": n, "reuse_from_records": sum(r.cached_tokens for r in records) / sum(r.prompt_tokens for r in records),
            "chose_less_than_best_overlap": sum(routed[r.request_id][0] < routed[r.request_id][1] for r in records),
            "engine_reuse_differs_from_routed_overlap": sum(r.cached_tokens != routed[r.request_id][0] * BLOCK_SIZE for r in records),
            "waited_over_100ms_for_admission": sum(r.admitted_s - r.arrival_s > 0.1 for r in records),
            "readmitted": sum(r.num_preemptions > 0 for r in records), "e2e_p50_ms": e2e[n // 2],
            "full_prefix_hits": sum(r.cached_tokens >= PREFIX_TOKENS for r in records),
            "zero_hits": sum(r.cached_tokens == 0 for r in records)}


# ---------------------------------------------------------------------------------------------------- driver
def portable(path: Path) -> str:
    """How results name `path`: relative to the repository when inside it, else by its directory's name alone (a
    scratch worktree such as ../kvsim-head), so that committed results carry no machine's absolute paths."""
    resolved = path.resolve()
    try:
        return str(resolved.relative_to(REPO))
    except ValueError:
        return resolved.name


def band(values: list[float], fmt: str = ".3f") -> str:
    lo, hi = min(values), max(values)
    return f"{lo:{fmt}}" if lo == hi else f"{lo:{fmt}}–{hi:{fmt}}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_mocker"]:
        return mocker_main(argv[1:])
    if argv[:1] == ["_probe"]:
        return probe_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", default="6,10,16,24")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--time-models", default="trace-replay,fitted")
    p.add_argument("--trace", type=Path, default=HERE / "builtin_shape_trace.jsonl")
    p.add_argument("--no-append", action="store_true")
    p.add_argument("--mocker-python", default=str(REPO / ".venv-dynamo" / "bin" / "python"))
    p.add_argument("--kv-event-lag-ms", type=float, default=None)
    p.add_argument("--kvsim-root", type=Path, default=REPO,
                   help="kvsim source tree to import (e.g. a clean `git worktree add --detach ../kvsim-head HEAD`)")
    p.add_argument("--timing-probe", action="store_true",
                   help="only run the mocker timing probes (tiny traces, one worker) and print them")
    a = p.parse_args(argv)
    if a.timing_probe:
        return subprocess.run([a.mocker_python, str(Path(__file__).resolve()), "_probe"], cwd=REPO).returncode
    sys.path.insert(0, str(a.kvsim_root.resolve()))
    workers_list = [int(w) for w in a.workers.split(",")]
    time_models = a.time_models.split(",")
    write_trace(a.trace)
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    git = lambda *args: subprocess.run(["git", "-C", str(a.kvsim_root), *args], capture_output=True, text=True).stdout.strip()  # noqa: E731
    kvsim_commit = git("rev-parse", "HEAD")
    kvsim_dirty = sorted(line[3:] for line in git("status", "--porcelain", "--", "sim", "policies").splitlines())
    rows = []

    def emit(row: dict) -> None:
        row = {"utc": stamp, "trace": portable(a.trace), "kvsim_root": portable(a.kvsim_root),
               "kvsim_commit": kvsim_commit, "kvsim_uncommitted": kvsim_dirty, "requests_in_trace": NUM_REQUESTS, "num_gpu_blocks": NUM_GPU_BLOCKS,
               "block_size": BLOCK_SIZE, **row}
        rows.append(row)
        if not a.no_append:
            with RESULTS.open("a") as f:
                f.write(json.dumps(row) + "\n")

    table = []
    for W in workers_list:
        m_kv = [run_mocker(a.mocker_python, a.trace, W, "kv_router", lag_ms=a.kv_event_lag_ms) for _ in range(a.repeats)]
        for i, r in enumerate(m_kv):
            emit({"sim": "mocker", "workers": W, "router": "kv_router", "run": i, "kv_event_lag_ms": a.kv_event_lag_ms, **r})
        m_cap = run_mocker(a.mocker_python, a.trace, W, "kv_router", capture=True, lag_ms=a.kv_event_lag_ms)
        emit({"sim": "mocker", "workers": W, "router": "kv_router", "run": "capture", "kv_event_lag_ms": a.kv_event_lag_ms, **m_cap})
        m_rr = run_mocker(a.mocker_python, a.trace, W, "round_robin")
        emit({"sim": "mocker", "workers": W, "router": "round_robin", "run": 0, **m_rr})
        for tm in time_models:
            k_kv = [run_kvsim(a.trace, tm, W, "kv-aware", seed) for seed in range(a.repeats)]
            for seed, r in enumerate(k_kv):
                emit({"sim": "kvsim", "time_model": tm, "workers": W, "router": "kv-aware", "run": seed, **r})
            k_cap = kvsim_per_request(a.trace, tm, W, 0)
            emit({"sim": "kvsim", "time_model": tm, "workers": W, "router": "kv-aware", "run": "records", "per_request": k_cap})
            k_rr = run_kvsim(a.trace, tm, W, "round-robin", 0)
            emit({"sim": "kvsim", "time_model": tm, "workers": W, "router": "round-robin", "run": 0, **k_rr})
            m_rps = statistics.median(NUM_REQUESTS / r["wall_s"] for r in m_kv)
            k_rps = statistics.median(NUM_REQUESTS / r["wall_s"] for r in k_kv)
            table.append((W, tm, band([r["reuse"] for r in m_kv]), band([r["reuse"] for r in k_kv]),
                          band([r["ttft_p50_ms"] for r in m_kv], ".0f"), band([r["ttft_p50_ms"] for r in k_kv], ".0f"),
                          band([r["ttft_p99_ms"] for r in m_kv], ".0f"), band([r["ttft_p99_ms"] for r in k_kv], ".0f"),
                          f"{m_cap['per_request']['chose_less_than_best_overlap']}/{k_cap['chose_less_than_best_overlap']}",
                          f"{k_rps / m_rps:.3f}",
                          f"{m_rr['reuse']:.4f}/{k_rr['reuse']:.4f}",
                          f"{(NUM_REQUESTS / k_rr['wall_s']) / (NUM_REQUESTS / m_rr['wall_s']):.3f}"))
            print(*table[-1], sep=" | ", flush=True)
    print()
    print("| workers | kvsim time model | reuse mocker (runs) | reuse kvsim (seeds) | TTFT p50 ms mocker / kvsim "
          "| TTFT p99 ms mocker / kvsim | routed below best overlap, mocker/kvsim | speed ratio kv-aware "
          "| RR reuse mocker/kvsim | speed ratio RR |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for W, tm, mr, kr, m50, k50, m99, k99, regret, sp, rr, sprr in table:
        print(f"| {W} | {tm} | {mr} | {kr} | {m50} / {k50} | {m99} / {k99} | {regret} | {sp} | {rr} | {sprr} |")
    if not a.no_append:
        print(f"\nappended {len(rows)} lines to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
