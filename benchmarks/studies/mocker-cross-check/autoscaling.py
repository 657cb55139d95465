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

    .venv/bin/python benchmarks/studies/mocker-cross-check/autoscaling.py --repeats 3 --figure autoscaling.png
    .venv/bin/python benchmarks/studies/mocker-cross-check/autoscaling.py --sides mocker --no-append
    .venv/bin/python benchmarks/studies/mocker-cross-check/autoscaling.py --probe   # the callback's semantics, probed

kvsim's step times are builtin_shape.yaml's fit (`--time-model fitted`, the default) or, to take timing out of the
comparison, the mocker's own polynomial (`--time-model scratch-polynomial`), which needs a scratch kvsim tree with
autoscaling_scratch_polynomial.patch applied, given as --kvsim-root (a git worktree, never the main checkout):

    git worktree add --detach ../kvsim-poly HEAD && git -C ../kvsim-poly apply \
        $PWD/benchmarks/studies/mocker-cross-check/autoscaling_scratch_polynomial.patch
    .venv/bin/python benchmarks/studies/mocker-cross-check/autoscaling.py --time-model scratch-polynomial \
        --kvsim-root ../kvsim-poly

Options: --rules LIST (hpa, schedule: `rules()` below; or full specs), --sides mocker,kvsim, --routers LIST
(round_robin,kv_router; kvsim runs round-robin and kv-aware), --repeats N (mocker runs per rule: its kv_router is not deterministic), --min-workers,
--max-workers, --initial-workers, --startup-s, --slo-ttft-ms, --mocker-in-flight gauge|counts (what the rule reads
as in-flight requests on the mocker side, see MockerSnapshotAdapter), --figure PATH, --trace PATH, --no-append,
--mocker-python PATH, --kvsim-root PATH (the kvsim tree that runs the kvsim side and whose `policies.autoscalers`
builds the rule; default: this repository). Results (one JSON line per side, rule and run) go to autoscaling.jsonl in
this folder; the comparison table is printed.
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
from dataclasses import replace
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
    from importlib.metadata import version
    out = {"wall_s": wall_s, "ai_dynamo_runtime": version("ai-dynamo-runtime"), "summary": summary, "lifecycle": result.lifecycle_operations, "requests": requests,
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

    `in_flight="counts"` replaces the per-worker gauges by the fleet's exact requests in flight (the arrivals minus
    the completions of every window so far) spread over the ready workers: what kvsim's fleet reads, for telling
    how much of a difference comes from the mocker's pass-time gauges.
    """

    def __init__(self, capacity_tokens: int, in_flight: str = "gauge") -> None:
        if in_flight not in ("gauge", "counts"):
            raise ValueError(f"in_flight: gauge or counts, got {in_flight!r}")
        self.capacity_tokens = capacity_tokens
        self.in_flight = in_flight
        self._seen: dict[int, tuple[str, float]] = {}
        self._arrived = self._completed = 0

    def fleet_snapshot(self, snap: dict):
        from sim.scaling import FleetSnapshot, WorkerSnapshot

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
        self._arrived += traffic["num_req"]
        self._completed += traffic["ttft_count"]
        if self.in_flight == "counts":
            workers = self._spread_in_flight(workers, self._arrived - self._completed)
        return FleetSnapshot(
            now_s=now_s, workers=tuple(workers), window_s=traffic["duration_s"], arrivals=traffic["num_req"],
            arrival_prompt_tokens=0, completed=traffic["ttft_count"],
            completed_output_tokens=round(traffic["avg_osl"] * traffic["shape_count"]), ttft_ms=(),
            cached_prompt_tokens=0, admitted_prompt_tokens=0)


    @staticmethod
    def _spread_in_flight(workers: list, total: int) -> list:
        """`counts`: the fleet's requests in flight (arrived - completed, exact at the tick) spread evenly over the
        ready workers, so that their mean is exact; it counts draining workers' requests too (the mocker does not
        say how many those have)."""
        ready = [w for w in workers if w.phase == "ready"]
        if not ready:
            return workers
        share, extra = divmod(total, len(ready))
        out, k = [], 0
        for w in workers:
            if w.phase == "ready":
                n = share + (k < extra)
                k += 1
                w = replace(w, in_flight=n, num_running=n, num_waiting=0)
            out.append(w)
        return out


# ---------------------------------------------------------------------------------------------------- the rule
def build_autoscaler(spec: str, min_workers: int, max_workers: int):
    """kvsim's autoscaler for `spec` (`name:key=value,...`), built as kvsim's composition root builds it."""
    from policies.autoscalers import build_autoscaler as build, split_autoscaler_spec

    name, options = split_autoscaler_spec(spec)
    return build(name, options, min_workers=min_workers, max_workers=max_workers)


def run_mocker(a: argparse.Namespace, router: str, rule: str, spec: str) -> dict:
    """The mocker side: the replay in the child, the autoscaler here; returns the row for autoscaling.jsonl."""
    autoscaler = build_autoscaler(spec, a.min_workers, a.max_workers)
    adapter = MockerSnapshotAdapter(NUM_GPU_BLOCKS * BLOCK_SIZE, in_flight=a.mocker_in_flight)
    cmd = [a.mocker_python, str(Path(__file__).resolve()), "_mocker", str(a.trace), "--workers", str(a.initial_workers),
           "--router", router, "--tick-s", str(autoscaler.interval_s), "--startup-s", str(a.startup_s)]
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
    return {"side": "mocker", "rule": rule, "spec": spec, "router": router, "mocker_in_flight": a.mocker_in_flight,
            "ticks": ticks,
            **mocker_outcome(result, a.slo_ttft_ms, a.initial_workers, autoscaler.interval_s)}


def mocker_outcome(result: dict, slo_ttft_ms: float | None, initial_workers: int, tick_s: float) -> dict:
    """The figures compared: goodput, worker-seconds, TTFT, reuse, and each worker's life and service."""
    s = result["summary"]
    reqs = result["requests"]
    met = sum(1 for r in reqs if r[1] is not None and (slo_ttft_ms is None or r[1] <= slo_ttft_ms))
    instances = mocker_instances(result["lifecycle"], reqs, initial_workers)
    return {"wall_s": result["wall_s"], "ai_dynamo_runtime": result["ai_dynamo_runtime"], "requests": len(reqs),
            "completed": s["completed_requests"],
            "goodput_requests": met, "goodput_fraction": met / len(reqs) if reqs else math.nan,
            "mocker_goodput_requests": s.get("goodput_completed_requests"),
            "duration_s": s["duration_ms"] / 1000.0, "worker_seconds": s["decode_worker_seconds"],
            "reuse": s["prefix_cache_reused_ratio"],
            "ttft_p50_ms": s["median_ttft_ms"], "ttft_p90_ms": s["p90_ttft_ms"], "ttft_p99_ms": s["p99_ttft_ms"],
            "instances": instances,
            "in_flight_per_ready": in_flight_per_ready(reqs, instances, tick_s, s["duration_ms"] / 1000.0),
            "timeline": request_timeline(reqs, slo_ttft_ms)}


