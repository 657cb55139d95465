#!/usr/bin/env python3
"""kvsim against Dynamo's mocker on sessions (issue 24, part 6b): the same multi-turn sessions replayed by both, at 4
and 8 workers, round robin and the KV router, reuse side by side.

Three workloads, each written as a file in a format the mocker reads (formats: ../../oracles/dynamo-mocker/
session-formats.md) and, from the same plan, built as kvsim session requests with `TokenSequence` and driven by
`sim.cluster.arrivals.sessions` (closed loop: each turn is sent its delay after the previous turn completed, as the
mocker's driver does):

  synthetic  the mocker's own `turns_per_session` semantics, as `mooncake` rows with `session_id`: every turn is an
             independent prompt of a group's system prompt and a fresh message; nothing of the history is resent;
             a constant delay before each later turn. Also run through `run_mocker_synthetic_trace_replay` with the
             same parameters (its own session starts and group draws: the same workload up to those draws).
  chat       `mooncake-delta`: a turn sends the history, the previous output and a new user message; the previous
             turn's output blocks are hit (vLLM's last-token rule), on both sides.
  agent      Agentic Mooncake v2 (`agentic_mooncake`): an agent loop, each call's prompt the previous prompt plus
             the call's output and a tool result, sent a tool latency after the previous call completed (a
             `completion` dependency). The mocker synthesises the appended output as trace content, not the tokens it
             generated, so a call hits its predecessor's prompt but never its output; kvsim is given the same
             content (the predecessor's output is forked off the sequence the next prompt continues).

Both simulators: vLLM workers, 64-token blocks, 146 GPU blocks per worker, kvsim with step times fitted to the
mocker's default timing at that capacity (builtin_shape.yaml; see builtin_shape.md). Reuse on both sides is prompt
tokens found cached at first admission / prompt tokens (the mocker's `prefix_cache_reused_ratio`).

Run from the repository root (the mocker runs in a subprocess with the side venv .venv-dynamo):

    .venv/bin/python benchmarks/studies/mocker-cross-check/sessions.py                       # the table
    .venv/bin/python benchmarks/studies/mocker-cross-check/sessions.py --workloads chat --workers 4 --repeats 1

Options: --workloads LIST (synthetic,chat,agent), --workers LIST (4,8), --repeats N (kv routers: mocker runs and
kvsim seeds, default 3), --sessions N (per workload, default 60), --rate-scale X (session rates x X, default 1),
--num-gpu-blocks N (per worker, both sides; default 146), --mocker-python PATH, --out DIR (trace files,
default sessions_traces/ beside this script, git-ignored), --jsonl PATH (also append every run as a JSON line).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from mooncake_delta import HashIds, Plan, PlannedSession, Turn, delta_requests, delta_rows, write_jsonl  # noqa: E402
TIME_MODEL = HERE / "builtin_shape.yaml"

BLOCK_SIZE, NUM_GPU_BLOCKS, TRACE_BLOCK = 64, 146, 64
SEED = 20261224
GROUPS, SYSTEM_TOKENS = 4, 1024        # system prompts (a chat's instructions, an agent's tool schema), whole blocks
FORMATS = {"synthetic": "mooncake", "chat": "mooncake-delta", "agent": "agentic_mooncake"}


# ---------------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True, slots=True)
class Shape:
    """A workload's distributions: sessions start Poisson at `rate_per_s`; turns, lengths and delays per kind."""

    kind: str
    rate_per_s: float
    turns: tuple[int, int]              # inclusive range
    new_tokens: tuple[int, int]
    output_tokens: tuple[int, int]
    delay_mean_s: float
    constant: bool = False              # synthetic: fixed lengths and delay, as the mocker's generator


SHAPES = {
    "synthetic": Shape("synthetic", 2.0, (4, 4), (320, 320), (64, 64), 1.0, constant=True),
    "chat": Shape("chat", 1.0, (3, 6), (64, 384), (32, 192), 3.0),
    # 0.3 agents/s keeps 4 workers of 146 blocks out of saturation (--rate-scale 2 saturates them: see the docs)
    "agent": Shape("agent", 0.3, (4, 8), (128, 512), (48, 160), 1.0),
}


