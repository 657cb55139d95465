#!/usr/bin/env python3
"""Autoscaling in kvsim against autoscaling in Dynamo's mocker: one scaling rule drives both, on one trace with a load
ramp (findings: autoscaling.md in this folder; what the mocker's scaling callback is: ../../oracles/dynamo-mocker/
scaling.md).

The rule is kvsim's own autoscaler object (`policies.autoscalers.AUTOSCALERS`, built from a spec such as
`hpa:metric=in_flight,target=2` or `schedule:at=0/2,600/8`), so the two sides differ only in what they simulate, not
in the rule. On the mocker side it runs in this process and drives the mocker through the mocker's offline
`scaling_policy` callback, over a pipe: the mocker runs in a child process in the side venv `.venv-dynamo`
(ai-dynamo-runtime 1.6.1); at every tick the child sends the mocker's snapshot, this process turns it into kvsim's
`FleetSnapshot` (`MockerSnapshotAdapter`), asks the autoscaler, clamps to [min, max] as kvsim's fleet does, and answers
the target worker count. On the kvsim side the same spec goes to `kvsim replay --autoscaler` (phase 2 of issue 26,
once kvsim's elastic fleet is on main).

The trace (Mooncake JSONL, 64-token hash_ids, fixed seed, autoscaling_trace.jsonl in this folder, git-ignored): the
shape of builtin_shape.py's requests (a 2,048-token prefix drawn from 24, a unique 339-token tail, 64 output tokens),
with non-homogeneous Poisson arrivals (thinning) whose rate ramps 1 -> 10 req/s over 10 min, holds 5 min, ramps back
to 1 req/s over 10 min and stays there 10 min (2,100 s, about 10,000 requests).

Workers on both sides: vLLM, 64-token blocks, 146 GPU blocks each (as builtin_shape.py, whose `builtin_shape.yaml` is
kvsim's step-time model fitted to the mocker's default timing at this capacity). New workers need `--startup-s`
seconds (mocker: the engine launch config's `startup_time`, seconds; kvsim: the fleet's provisioning delay).

Run from the repository root:

    .venv/bin/python benchmarks/studies/mocker-cross-check/autoscaling.py --rules hpa,schedule      # both sides
    .venv/bin/python benchmarks/studies/mocker-cross-check/autoscaling.py --sides mocker --no-append
    .venv/bin/python benchmarks/studies/mocker-cross-check/autoscaling.py --probe   # the callback's semantics, probed

Options: --rules LIST (hpa, schedule: `rules()` below; or full specs), --sides mocker,kvsim, --router round_robin|kv_router
(kvsim: round-robin|kv-aware), --min-workers, --max-workers, --initial-workers, --startup-s, --slo-ttft-ms,
--trace PATH, --no-append, --mocker-python PATH, --kvsim-root PATH (the kvsim tree whose `policies.autoscalers` builds
the rule; default: this repository). Results (one JSON line per side and rule) go to autoscaling.jsonl in this folder.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
RESULTS = HERE / "autoscaling.jsonl"

# The request shape and the engine are builtin_shape.py's (its time-model fit holds at this capacity only).
PREFIX_TOKENS, TAIL_TOKENS, OUTPUT_TOKENS, NUM_PREFIXES, TRACE_BLOCK = 2048, 339, 64, 24, 64
BLOCK_SIZE, NUM_GPU_BLOCKS = 64, 146
SEED = 20261202
RAMP = ((0.0, 1.0), (600.0, 10.0), (900.0, 10.0), (1500.0, 1.0), (2100.0, 1.0))
"""(time s, arrival rate req/s) points, linear in between: the load ramp."""

WORKER_RPS = 1.0
"""Requests per second one worker serves within the SLO on this trace (the HPA run holds 0.8-1.2 req/s per ready
worker at the plateau; 2 workers at 1.4 req/s each queue for seconds)."""


def ramp_schedule(lead_s: float, step_s: float = 60.0) -> str:
    """A `schedule` spec that follows the ramp: every `step_s`, the workers the rate `lead_s` later needs at
    WORKER_RPS each (at least 2), listing only the changes. With `lead_s` = the start-up time, workers are ready when
    the load they are for arrives."""
    points, last = [], None
    t = 0.0
    while t < RAMP[-1][0]:
        workers = max(2, math.ceil(ramp_rate_per_s(min(t + lead_s, RAMP[-1][0])) / WORKER_RPS - 1e-9))
        if workers != last:
            points.append(f"{t:g}/{workers}")
            last = workers
        t += step_s
    return "schedule:at=" + ",".join(points)


def rules(startup_s: float) -> dict[str, str]:
    """Rule name -> autoscaler spec (kvsim's `--autoscaler` form)."""
    return {
        # Kubernetes HPA on in-flight requests per ready worker, every other field at its autoscaling/v2 default.
        "hpa": "hpa:metric=in_flight,target=2",
        # Replicas over time, following the ramp one start-up ahead.
        "schedule": ramp_schedule(lead_s=startup_s),
    }


# ---------------------------------------------------------------------------------------------------- the trace
def ramp_rate_per_s(t_s: float) -> float:
    """The arrival rate at `t_s` (linear between the RAMP points, 0 after the last)."""
    for (t0, r0), (t1, r1) in zip(RAMP, RAMP[1:]):
        if t0 <= t_s <= t1:
            return r0 + (r1 - r0) * (t_s - t0) / (t1 - t0)
    return 0.0


def write_trace(path: Path) -> int:
    """Mooncake JSONL (timestamp ms as an integer, input_length, output_length, hash_ids of 64-token blocks: prefix
    p's block j is p * 32 + j, every request's 6 tail blocks are new ids). Arrivals: a Poisson process at the ramp's
    peak rate thinned to the ramp (Lewis-Shedler; exact for a bounded rate). Returns the number of requests."""
    rng = random.Random(SEED)
    peak = max(rate for _, rate in RAMP)
    per_prefix = PREFIX_TOKENS // TRACE_BLOCK
    n_in = PREFIX_TOKENS + TAIL_TOKENS
    tail_blocks = -(-n_in // TRACE_BLOCK) - per_prefix
    next_id = NUM_PREFIXES * per_prefix
    end_s = RAMP[-1][0]
    t, n = 0.0, 0
    tmp = path.with_suffix(".tmp")
    with tmp.open("w") as f:
        while True:
            t += rng.expovariate(peak)
            if t >= end_s:
                break
            keep = rng.random() < ramp_rate_per_s(t) / peak
            p = rng.randrange(NUM_PREFIXES)   # drawn either way, so the prefixes do not depend on the thinning
            if not keep:
                continue
            ids = [p * per_prefix + j for j in range(per_prefix)] + list(range(next_id, next_id + tail_blocks))
            next_id += tail_blocks
            f.write(json.dumps({"timestamp": round(t * 1000), "input_length": n_in,
                                "output_length": OUTPUT_TOKENS, "hash_ids": ids}) + "\n")
            n += 1
    tmp.replace(path)
    return n


# ---------------------------------------------------------------------------------------------------- mocker child
def mocker_engine_config(startup_s: float | None) -> dict:
    """The mocker's engine launch config. `startup_time` (seconds) sits beside `engine`, not in it; None or 0 makes
    a new worker routable at the tick that adds it."""
    config: dict[str, Any] = {"engine": {"backend": "vllm", "block_size": BLOCK_SIZE, "num_gpu_blocks": NUM_GPU_BLOCKS}}
    if startup_s:
        config["startup_time"] = startup_s
    return config


def mocker_child_main(argv: list[str]) -> int:
    """Runs inside .venv-dynamo: one replay with a scaling policy that asks the parent at every tick. Protocol on
    stdin/stdout, one JSON object a line: child -> {"tick": <the mocker's snapshot dict>}, parent -> {"target": n};
    at the end child -> {"result": {...}}. The mocker logs to stderr; stray prints are sent there too."""
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--router", required=True)
    p.add_argument("--tick-s", type=float, required=True)
    p.add_argument("--startup-s", type=float, default=None)
    p.add_argument("--slo-ttft-ms", type=float, default=None)
    a = p.parse_args(argv)
    protocol_out = sys.stdout
    sys.stdout = sys.stderr
    os.environ.setdefault("DYN_LOG", "error")
    import dynamo._core as core

    tick_ms = a.tick_s * 1000.0

    class ParentPolicy:
        """The mocker's `scaling_policy`: the first tick at one interval (kvsim's autoscaler is first called at
        `interval_s`), then every interval; the parent answers the target."""

        def initial_tick_ms(self) -> float:
            return tick_ms

        def on_tick(self, snapshot: dict) -> dict:
            protocol_out.write(json.dumps({"tick": snapshot}) + "\n")
            protocol_out.flush()
            reply = json.loads(sys.stdin.readline())
            return {"target_prefill": None, "target_decode": reply["target"],
                    "next_tick_ms": snapshot["now_ms"] + tick_ms}

    t0 = time.perf_counter()
    result = core.run_mocker_trace_replay(
        [a.trace], extra_engine_args=mocker_engine_config(a.startup_s), num_workers=a.workers,
        router_mode=a.router, replay_mode="offline", trace_block_size=TRACE_BLOCK, capture_per_request=True,
        scaling_policy=ParentPolicy(), sla_ttft_ms=a.slo_ttft_ms)
    wall_s = time.perf_counter() - t0
    summary = dict(result.summary)
    summary.pop("per_request", None)
    requests = [[r["arrival_time_ms"], r["ttft_ms"], r["e2e_latency_ms"], r["decode_worker_idx"],
                 r["reused_input_tokens"], r["input_length"], r["output_length"]] for r in result.per_request]
    out = {"wall_s": wall_s, "summary": summary, "lifecycle": result.lifecycle_operations, "requests": requests,
           "request_fields": ["arrival_ms", "ttft_ms", "e2e_ms", "worker", "reused_tokens", "input_tokens",
                              "output_tokens"]}
    protocol_out.write(json.dumps({"result": out}, default=str) + "\n")
    protocol_out.flush()
    return 0


# ---------------------------------------------------------------------------------------------------- the adapter
def fpm_in_flight(fpm: dict) -> tuple[int, int]:
    """(running, waiting) of one forward-pass snapshot: running = the pass's prefill + decode requests, waiting =
    its queued prefill + queued decode requests."""
    running = fpm["num_prefill_requests"] + fpm["num_decode_requests"]
    waiting = fpm["num_queued_prefill"] + fpm["num_queued_decode"]
    return running, waiting


class MockerSnapshotAdapter:
    """Turns the mocker's aggregated-mode tick snapshot into kvsim's `FleetSnapshot`.

    What maps exactly: the phases (active -> ready, starting, draining; the mocker's worker ids are never reused, so
    a worker id is both the slot and the instance), the window length and its arrivals (`traffic.num_req`).
    What maps from the latest forward pass of each ready worker (`decode_fpm_snapshots`; a worker that ran no pass
    for 1 s gets an all-zero one, and starting or draining workers get none): num_running, num_waiting, in_flight =
    their sum (the pass may be up to one step older than the tick), kv_usage = the pass's KV tokens / capacity (the
    blocks of the running requests; kvsim's is vLLM's used-block fraction).
    What the mocker's snapshot does not give, left empty or zero and never read by the HPA and schedule rules
    compared here: per-request TTFTs (only a window mean over requests *completed* in the window), prompt tokens of
    the arrivals, and cached/admitted prompt tokens (only the KV router's mean overlap ratio). `phase_since_s` is the
    first tick at which this adapter saw the worker in its phase (the mocker does not say when it changed).
    """

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity_tokens = capacity_tokens
        self._seen: dict[int, tuple[str, float]] = {}

    def fleet_snapshot(self, snap: dict):
        from sim.cluster.scaling import FleetSnapshot, WorkerSnapshot

        now_s = snap["now_ms"] / 1000.0
        fpm = {f["worker_id"]: f for f in snap["decode_fpm_snapshots"]}
        phases = ([(w, "ready") for w in snap["active_decode_ids"]]
                  + [(w, "starting") for w in snap["starting_decode_ids"]]
                  + [(w, "draining") for w in snap["draining_decode_ids"]])
        workers = []
        for worker, phase in sorted(phases):
            seen = self._seen.get(worker)
            if seen is None or seen[0] != phase:
                seen = self._seen[worker] = (phase, now_s)
            running = waiting = 0
            kv_usage = 0.0
            if worker in fpm:
                running, waiting = fpm_in_flight(fpm[worker])
                kv_tokens = fpm[worker]["sum_prefill_kv_tokens"] + fpm[worker]["sum_decode_kv_tokens"]
                kv_usage = min(1.0, kv_tokens / self.capacity_tokens)
            workers.append(WorkerSnapshot(worker=worker, instance=worker, phase=phase, phase_since_s=seen[1],
                                          in_flight=running + waiting, num_running=running, num_waiting=waiting,
                                          kv_usage=kv_usage))
        traffic = snap["traffic"]
        return FleetSnapshot(
            now_s=now_s, workers=tuple(workers), window_s=traffic["duration_s"], arrivals=traffic["num_req"],
            arrival_prompt_tokens=0, completed=traffic["ttft_count"],
            completed_output_tokens=round(traffic["avg_osl"] * traffic["shape_count"]), ttft_ms=(),
            cached_prompt_tokens=0, admitted_prompt_tokens=0)


# ---------------------------------------------------------------------------------------------------- the rule
def build_autoscaler(spec: str, min_workers: int, max_workers: int):
    """kvsim's autoscaler for `spec` (`name:key=value,...`), built as kvsim's composition root builds it."""
    from policies.autoscalers import build_autoscaler as build, split_autoscaler_spec

    name, options = split_autoscaler_spec(spec)
    return build(name, options, min_workers=min_workers, max_workers=max_workers)


def run_mocker(a: argparse.Namespace, rule: str, spec: str) -> dict:
    """The mocker side: the replay in the child, the autoscaler here; returns the row for autoscaling.jsonl."""
    autoscaler = build_autoscaler(spec, a.min_workers, a.max_workers)
    adapter = MockerSnapshotAdapter(NUM_GPU_BLOCKS * BLOCK_SIZE)
    cmd = [a.mocker_python, str(Path(__file__).resolve()), "_mocker", str(a.trace), "--workers", str(a.initial_workers),
           "--router", a.router, "--tick-s", str(autoscaler.interval_s), "--startup-s", str(a.startup_s)]
    if a.slo_ttft_ms is not None:
        cmd += ["--slo-ttft-ms", str(a.slo_ttft_ms)]
    ticks, result = [], None
    with subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=REPO) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        for line in proc.stdout:
            msg = json.loads(line)
            if "result" in msg:
                result = msg["result"]
                continue
            fleet = adapter.fleet_snapshot(msg["tick"])
            desired = autoscaler.desired_workers(fleet)
            target = min(max(desired, a.min_workers), a.max_workers)
            proc.stdin.write(json.dumps({"target": target}) + "\n")
            proc.stdin.flush()
            ready = [w for w in fleet.workers if w.phase == "ready"]
            ticks.append({"t_s": fleet.now_s, "ready": fleet.ready, "starting": fleet.starting,
                          "draining": fleet.count("draining"), "arrivals": fleet.arrivals,
                          "in_flight_per_ready": (sum(w.in_flight for w in ready) / len(ready)) if ready else None,
                          "desired": desired, "target": target})
        proc.stdin.close()
    if proc.returncode != 0 or result is None:
        raise SystemExit(f"mocker child failed (exit {proc.returncode}); its stderr is above")
    return {"side": "mocker", "rule": rule, "spec": spec, "router": a.router, "ticks": ticks,
            **mocker_outcome(result, a.slo_ttft_ms)}


def mocker_outcome(result: dict, slo_ttft_ms: float | None) -> dict:
    """The figures compared: goodput, worker-seconds, TTFT, reuse, the lifecycle events, per-instance service."""
    s = result["summary"]
    reqs = result["requests"]
    met = sum(1 for r in reqs if r[1] is not None and (slo_ttft_ms is None or r[1] <= slo_ttft_ms))
    events = []
    for op in result["lifecycle"]:
        for tr in op["transitions"]:
            events.append({"t_s": op["at_ms"] / 1000.0, "worker": tr["worker_id"], "transition": tr["transition"],
                           "cause": op["cause"], "reason": tr.get("reason")})
    per_worker: dict[int, list[int]] = {}
    for r in reqs:
        acc = per_worker.setdefault(r[3], [0, 0, 0, 0])
        acc[0] += 1
        acc[1] += r[4]
        acc[2] += r[5]
        acc[3] += (r[4] == 0)
    return {"wall_s": result["wall_s"], "requests": len(reqs), "completed": s["completed_requests"],
            "goodput_requests": met, "goodput_fraction": met / len(reqs) if reqs else math.nan,
            "mocker_goodput_requests": s.get("goodput_completed_requests"),
            "duration_s": s["duration_ms"] / 1000.0, "worker_seconds": s["decode_worker_seconds"],
            "gpu_hours": s["gpu_hours"], "reuse": s["prefix_cache_reused_ratio"],
            "ttft_p50_ms": s["median_ttft_ms"], "ttft_p90_ms": s["p90_ttft_ms"], "ttft_p99_ms": s["p99_ttft_ms"],
            "events": events,
            "per_worker": {str(w): {"requests": v[0], "reuse": v[1] / v[2] if v[2] else None, "misses": v[3]}
                           for w, v in sorted(per_worker.items())},
            "timeline": request_timeline(reqs, slo_ttft_ms)}


def request_timeline(reqs: list[list], slo_ttft_ms: float | None, bin_s: float = 60.0) -> list[dict]:
    """Per arrival-time bin: requests, reuse (cached / prompt tokens), TTFT p90, goodput fraction."""
    bins: dict[int, list[list]] = {}
    for r in reqs:
        bins.setdefault(int(r[0] / 1000.0 // bin_s), []).append(r)
    rows = []
    for b in sorted(bins):
        rs = bins[b]
        ttfts = sorted(r[1] for r in rs if r[1] is not None)
        p90 = ttfts[min(len(ttfts) - 1, math.ceil(0.9 * len(ttfts)) - 1)] if ttfts else None
        met = sum(1 for r in rs if r[1] is not None and (slo_ttft_ms is None or r[1] <= slo_ttft_ms))
        rows.append({"t_s": b * bin_s, "requests": len(rs), "reuse": sum(r[4] for r in rs) / sum(r[5] for r in rs),
                     "ttft_p90_ms": p90, "goodput_fraction": met / len(rs)})
    return rows


# ---------------------------------------------------------------------------------------------------- probes
def probe_main(argv: list[str]) -> int:
    """Runs inside .venv-dynamo: the small experiments behind ../../oracles/dynamo-mocker/scaling.md. Each prints
    what it shows. Tiny Mooncake traces in a temporary directory, vLLM engine with 64-token blocks."""
    import tempfile

    os.environ.setdefault("DYN_LOG", "error")
    import dynamo._core as core

    tmp = Path(tempfile.mkdtemp(prefix="mocker-scaling-probe-"))

    def trace(name: str, n: int, gap_ms: int, blocks: int, out: int) -> Path:
        path = tmp / name
        with path.open("w") as f:
            for i in range(n):   # block 1 is shared by every request, the others are the request's own
                ids = [1] + [1000 * (k + 1) + i for k in range(blocks - 1)]
                f.write(json.dumps({"timestamp": i * gap_ms, "input_length": blocks * 64, "output_length": out,
                                    "hash_ids": ids}) + "\n")
        return path

    class Plan:
        """Targets by tick time (ms); ticks every `step_ms` from `first_ms`; every snapshot kept."""

        def __init__(self, targets: dict, first_ms: float = 500.0, step_ms: float | None = 500.0):
            self.targets, self.first_ms, self.step_ms, self.seen = targets, first_ms, step_ms, []

        def initial_tick_ms(self) -> float:
            return self.first_ms

        def on_tick(self, snap: dict) -> dict:
            self.seen.append(snap)
            now = snap["now_ms"]
            return {"target_prefill": None, "target_decode": self.targets.get(now),
                    "next_tick_ms": None if self.step_ms is None else now + self.step_ms}

    def replay(path: Path, plan: Plan, *, workers: int = 1, router: str = "round_robin",
               startup_s: float | None = None):
        return core.run_mocker_trace_replay(
            [str(path)], extra_engine_args=mocker_engine_config(startup_s), num_workers=workers, router_mode=router,
            replay_mode="offline", trace_block_size=64, capture_per_request=True, scaling_policy=plan)

    def phases(plan: Plan, n: int = 8) -> list:
        return [(s["now_ms"], s["active_decode_ids"], s["starting_decode_ids"], s["draining_decode_ids"])
                for s in plan.seen[:n]]

    def ops(result) -> list:
        return [(o["at_ms"], o["cause"], [(t["worker_id"], t["transition"], t.get("reason")) for t in o["transitions"]])
                for o in result.lifecycle_operations]

    def first_request(result) -> dict:
        first: dict = {}
        for r in result.per_request:
            first.setdefault(r["decode_worker_idx"], (r["arrival_time_ms"], r["reused_input_tokens"]))
        return first

    t1 = trace("t1.jsonl", 40, 100, 2, 16)
    print("1. snapshot of the first tick (1 worker, 40 requests 100 ms apart, 2 blocks, 16 output tokens):")
    plan = Plan({})
    replay(t1, plan, router="kv_router")
    print("   keys:", sorted(plan.seen[0]))
    print("   decode_fpm_snapshots[0]:", plan.seen[0]["decode_fpm_snapshots"][0])
    print("   traffic:", plan.seen[0]["traffic"])

    t2 = trace("t2.jsonl", 60, 50, 4, 64)
    print("2. scale 1 -> 3 at 500 ms, startup_time unset / 0 / 1 s:")
    for startup_s in (None, 0.0, 1.0):
        plan = Plan({500.0: 3})
        r = replay(t2, plan, startup_s=startup_s)
        print(f"   startup_time={startup_s}: phases {phases(plan, 4)}")
        print(f"     lifecycle {ops(r)}")
        print(f"     first request per worker (arrival ms, reused tokens) {first_request(r)};"
              f" decode_worker_seconds {r.summary['decode_worker_seconds']:.3f}, duration {r.summary['duration_ms']:.1f} ms")

    print("3. scale 1 -> 3 at 500 ms with startup_time 1 s, then to 2 at 1000 ms (one still starting):")
    plan = Plan({500.0: 3, 1000.0: 2})
    r = replay(t2, plan, startup_s=1.0)
    print(f"   phases {phases(plan, 4)}\n   lifecycle {ops(r)}")

    print("4. scale 1 -> 3 at 500 ms, to 1 at 1000 ms, to 3 at 1500 ms (no startup time):")
    plan = Plan({500.0: 3, 1000.0: 1, 1500.0: 3})
    r = replay(t2, plan)
    print(f"   phases {phases(plan, 5)}\n   lifecycle {ops(r)}")
    last = {}
    for q in r.per_request:
        w = q["decode_worker_idx"]
        last[w] = max(last.get(w, 0.0), q["arrival_time_ms"] + q["e2e_latency_ms"])
    print("   last completion per worker (ms):", {w: round(t, 1) for w, t in sorted(last.items())})
    print("   (arrival ms, worker) of the requests arriving in [950, 1100] ms:",
          sorted((q["arrival_time_ms"], q["decode_worker_idx"]) for q in r.per_request
                 if 950.0 <= q["arrival_time_ms"] <= 1100.0))

    print("5. target 0:")
    try:
        replay(t2, Plan({500.0: 0}))
        print("   accepted")
    except Exception as e:   # noqa: BLE001 - the probe reports what the mocker raises
        print(f"   {type(e).__name__}: {e}")

    print("6. the traffic window (ticks every 250 ms, 1 worker; 64 output tokens):")
    plan = Plan({}, first_ms=250.0, step_ms=250.0)
    r = replay(t2, plan)
    for s in plan.seen[:9]:
        tr = s["traffic"]
        print(f"   {s['now_ms']:7.1f}: num_req {tr['num_req']}, ttft_count {tr['ttft_count']}, "
              f"avg_ttft_ms {tr['avg_ttft_ms']:.1f}, fpm {[fpm_in_flight(f) for f in s['decode_fpm_snapshots']]}")
    done = sorted(q["arrival_time_ms"] + q["e2e_latency_ms"] for q in r.per_request)
    print("   first completions (ms):", [round(x, 1) for x in done[:4]])

    print("7. when ticks stop: next_tick_ms None after the first tick; an infinite first tick:")
    plan = Plan({}, step_ms=None)
    replay(t2, plan)
    print(f"   next_tick_ms None -> {len(plan.seen)} tick(s)")
    plan = Plan({}, first_ms=math.inf)
    replay(t2, plan)
    print(f"   initial_tick_ms inf -> {len(plan.seen)} tick(s)")
    plan = Plan({}, first_ms=500.0, step_ms=1000.0)
    r = replay(t2, plan)
    print(f"   ticks every 1 s: last tick at {plan.seen[-1]['now_ms']} ms, replay ends at {r.summary['duration_ms']:.1f} ms")
    return 0


# ---------------------------------------------------------------------------------------------------- main
def portable(path: Path) -> str:
    """`path` relative to the repository when inside it, else its name (results never name machine paths)."""
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return path.name


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["_mocker"]:
        return mocker_child_main(argv[1:])
    if argv[:1] == ["_probe"]:
        return probe_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rules", default="hpa,schedule")
    p.add_argument("--sides", default="mocker,kvsim")
    p.add_argument("--router", default="round_robin", choices=["round_robin", "kv_router"])
    p.add_argument("--min-workers", type=int, default=2)
    p.add_argument("--max-workers", type=int, default=12)
    p.add_argument("--initial-workers", type=int, default=2)
    p.add_argument("--startup-s", type=float, default=60.0)
    p.add_argument("--slo-ttft-ms", type=float, default=500.0)
    p.add_argument("--trace", type=Path, default=HERE / "autoscaling_trace.jsonl")
    p.add_argument("--no-append", action="store_true")
    p.add_argument("--mocker-python", default=str(REPO / ".venv-dynamo" / "bin" / "python"))
    p.add_argument("--kvsim-root", type=Path, default=REPO)
    p.add_argument("--probe", action="store_true", help="only run the scaling-callback probes and print them")
    a = p.parse_args(argv)
    if a.probe:
        return subprocess.run([a.mocker_python, str(Path(__file__).resolve()), "_probe"], cwd=REPO).returncode
    sys.path.insert(0, str(a.kvsim_root.resolve()))
    n = write_trace(a.trace)
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    common = {"utc": stamp, "trace": portable(a.trace), "trace_requests": n, "min_workers": a.min_workers,
              "max_workers": a.max_workers, "initial_workers": a.initial_workers, "startup_s": a.startup_s,
              "slo_ttft_ms": a.slo_ttft_ms}
    rows = []
    for rule in a.rules.split(","):
        spec = rules(a.startup_s).get(rule, rule)
        for side in a.sides.split(","):
            if side == "mocker":
                row = run_mocker(a, rule, spec)
            else:
                raise SystemExit(f"side {side!r}: only 'mocker' is built so far")
            row = {**common, **row}
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items()
                              if k not in ("ticks", "events", "timeline", "per_worker")}), flush=True)
    if not a.no_append:
        with RESULTS.open("a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