def mocker_instances(lifecycle: list[dict], reqs: list[list], initial_workers: int) -> list[dict]:
    """Each mocker worker's life in kvsim's `instances.csv` terms (a worker id is its slot and its instance, ids
    are never reused): started_s (the tick that added it; 0 for the initial ones), ready_s, drained_s (the tick that
    marked it draining), stopped_s (removed: drain settled or start-up cancelled), and the requests it served."""
    inst = {w: {"instance": w, "started_s": 0.0, "ready_s": 0.0, "drained_s": None, "stopped_s": None}
            for w in range(initial_workers)}
    for op in lifecycle:
        t_s = op["at_ms"] / 1000.0
        for tr in op["transitions"]:
            w = inst.setdefault(tr["worker_id"], {"instance": tr["worker_id"], "started_s": t_s, "ready_s": None,
                                                  "drained_s": None, "stopped_s": None})
            kind = tr["transition"]
            if kind == "worker_ready":
                w["ready_s"] = t_s
            elif kind == "worker_draining":
                w["drained_s"] = t_s
            elif kind == "worker_removed":
                w["stopped_s"] = t_s
    for w in inst.values():
        w.update(requests=0, hit_requests=0, prompt_tokens=0, cached_tokens=0)
    for r in reqs:
        w = inst[r[3]]
        w["requests"] += 1
        w["hit_requests"] += r[4] > 0
        w["prompt_tokens"] += r[5]
        w["cached_tokens"] += r[4]
    return [inst[w] for w in sorted(inst)]