def make_plans(shape: Shape, sessions: int, seed: int = SEED) -> list[Plan]:
    """Seeded session plans; the same list feeds the mocker's file and kvsim's requests."""
    rng = random.Random(f"{seed}:{shape.kind}")
    plans, t = [], 0.0
    for s in range(sessions):
        if s:
            t += rng.expovariate(shape.rate_per_s)
        n = rng.randint(*shape.turns)
        turns = []
        for k in range(n):
            if shape.constant:
                turns.append(Turn(shape.new_tokens[0], shape.output_tokens[0], shape.delay_mean_s if k else 0.0))
            else:
                delay = round(rng.expovariate(1 / shape.delay_mean_s), 3) if k else 0.0
                turns.append(Turn(rng.randint(*shape.new_tokens), rng.randint(*shape.output_tokens), delay))
        plans.append(Plan(s, round(t, 3), rng.randrange(GROUPS), tuple(turns)))
    return plans


# ---------------------------------------------------------------------------------------------------- the files
def blocks(tokens: int) -> int:
    return -(-tokens // TRACE_BLOCK)


def write_trace(kind: str, plans: list[Plan], path: Path) -> None:
    """The mocker's file for `plans` (timestamps and delays in ms); chat's rows are benchmarks/mooncake_delta.py's."""
    if kind == "chat":
        write_jsonl(delta_rows(plans, groups=GROUPS, system_tokens=SYSTEM_TOKENS, trace_block=TRACE_BLOCK), path)
        return
    ids = HashIds(groups=GROUPS, system_tokens=SYSTEM_TOKENS, trace_block=TRACE_BLOCK)
    rows: list[dict] = []
    if kind == "agent":
        rows.append({"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": TRACE_BLOCK,
                     "hash_id_scope": "local", "source": {"format": "kvsim-sessions", "digest": f"seed-{SEED}"}})
    for plan in plans:
        prompt_ids, length = ids.system(plan.group), SYSTEM_TOKENS
        for k, turn in enumerate(plan.turns):
            timing = {"timestamp": round(plan.start_s * 1000, 3)} if k == 0 else {"delay": round(turn.delay_s * 1000, 3)}
            if kind == "synthetic":
                rows.append({"session_id": f"s{plan.session}", **timing, "input_length": SYSTEM_TOKENS + turn.new_tokens,
                             "output_length": turn.output_tokens,
                             "hash_ids": ids.system(plan.group) + ids.fresh(blocks(turn.new_tokens))})
            else:   # agent: the full prompt, the last partial block's id continued (the mocker's own agentic rule)
                if k:
                    prev = plan.turns[k - 1]
                    length += prev.output_tokens + turn.new_tokens
                else:
                    length += turn.new_tokens
                prompt_ids += ids.fresh(blocks(length) - len(prompt_ids))
                row = {"request_id": f"s{plan.session:05d}-{k:03d}", "play_id": f"s{plan.session:05d}",
                       "session_id": f"s{plan.session}", "model": "m", "input_length": length,
                       "output_length": turn.output_tokens, "hash_ids": list(prompt_ids),
                       "not_before_ms": round(plan.start_s * 1000, 3) if k == 0 else 0.0}
                if k:
                    row["dependencies"] = [{"request_id": f"s{plan.session:05d}-{k - 1:03d}", "trigger": "completion",
                                            "delay_ms": round(turn.delay_s * 1000, 3), "relation": "sequence"}]
                rows.append(row)
    write_jsonl(rows, path)


# ---------------------------------------------------------------------------------------------------- kvsim's side
def session_requests(kind: str, plan: Plan):
    """The plan's requests as kvsim sees the same content: block hashes from `TokenSequence`."""
    from sim.workloads.sequence import TokenSequence
    if kind == "chat":                 # history, the previous output, a new message
        return list(delta_requests(plan, block_size=BLOCK_SIZE, system_tokens=SYSTEM_TOKENS))
    system = {"system_key": ("sys", plan.group), "system_tokens": SYSTEM_TOKENS}
    s, out = plan.session, []
    seq = TokenSequence(("session", s), block_size=BLOCK_SIZE, **system)
    for k, turn in enumerate(plan.turns):
        rid, common = s * 1000 + k, {"session_id": s, "turn": k, "prefix_id": plan.group}
        if kind == "synthetic":        # an independent prompt each turn: a new lineage
            one = TokenSequence(("turn", s, k), block_size=BLOCK_SIZE, **system)
            one.append(("msg", s, k), turn.new_tokens)
            out.append(one.request(rid, output_tokens=turn.output_tokens, output_key=("out", s, k), **common))
        else:                          # agent: the output goes to a fork; the next prompt continues with other content
            if k:
                seq.append(("shown-output", s, k - 1), plan.turns[k - 1].output_tokens)
            seq.append(("tool", s, k), turn.new_tokens)
            call = seq.fork(("call", s, k))
            out.append(call.request(rid, output_tokens=turn.output_tokens, output_key=("out", s, k), **common))
    return out


def kvsim_scenario(workers: int, router: str, seed: int):
    from sim.scenario import load_scenario
    base, _ = load_scenario(TIME_MODEL)
    engine = base.engine.model_copy(update={"block_size": BLOCK_SIZE})
    return base.with_overrides(**{"cluster.workers": workers, "engine.block_size": BLOCK_SIZE, "seed": seed,
                                  "router.name": router, "router.options": {},
                                  **engine.capacity_overrides(tokens=None, blocks=NUM_GPU_BLOCKS, kv_bytes=None)})


def run_kvsim(kind: str, plans: list[Plan], workers: int, router: str, seed: int) -> dict:
    import simpy
    from sim.cluster.arrivals import sessions
    from sim.cluster.cluster import Cluster
    from sim.runner import build_router
    scenario = kvsim_scenario(workers, router, seed)
    env = simpy.Environment()
    cluster = Cluster(env, scenario, build_router(scenario))
    records = []
    t0 = time.perf_counter()
    env.process(sessions(env, cluster, (PlannedSession(p, session_requests(kind, p)) for p in plans), records.append))
    env.run()
    wall = time.perf_counter() - t0
    prompt = sum(r.prompt_tokens for r in records)
    ttft = sorted((r.first_token_s - r.arrival_s) * 1000 for r in records)
    later = [r for r in records if r.turn > 0]
    return {"wall_s": wall, "requests": len(records), "reuse": sum(r.cached_tokens for r in records) / prompt,
            "reuse_later_turns": sum(r.cached_tokens for r in later) / max(1, sum(r.prompt_tokens for r in later)),
            "ttft_p50_ms": ttft[len(ttft) // 2], "prompt_tokens": prompt,
            "preempted": sum(r.num_preemptions > 0 for r in records), "duration_s": max(r.finished_s for r in records)}


# ---------------------------------------------------------------------------------------------------- the mocker
def engine_args() -> dict:
    return {"engine": {"backend": "vllm", "block_size": BLOCK_SIZE, "num_gpu_blocks": NUM_GPU_BLOCKS}}


def turn_of(row: dict) -> int:
    """A mocker record's turn: `turn_index` for sessions, the request id's suffix for agentic nodes (null there)."""
    if row.get("turn_index") is not None:
        return row["turn_index"]
    return int(str(row.get("request_id") or "0-0").rsplit("-", 1)[-1])


def mocker_summary(result, wall: float) -> dict:
    s = dict(result.summary)
    rows = result.per_request
    prompt = sum(r["input_length"] for r in rows)
    later = [r for r in rows if turn_of(r) > 0]
    return {"wall_s": wall, "requests": s["completed_requests"], "reuse": s["prefix_cache_reused_ratio"],
            "reuse_from_records": sum(r["reused_input_tokens"] for r in rows) / prompt,
            "reuse_later_turns": (sum(r["reused_input_tokens"] for r in later) / sum(r["input_length"] for r in later))
            if later else None,
            "ttft_p50_ms": s["median_ttft_ms"], "prompt_tokens": prompt,
            "preempted": sum((r.get("readmission_count") or 0) > 0 for r in rows), "duration_s": s["duration_ms"] / 1000}


def mocker_main(argv: list[str]) -> int:
    """Runs inside .venv-dynamo: one replay, one JSON line on stdout."""
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--format", required=True)
    p.add_argument("--workers", type=int, required=True)
    p.add_argument("--router", required=True)
    p.add_argument("--synthetic-json", default=None, help="run_mocker_synthetic_trace_replay's arguments instead")
    p.add_argument("--num-gpu-blocks", type=int, default=NUM_GPU_BLOCKS)
    a = p.parse_args(argv)
    set_capacity(a.num_gpu_blocks)
    os.environ.setdefault("DYN_LOG", "error")
    import dynamo._core as core
    common = {"extra_engine_args": engine_args(), "num_workers": a.workers, "router_mode": a.router,
              "replay_mode": "offline", "capture_per_request": True}
    t0 = time.perf_counter()
    if a.synthetic_json:
        result = core.run_mocker_synthetic_trace_replay(**json.loads(a.synthetic_json), **common)
    else:
        extra = {"execution_model": "m"} if a.format == "agentic_mooncake" else {}
        result = core.run_mocker_trace_replay([a.trace], trace_format=a.format, trace_block_size=TRACE_BLOCK,
                                              **common, **extra)
    sys.stdout.write(json.dumps(mocker_summary(result, time.perf_counter() - t0)) + "\n")
    return 0


def run_mocker(python: str, trace: Path, fmt: str, workers: int, router: str, synthetic: dict | None = None) -> dict:
    cmd = [python, str(Path(__file__).resolve()), "_mocker", str(trace), "--format", fmt, "--workers", str(workers),
           "--router", router, "--num-gpu-blocks", str(NUM_GPU_BLOCKS)]
    if synthetic:
        cmd += ["--synthetic-json", json.dumps(synthetic)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"mocker failed ({' '.join(cmd[2:])}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def synthetic_api_args(shape: Shape, sessions: int) -> dict:
    """run_mocker_synthetic_trace_replay's arguments for the synthetic shape: the same lengths, turns and delay; its
    group prefix is round(ceil(input / 64) x ratio) blocks, so the ratio that gives the system prompt's blocks."""
    input_tokens = SYSTEM_TOKENS + shape.new_tokens[0]
    return {"input_tokens": input_tokens, "output_tokens": shape.output_tokens[0], "request_count": sessions,
            "turns_per_session": shape.turns[0], "inter_turn_delay_ms": shape.delay_mean_s * 1000,
            "shared_prefix_ratio": (SYSTEM_TOKENS // BLOCK_SIZE) / blocks(input_tokens), "num_prefix_groups": GROUPS,
            "request_rate": shape.rate_per_s, "arrival_seed": SEED % 2**32}


# ---------------------------------------------------------------------------------------------------- driver
def set_capacity(num_gpu_blocks: int) -> None:
    """GPU blocks per worker on both sides (default 146, the capacity builtin_shape.yaml's step times were fitted at;
    a large value removes eviction, which checks the sessions' hit structure alone)."""
    global NUM_GPU_BLOCKS
    NUM_GPU_BLOCKS = num_gpu_blocks


def mean(values: list[float]) -> float:
    return statistics.fmean(values)


def band(values: list[float]) -> str:
    lo, hi = min(values), max(values)
    return f"{mean(values):.3f}" if lo == hi else f"{mean(values):.3f} ({lo:.3f}–{hi:.3f})"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_mocker":
        return mocker_main(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workloads", default="synthetic,chat,agent")
    p.add_argument("--workers", default="4,8")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sessions", type=int, default=60)
    p.add_argument("--mocker-python", default=str(REPO / ".venv-dynamo" / "bin" / "python"))
    p.add_argument("--out", type=Path, default=HERE / "sessions_traces")
    p.add_argument("--jsonl", type=Path, default=None)
    p.add_argument("--rate-scale", type=float, default=1.0, help="multiplies every workload's session rate")
    p.add_argument("--num-gpu-blocks", type=int, default=NUM_GPU_BLOCKS,
                   help="GPU blocks per worker, both sides (default 146: the fitted step times' capacity)")
    a = p.parse_args(argv)
    if a.num_gpu_blocks < 2:
        raise SystemExit(f"--num-gpu-blocks must be >= 2, got {a.num_gpu_blocks}")
    set_capacity(a.num_gpu_blocks)
    kinds = [k.strip() for k in a.workloads.split(",") if k.strip()]
    bad = [k for k in kinds if k not in SHAPES]
    if bad:
        raise SystemExit(f"--workloads: unknown {', '.join(bad)}; allowed: {', '.join(SHAPES)}")
    try:
        worker_counts = [int(w) for w in a.workers.split(",")]
    except ValueError:
        raise SystemExit(f"--workers: a comma-separated list of integers, got {a.workers!r}") from None
    if not a.rate_scale > 0:
        raise SystemExit(f"--rate-scale must be > 0, got {a.rate_scale}")
    if a.repeats < 1 or a.sessions < 1:
        raise SystemExit("--repeats and --sessions must be >= 1")
    if not Path(a.mocker_python).exists():
        raise SystemExit(f"--mocker-python: {a.mocker_python} does not exist (build .venv-dynamo: "
                         "benchmarks/oracles/dynamo-mocker/README.md)")
    sys.path.insert(0, str(REPO))

    lines = []

    def emit(row: dict) -> None:
        if a.jsonl:
            with a.jsonl.open("a") as f:
                f.write(json.dumps(row) + "\n")

    table = []
    for kind in kinds:
        shape = dataclasses.replace(SHAPES[kind], rate_per_s=SHAPES[kind].rate_per_s * a.rate_scale)
        plans = make_plans(shape, a.sessions)
        trace = a.out / f"{kind}.{FORMATS[kind]}.jsonl"
        write_trace(kind, plans, trace)
        n_requests = sum(len(p.turns) for p in plans)
        lines.append(f"{kind}: {len(plans)} sessions, {n_requests} requests, file {trace.relative_to(REPO) if trace.is_relative_to(REPO) else trace}")
        for W in worker_counts:
            for m_router, k_router, runs in (("round_robin", "round-robin", 1), ("kv_router", "kv-aware", a.repeats)):
                m = [run_mocker(a.mocker_python, trace, FORMATS[kind], W, m_router) for _ in range(runs)]
                k = [run_kvsim(kind, plans, W, k_router, seed) for seed in range(runs)]
                for i, r in enumerate(m):
                    emit({"sim": "mocker", "workload": kind, "workers": W, "router": m_router, "run": i, **r})
                for i, r in enumerate(k):
                    emit({"sim": "kvsim", "workload": kind, "workers": W, "router": k_router, "run": i, **r})
                row = {"workload": kind, "W": W, "router": f"{m_router} / {k_router}",
                       "mocker": [r["reuse"] for r in m], "kvsim": [r["reuse"] for r in k],
                       "mocker_later": [r["reuse_later_turns"] for r in m if r["reuse_later_turns"] is not None],
                       "kvsim_later": [r["reuse_later_turns"] for r in k],
                       "ttft": (mean([r["ttft_p50_ms"] for r in m]), mean([r["ttft_p50_ms"] for r in k])),
                       "requests": (m[0]["requests"], k[0]["requests"])}
                if kind == "synthetic":
                    api = [run_mocker(a.mocker_python, trace, "mooncake", W, m_router,
                                      synthetic_api_args(shape, a.sessions)) for _ in range(runs)]
                    for i, r in enumerate(api):
                        emit({"sim": "mocker-synthetic-api", "workload": kind, "workers": W, "router": m_router,
                              "run": i, **r})
                    row["api"] = [r["reuse"] for r in api]
                table.append(row)
                print(f"  done {kind} W={W} {m_router}", file=sys.stderr, flush=True)

    print("\n".join(lines))
    print()
    print("| workload | workers | router (mocker / kvsim) | mocker reuse | kvsim reuse | kvsim − mocker | later turns: mocker / kvsim | "
          "TTFT p50 ms mocker / kvsim | requests |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in table:
        diff = mean(r["kvsim"]) - mean(r["mocker"])
        later = (f"{mean(r['mocker_later']):.3f} / {mean(r['kvsim_later']):.3f}" if r["mocker_later"] else "– / "
                 f"{mean(r['kvsim_later']):.3f}")
        extra = f" (mocker's synthetic API: {band(r['api'])})" if "api" in r else ""
        print(f"| {r['workload']} | {r['W']} | {r['router']} | {band(r['mocker'])}{extra} | {band(r['kvsim'])} | "
              f"{diff:+.3f} | {later} | {r['ttft'][0]:.0f} / {r['ttft'][1]:.0f} | {r['requests'][0]} / {r['requests'][1]} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