def phase_at(instance: dict, t_s: float) -> str:
    """`starting`, `ready`, `draining` or `stopped` at `t_s`, each phase from its start inclusive (as kvsim's
    `InstanceSpan.phase_at`)."""
    if t_s < instance["started_s"] or (instance["stopped_s"] is not None and t_s >= instance["stopped_s"]):
        return "stopped"
    if instance["drained_s"] is not None and t_s >= instance["drained_s"]:
        return "draining"
    return "ready" if instance["ready_s"] is not None and t_s >= instance["ready_s"] else "starting"


def ready_before_decision(instance: dict, t_s: float) -> bool:
    """Whether `instance` was ready at the tick at `t_s` before the tick's decision: ready at or before it (a
    worker whose start-up ends at the tick's instant is ready by then on both sides) and not drained before it."""
    return (instance["ready_s"] is not None and instance["ready_s"] <= t_s
            and (instance["drained_s"] is None or instance["drained_s"] >= t_s))


def in_flight_per_ready(reqs: list[list], instances: list[dict], step_s: float, end_s: float,
                        key: str = "instance") -> list[float | None]:
    """At each tick instant (every `step_s`), the requests in flight (sent, not finished) on the workers ready at it
    (before its decision), per such worker: what an HPA on `in_flight` averages, recomputed from the request records of either
    simulator. `key` names the request's worker field in `instances` (kvsim's requests name the slot)."""
    ticks = [k * step_s for k in range(1, int(end_s // step_s) + 1)]
    out = []
    for t in ticks:
        ready = {inst[key] for inst in instances if ready_before_decision(inst, t)}
        busy = sum(1 for r in reqs if r[3] in ready and r[0] / 1000.0 <= t < (r[0] + r[2]) / 1000.0)
        out.append(busy / len(ready) if ready else None)
    return out


def fleet_at(instances: list[dict], t_s: float) -> dict[str, int]:
    """Workers by phase at `t_s`."""
    counts = {"ready": 0, "starting": 0, "draining": 0}
    for inst in instances:
        phase = phase_at(inst, t_s)
        if phase != "stopped":
            counts[phase] += 1
    return counts


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


# ---------------------------------------------------------------------------------------------------- kvsim
KVSIM_ROUTER = {"round_robin": "round-robin", "kv_router": "kv-aware"}
"""The mocker's router -> kvsim's model of it."""


def kvsim_scenario_yaml(a: argparse.Namespace, spec: str, path: Path) -> None:
    """builtin_shape.yaml (kvsim's step times fitted to the mocker's default timing at 146 blocks of 64 tokens) with
    an elastic fleet: `cluster.autoscaling` with the rule, the bounds and a fixed provisioning delay = the mocker's
    `startup_time`; `cluster.workers` = max_workers (an autoscaled cluster's slots)."""
    import yaml
    from policies.autoscalers import split_autoscaler_spec

    name, options = split_autoscaler_spec(spec)
    scenario = yaml.safe_load((HERE / "builtin_shape.yaml").read_text())
    scenario["name"] = "autoscaling-mocker-cross-check"
    scenario["cluster"]["workers"] = a.max_workers
    scenario["cluster"]["autoscaling"] = {
        "autoscaler": {"name": name, "options": options}, "min_workers": a.min_workers,
        "max_workers": a.max_workers, "initial_workers": a.initial_workers,
        "provisioning": {"delay_s": a.startup_s}}
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))


def run_kvsim(a: argparse.Namespace, router: str, rule: str, spec: str) -> dict:
    """The kvsim side: `kvsim replay TRACE --autoscaler SPEC ...` on the scenario above, in a subprocess with the
    kvsim tree of --kvsim-root first on the path; reads summary.csv, instances.csv, requests.csv and timeline.csv."""
    import csv
    import tempfile

    with tempfile.TemporaryDirectory(prefix="kvsim-autoscaling-") as tmp:
        out = Path(tmp) / "out"
        scenario = Path(tmp) / "scenario.yaml"
        kvsim_scenario_yaml(a, spec, scenario)
        cmd = [sys.executable, "-m", "sim.cli", "replay", str(a.trace.resolve()), "--scenario", str(scenario),
               "--kv-blocks", str(NUM_GPU_BLOCKS), "--trace-block-size", str(TRACE_BLOCK),
               "--router", KVSIM_ROUTER[router], "--autoscaler", spec, "--min-workers", str(a.min_workers),
               "--max-workers", str(a.max_workers), "--workers", str(a.initial_workers),
               "--out", str(out), "--requests"]
        if a.slo_ttft_ms is not None:
            cmd += ["--slo", f"ttft_ms={a.slo_ttft_ms:g}"]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(a.kvsim_root.resolve()),
                                                            os.environ.get("PYTHONPATH", "")])}
        env.pop("KVSIM_DYNAMO_POLY_CAPACITY", None)
        if a.time_model == "scratch-polynomial":
            import sim.timing.linear as linear
            if not hasattr(linear, "DynamoPolynomialTimeModel"):
                raise SystemExit("--time-model scratch-polynomial needs --kvsim-root at a scratch tree with the "
                                 "mocker's polynomial (see builtin_shape_scratch_polynomial.patch)")
            env["KVSIM_DYNAMO_POLY_CAPACITY"] = str(NUM_GPU_BLOCKS * BLOCK_SIZE)
        t0 = time.perf_counter()
        # NOTE: `python -m` puts the working directory first on the path, so it must be the kvsim tree too.
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=a.kvsim_root.resolve(), env=env)
        wall_s = time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"kvsim replay failed:\n{done.stderr[-3000:]}")

        def table(name: str) -> list[dict]:
            with (out / name).open() as f:
                return list(csv.DictReader(f))

        summary = table("summary.csv")[0]
        number = lambda v: None if v in ("", "nan") else float(v)  # noqa: E731
        instances = [{"instance": int(r["instance"]), "slot": int(r["slot"]), "started_s": float(r["started_s"]),
                      "ready_s": number(r["ready_s"]), "drained_s": number(r["drained_s"]),
                      "stopped_s": number(r["stopped_s"]), "requests": int(r["requests"])}
                     for r in table("instances.csv")]
        reqs = [[float(r["sent_s"]) * 1000.0, float(r["ttft_ms"]), float(r["e2e_ms"]), int(r["worker"]),
                 int(r["cached_tokens"]), int(r["prompt_tokens"]), int(r["output_tokens"])]
                for r in table("requests.csv")]
        desired = {float(r["end_s"]): int(r["desired_workers"]) for r in table("timeline.csv") if r["desired_workers"]}
    met = sum(1 for r in reqs if a.slo_ttft_ms is None or r[1] <= a.slo_ttft_ms)
    return {"side": "kvsim", "rule": rule, "spec": spec, "router": router, "kvsim_router": KVSIM_ROUTER[router],
            "time_model": a.time_model,
            "wall_s": wall_s, "requests": len(reqs), "completed": int(summary["requests"]),
            "goodput_requests": met, "goodput_fraction": met / len(reqs) if reqs else math.nan,
            "kvsim_goodput_requests": int(summary["slo_met_requests"]),
            "duration_s": float(summary["simulated_s"]), "worker_seconds": float(summary["fleet_device_s"]),
            "reuse": float(summary["prefix_reuse"]), "ttft_p50_ms": float(summary["ttft_p50_ms"]),
            "ttft_p90_ms": float(summary["ttft_p90_ms"]), "ttft_p99_ms": float(summary["ttft_p99_ms"]),
            "ticks": [{"t_s": t, "desired": d} for t, d in sorted(desired.items())],
            "instances": instances,
            "in_flight_per_ready": in_flight_per_ready(reqs, instances, build_autoscaler(spec, a.min_workers,
                                                                                       a.max_workers).interval_s,
                                                       float(summary["simulated_s"]), key="slot"),
            "timeline": request_timeline(reqs, a.slo_ttft_ms)}


# ---------------------------------------------------------------------------------------------------- comparison
def fleet_series(row: dict, step_s: float = 15.0) -> list[tuple[float, dict[str, int]]]:
    """Workers by phase just after each tick instant (every `step_s` to the end of the run)."""
    end_s = row["duration_s"]
    return [(k * step_s, fleet_at(row["instances"], k * step_s)) for k in range(int(end_s // step_s) + 1)]


def compare(mocker: dict, kvsim: dict) -> dict:
    """One comparison row: the summary figures side by side, and how the replica timelines agree."""
    m_series, k_series = fleet_series(mocker), fleet_series(kvsim)
    n = min(len(m_series), len(k_series))
    ready_diff = [k_series[i][1]["ready"] - m_series[i][1]["ready"] for i in range(n)]
    kept_diff = [(k_series[i][1]["ready"] + k_series[i][1]["starting"])
                 - (m_series[i][1]["ready"] + m_series[i][1]["starting"]) for i in range(n)]
    launches = lambda row: sorted(i["started_s"] for i in row["instances"] if i["started_s"] > 0)  # noqa: E731
    drains = lambda row: sorted(i["drained_s"] for i in row["instances"] if i["drained_s"] is not None)  # noqa: E731
    m_load, k_load = mocker["in_flight_per_ready"], kvsim["in_flight_per_ready"]
    pairs = [(m, k) for m, k in zip(m_load, k_load) if m is not None and k is not None]
    seen = [t["in_flight_per_ready"] for t in mocker["ticks"]]
    stale = [(x, m) for x, m in zip(seen, m_load) if x is not None and m is not None]
    return {
        "rule": mocker["rule"], "router": mocker["router"],
        "in_flight_mean": (sum(m for m, _ in pairs) / len(pairs), sum(k for _, k in pairs) / len(pairs)),
        "in_flight_mean_abs_diff": sum(abs(m - k) for m, k in pairs) / len(pairs),
        "mocker_seen_vs_records_mean_abs_diff": sum(abs(x - m) for x, m in stale) / len(stale),
        "ticks_compared": n, "ticks_same_ready": sum(d == 0 for d in ready_diff),
        "ready_mean_abs_diff": sum(abs(d) for d in ready_diff) / n, "ready_max_abs_diff": max(map(abs, ready_diff)),
        "kept_mean_abs_diff": sum(abs(d) for d in kept_diff) / n,
        "first_divergence_s": next((m_series[i][0] for i in range(n) if kept_diff[i] != 0), None),
        "launches": (len(launches(mocker)), len(launches(kvsim))),
        "drains": (len(drains(mocker)), len(drains(kvsim))),
        **{key: (mocker[key], kvsim[key]) for key in
           ("goodput_fraction", "worker_seconds", "reuse", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "wall_s")},
    }


def print_comparison(rows: list[dict]) -> list[dict]:
    """Pair the first mocker row with the kvsim row of the same rule and router; print a markdown table, and the
    mocker's min-max over its runs when it ran more than once."""
    pairs: dict = {}
    for row in rows:
        pairs.setdefault((row["rule"], row["router"]), {}).setdefault(row["side"], []).append(row)
    out = [compare(p["mocker"][0], p["kvsim"][0]) for p in pairs.values() if {"mocker", "kvsim"} <= p.keys()]
    for (rule, router), p in pairs.items():
        runs = p.get("mocker", [])
        if len(runs) > 1:
            band = lambda key, scale=1.0: f"{min(r[key] for r in runs) / scale:.3f}-{max(r[key] for r in runs) / scale:.3f}"  # noqa: E731
            launched = sorted(sum(1 for i in r["instances"] if i["started_s"] > 0) for r in runs)
            print(f"mocker {rule} {router}, {len(runs)} runs: GPU-h {band('worker_seconds', 3600)}, goodput fraction "
                  f"{band('goodput_fraction')}, reuse {band('reuse')}, launches {launched[0]}-{launched[-1]}")
    if not out:
        return out
    print("\n| rule | router | goodput fraction mocker / kvsim | GPU-h mocker / kvsim | reuse mocker / kvsim "
          "| TTFT p50 / p90 / p99 ms mocker; kvsim | launches | drains | ticks with equal ready workers "
          "| mean abs diff ready (ready+starting) | first difference at | in flight per ready worker at ticks, "
          "mean mocker / kvsim (mean abs diff) | the mocker's pass-time gauge vs its records |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in out:
        m, k = zip(c["ttft_p50_ms"], c["ttft_p90_ms"], c["ttft_p99_ms"])
        print(f"| {c['rule']} | {c['router']} | {c['goodput_fraction'][0]:.3f} / {c['goodput_fraction'][1]:.3f} "
              f"| {c['worker_seconds'][0] / 3600:.2f} / {c['worker_seconds'][1] / 3600:.2f} "
              f"| {c['reuse'][0]:.3f} / {c['reuse'][1]:.3f} "
              f"| {' / '.join(f'{x:.0f}' for x in m)}; {' / '.join(f'{x:.0f}' for x in k)} "
              f"| {c['launches'][0]} / {c['launches'][1]} | {c['drains'][0]} / {c['drains'][1]} "
              f"| {c['ticks_same_ready']} of {c['ticks_compared']} "
              f"| {c['ready_mean_abs_diff']:.2f} ({c['kept_mean_abs_diff']:.2f}) | {c['first_divergence_s']} s "
              f"| {c['in_flight_mean'][0]:.2f} / {c['in_flight_mean'][1]:.2f} ({c['in_flight_mean_abs_diff']:.2f}) "
              f"| {c['mocker_seen_vs_records_mean_abs_diff']:.2f} |")
    return out


def plot(rows: list[dict], path: Path) -> None:
    """Small multiples, a row per (rule, router): workers kept (ready + starting) and ready over time, reuse per
    minute, TTFT p90 per minute; mocker and kvsim in each panel, the load ramp in the first column's twin."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs: dict = {}
    for row in rows:
        pairs.setdefault((row["rule"], row["router"]), {}).setdefault(row["side"], row)
    keys = [k for k, p in pairs.items() if {"mocker", "kvsim"} <= p.keys()]
    if not keys:
        return
    fig, axes = plt.subplots(len(keys), 3, figsize=(15, 3.2 * len(keys) + 0.45), squeeze=False, sharex=True)
    colors = {"mocker": "tab:orange", "kvsim": "tab:blue"}
    for i, key in enumerate(keys):
        ax_w, ax_r, ax_t = axes[i]
        for side in ("mocker", "kvsim"):
            row = pairs[key][side]
            series = fleet_series(row)
            t = [x for x, _ in series]
            ax_w.step(t, [f["ready"] for _, f in series], where="post", color=colors[side], label=f"{side} ready")
            ax_w.step(t, [f["ready"] + f["starting"] for _, f in series], where="post", color=colors[side],
                      linestyle=":", label=f"{side} ready + starting")
            tl = row["timeline"]
            ax_r.plot([b["t_s"] + 30 for b in tl], [b["reuse"] for b in tl], color=colors[side], label=side)
            ax_t.plot([b["t_s"] + 30 for b in tl], [b["ttft_p90_ms"] for b in tl], color=colors[side], label=side)
        ramp = ax_w.twinx()
        ramp.plot([p[0] for p in RAMP], [p[1] for p in RAMP], color="grey", alpha=0.4)
        ramp.set_ylabel("load (req/s)", color="grey")
        ax_w.set_ylabel("workers")
        ax_w.set_title(f"{key[0]}, {key[1]}: workers", fontsize=10)
        ax_r.set_ylabel("prefix reuse")
        ax_r.set_title("reuse per minute (by arrival)", fontsize=10)
        ax_t.set_yscale("log")
        ax_t.set_ylabel("TTFT p90 (ms)")
        ax_t.set_title("TTFT p90 per minute (by arrival)", fontsize=10)
    for ax in axes[-1]:
        ax.set_xlabel("simulated time (s)")
    handles, labels = axes[0][0].get_legend_handles_labels()
    height_in = 3.2 * len(keys) + 0.45
    fig.legend(handles, labels, loc="upper center", ncol=4, bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.45 / height_in))   # 0.45 in above the panels for the legend
    fig.savefig(path, dpi=90)
    plt.close(fig)


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
DETAIL_KEYS = ("ticks", "instances", "timeline", "in_flight_per_ready")
"""A row's per-tick, per-instance and per-minute series: kept for the first run of a point, dropped for repeats."""


def stored(row: dict) -> dict:
    """The row as autoscaling.jsonl keeps it: the series of the first run only (repeats keep their summary), each
    series as a header and rows of values."""
    if row.get("run", 0) > 0:
        return {k: v for k, v in row.items() if k not in DETAIL_KEYS}
    out = dict(row)
    for key in ("ticks", "instances", "timeline"):
        if out.get(key):
            fields = list(out[key][0])
            out[key] = {"fields": fields, "rows": [[item.get(f) for f in fields] for item in out[key]]}
    return out


def rounded(value: Any, digits: int = 4) -> Any:
    """`value` with every float rounded to `digits` decimals (the results file keeps what the comparison reads)."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v, digits) for v in value]
    return value


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
    p.add_argument("--routers", default="round_robin,kv_router",
                   help="the mocker's routers (kvsim runs its model of each: round-robin, kv-aware)")
    p.add_argument("--min-workers", type=int, default=2)
    p.add_argument("--max-workers", type=int, default=12)
    p.add_argument("--initial-workers", type=int, default=2)
    p.add_argument("--startup-s", type=float, default=60.0)
    p.add_argument("--slo-ttft-ms", type=float, default=500.0)
    p.add_argument("--trace", type=Path, default=HERE / "autoscaling_trace.jsonl")
    p.add_argument("--no-append", action="store_true")
    p.add_argument("--mocker-python", default=str(REPO / ".venv-dynamo" / "bin" / "python"))
    p.add_argument("--kvsim-root", type=Path, default=REPO)
    p.add_argument("--repeats", type=int, default=1,
                   help="mocker runs per rule (its kv_router breaks ties at random; round_robin is deterministic)")
    p.add_argument("--time-model", choices=["fitted", "scratch-polynomial"], default="fitted",
                   help="kvsim's step times: fitted (builtin_shape.yaml) or scratch-polynomial (the mocker's own "
                        "polynomial, in a scratch kvsim tree given by --kvsim-root)")
    p.add_argument("--mocker-in-flight", choices=["gauge", "counts"], default="gauge",
                   help="what the rule reads as in-flight requests on the mocker side: gauge (each ready worker's "
                        "last forward pass, what the mocker's snapshot gives) or counts (arrived - completed)")
    p.add_argument("--figure", type=Path, default=None, help="write the small-multiples figure here (PNG)")
    p.add_argument("--probe", action="store_true", help="only run the scaling-callback probes and print them")
    a = p.parse_args(argv)
    if a.probe:
        return subprocess.run([a.mocker_python, str(Path(__file__).resolve()), "_probe"], cwd=REPO).returncode
    sys.path.insert(0, str(a.kvsim_root.resolve()))
    n = write_trace(a.trace)
    stamp = datetime.now(timezone.utc).isoformat(timespec="seconds")
    git = lambda *args: subprocess.run(["git", "-C", str(a.kvsim_root), *args], capture_output=True,  # noqa: E731
                                       text=True).stdout.strip()
    common = {"utc": stamp, "trace": portable(a.trace), "trace_requests": n, "min_workers": a.min_workers,
              "max_workers": a.max_workers, "initial_workers": a.initial_workers, "startup_s": a.startup_s,
              "slo_ttft_ms": a.slo_ttft_ms, "kvsim_root": portable(a.kvsim_root), "kvsim_commit": git("rev-parse", "HEAD"),
              "kvsim_uncommitted": sorted(line[3:] for line in git("status", "--porcelain", "--", "sim",
                                                                   "policies").splitlines())}
    rows = []
    for router in a.routers.split(","):
        if router not in KVSIM_ROUTER:
            raise SystemExit(f"--routers: {router!r} is not one of {', '.join(KVSIM_ROUTER)}")
        for rule in a.rules.split(","):
            spec = rules(a.startup_s).get(rule, rule)
            for side in a.sides.split(","):
                runs = a.repeats if side == "mocker" else 1
                for run in range(runs):
                    row = run_mocker(a, router, rule, spec) if side == "mocker" else run_kvsim(a, router, rule, spec)
                    row = {**common, "run": run, **row}
                    rows.append(row)
                    print(json.dumps({k: v for k, v in row.items() if k not in DETAIL_KEYS}), flush=True)
    print_comparison(rows)
    if a.figure is not None:
        plot(rows, a.figure)
    if not a.no_append:
        with RESULTS.open("a") as f:
            for row in rows:
                f.write(json.dumps(rounded(stored(row))) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
