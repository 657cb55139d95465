"""Session replay speed: a long-context coding-agent trace, kvsim against Dynamo's mocker on the same file.

    python benchmarks/speed/session_speed.py [--sessions 2000] [--routers round-robin,kv-aware] [--engines vllm,sglang]
        [--mocker-python .venv-dynamo/bin/python] [--out DIR] [--profile] [--no-reuse-breakdown]

The trace (issue 24, part 7): `--sessions` agent sessions (default 2,000) of 30 turns each, seeded. A session draws a
group's system prompt (8 groups of 8,192 tokens: tool schemas and instructions, shared by every session of the
group), a task message (lognormal, median 400 tokens), then per turn an output of 100-300 tokens and, before the next
call, a tool result of lognormal size (median 700 tokens, sigma 1.2: most results are short, file reads and test logs
are long) after a tool latency (lognormal, median 1.5 s). The context grows to at most 64k tokens (65,536): a tool
result is cut to what is left once the remaining turns' outputs are reserved (a cap, not a truncation:
`mooncake-delta` cannot say that a client dropped old turns, since the mocker's driver always resends the whole
history). Sessions start Poisson at `--rate` sessions/s (default 0.25: at 0.5 the cluster saturates).

It is written as Dynamo's `mooncake-delta` JSONL (benchmarks/mooncake_delta.py; the format:
benchmarks/oracles/dynamo-mocker/session-formats.md) with 16-token hash ids, into --out (default session_traces/
beside this script, git-ignored). Then, in one run, every measurement in a fresh subprocess printing its wall time
and peak RSS:

* the mocker (`ai-dynamo-runtime` 1.6.1 in its side venv) replays the file: `run_mocker_trace_replay(trace_format=
  "mooncake-delta", trace_block_size=16)`, 8 workers of 25,000 blocks of 16 tokens (400,000 tokens), round robin and
  its KV router; wall time is the call, which reads the file;
* kvsim replays the same file as a user would, the whole command timed (start-up and reading included):
  `kvsim replay FILE --trace-format mooncake-delta --trace-block-size 16 --block-size 16 --scenario
  benchmarks/speed/agent_trace.yaml --workers 8 --router R --engine E --jobs 1 --format json` (the same workers and
  blocks, step times taken from the mocker's timing; closed loop, one process). `--kvsim-side driver` instead
  draws the plans again from the seed and builds each turn with `TokenSequence` as it falls due, driven by
  `sim.cluster.arrivals.sessions` (the same hits per request as the reader, checked on 5 sessions; no file read, no
  summary).

Printed per run: requests/s, prompt blocks/s (blocks of 16 prompt tokens sent), peak RSS, reuse (prompt tokens found
cached at admission / prompt tokens), CPU seconds, and the ratios kvsim / mocker for the mocker's matching router
(req/s over wall time, and over CPU time: the CPU ratio is steadier when other work shares the cores). --profile also
runs each kvsim case under cProfile and prints the top costs in microseconds per request. These machines are shared
and noisy: compare the ratios measured in one run, not absolute seconds. `replay_speed.py --sessions N` runs this
table after its own (with `kvsim replay`).
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
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))
from mooncake_delta import PlannedSession, Plan, Turn, delta_requests, delta_rows, write_jsonl  # noqa: E402

SCENARIO = HERE / "agent_trace.yaml"
SEED = 20261227
BLOCK_SIZE = TRACE_BLOCK = 16
NUM_GPU_BLOCKS, WORKERS = 25_000, 8
GROUPS, SYSTEM_TOKENS = 8, 8192
TURNS, MAX_CONTEXT = 30, 65_536
OUTPUT_TOKENS = (100, 300)
TASK_MEDIAN, TASK_SIGMA = 400, 0.8
TOOL_MEDIAN, TOOL_SIGMA, TOOL_MIN = 700, 1.2, 16
LATENCY_MEDIAN_S, LATENCY_SIGMA = 1.5, 1.0
RATE_PER_S = 0.25
ROUTERS = {"round-robin": "round_robin", "kv-aware": "kv_router"}     # kvsim name -> the mocker's


def mocker_router(router: str) -> str:
    """The mocker's router a kvsim router (NAME or NAME:key=value,...) is compared with: its counterpart, else the
    mocker's KV router (the mocker has no other router; its KV router is the speed bar)."""
    return ROUTERS.get(router, "kv_router")
ENGINES = ("vllm", "sglang")


# ---------------------------------------------------------------------------------------------------- the trace
def agent_plans(sessions: int, *, rate_per_s: float = RATE_PER_S, turns: int = TURNS, seed: int = SEED) -> list[Plan]:
    """Seeded agent sessions; the first N of a longer list are the same N sessions (one stream, drawn in order)."""
    rng = random.Random(f"{seed}:agent-trace")
    plans, t = [], 0.0
    for s in range(sessions):
        if s:
            t += rng.expovariate(rate_per_s)
        group = rng.randrange(GROUPS)
        context = SYSTEM_TOKENS
        out = []
        for k in range(turns):
            output = rng.randint(*OUTPUT_TOKENS)
            if k == 0:
                new = max(1, min(4000, round(rng.lognormvariate(math.log(TASK_MEDIAN), TASK_SIGMA))))
                delay = 0.0
            else:
                # NOTE: the cap: room for this turn's and every later turn's largest output and a minimal tool result
                reserve = (turns - k) * OUTPUT_TOKENS[1] + (turns - k - 1) * TOOL_MIN
                drawn = max(TOOL_MIN, round(rng.lognormvariate(math.log(TOOL_MEDIAN), TOOL_SIGMA)))
                new = max(1, min(drawn, MAX_CONTEXT - context - reserve))
                delay = round(rng.lognormvariate(math.log(LATENCY_MEDIAN_S), LATENCY_SIGMA), 3)
            out.append(Turn(new, output, delay))
            context += new + output
        plans.append(Plan(s, round(t, 3), group, tuple(out)))
    return plans


def trace_figures(plans: list[Plan]) -> dict:
    """Requests, prompt tokens and blocks, and the largest context of the plans (prompt_k = prompt_{k-1} + output_{k-1}
    + delta_k, the system prompt in the first)."""
    requests = prompt_tokens = prompt_blocks = largest = 0
    for plan in plans:
        prompt, previous_output = SYSTEM_TOKENS, 0
        for turn in plan.turns:
            prompt += previous_output + turn.new_tokens
            previous_output = turn.output_tokens
            requests += 1
            prompt_tokens += prompt
            prompt_blocks += prompt // BLOCK_SIZE
            largest = max(largest, prompt + turn.output_tokens)
    return {"requests": requests, "prompt_tokens": prompt_tokens, "prompt_blocks": prompt_blocks,
            "largest_context_tokens": largest}


def write_trace(plans: list[Plan], path: Path) -> int:
    return write_jsonl(delta_rows(plans, groups=GROUPS, system_tokens=SYSTEM_TOKENS, trace_block=TRACE_BLOCK), path)


# ---------------------------------------------------------------------------------------------------- children
def peak_rss_mb() -> float:
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def kvsim_child(argv: list[str]) -> int:
    """Runs in kvsim's venv: the sessions through arrivals.sessions in one process; one JSON line on stdout."""
    p = argparse.ArgumentParser()
    p.add_argument("--sessions", type=int, required=True)
    p.add_argument("--rate", type=float, required=True)
    p.add_argument("--router", required=True)
    p.add_argument("--engine", required=True)
    p.add_argument("--reuse-breakdown", type=int, default=1)
    p.add_argument("--profile", default=None)
    a = p.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import simpy
    from sim.cluster.arrivals import sessions
    from sim.cluster.cluster import Cluster
    from sim.runner import build_router
    from sim.scenario import load_scenario
    scenario, _ = load_scenario(SCENARIO)
    scenario = scenario.with_engine(a.engine).with_overrides(**{
        "router.name": a.router, "cluster.reuse_breakdown": bool(a.reuse_breakdown)})
    totals = {"requests": 0, "prompt_tokens": 0, "cached_tokens": 0, "preempted": 0, "finished_s": 0.0}

    def on_record(r) -> None:
        totals["requests"] += 1
        totals["prompt_tokens"] += r.prompt_tokens
        totals["cached_tokens"] += r.cached_tokens
        totals["preempted"] += r.num_preemptions > 0
        totals["finished_s"] = max(totals["finished_s"], r.finished_s)

    profiler = None
    if a.profile:
        import cProfile
        profiler = cProfile.Profile()
        profiler.enable()
    t0, c0 = time.perf_counter(), time.process_time()
    plans = agent_plans(a.sessions, rate_per_s=a.rate)
    env = simpy.Environment()
    cluster = Cluster(env, scenario, build_router(scenario))
    source = (PlannedSession(p, delta_requests(p, block_size=BLOCK_SIZE, system_tokens=SYSTEM_TOKENS)) for p in plans)
    env.process(sessions(env, cluster, source, on_record))
    env.run()
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    if profiler is not None:
        profiler.disable()
        profiler.dump_stats(a.profile)
    sys.stdout.write(json.dumps({
        "wall_s": wall, "cpu_s": cpu, "requests": totals["requests"], "prompt_tokens": totals["prompt_tokens"],
        "reuse": totals["cached_tokens"] / totals["prompt_tokens"], "preempted": totals["preempted"],
        "simulated_s": totals["finished_s"], "peak_rss_mb": peak_rss_mb()}) + "\n")
    return 0


def replay_command(trace: Path, engine: str, router: str, reuse_breakdown: bool) -> list[str]:
    """`kvsim replay` of the trace as a user runs it, one JSON row on stdout."""
    return ["replay", str(trace), "--trace-format", "mooncake-delta", "--trace-block-size", str(TRACE_BLOCK),
            "--block-size", str(BLOCK_SIZE), "--scenario", str(SCENARIO), "--workers", str(WORKERS), "--router", router,
            "--engine", engine, "--jobs", "1", "--format", "json",
            "--reuse-breakdown" if reuse_breakdown else "--no-reuse-breakdown"]


def replay_child(argv: list[str]) -> int:
    """Runs `kvsim replay ARGS` (the console script beside this python) as a subprocess and reports its wall time,
    CPU time and peak RSS (this process's children: the replay alone) with its summary row; with `--profile PATH`
    first, runs the command in this process under cProfile instead."""
    import resource
    profile = None
    if argv[:1] == ["--profile"]:
        profile, argv = argv[1], argv[2:]
    if profile:
        import contextlib
        import cProfile
        import io
        sys.path.insert(0, str(REPO))
        from sim.cli import main as cli
        out = io.StringIO()
        profiler = cProfile.Profile()
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(out):
            profiler.enable()
            try:
                cli.main(argv, standalone_mode=False)
            finally:
                profiler.disable()
        wall = time.perf_counter() - t0
        profiler.dump_stats(profile)
        stdout = out.getvalue()
        usage = resource.getrusage(resource.RUSAGE_SELF)
    else:
        t0 = time.perf_counter()
        done = subprocess.run([str(Path(sys.executable).parent / "kvsim"), *argv], capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode:
            sys.stderr.write(done.stderr)
            return done.returncode
        stdout = done.stdout
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    row = json.loads(stdout)[0]
    sys.stdout.write(json.dumps({
        "wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "requests": row["requests"],
        "reuse": row["prefix_reuse"], "preemptions": row["preemptions"], "simulated_s": row["simulated_s"],
        "peak_rss_mb": usage.ru_maxrss / 1024, "replay_wall_s": row["wall_s"]}) + "\n")
    return 0


def mocker_child(argv: list[str]) -> int:
    """Runs in the mocker's venv: one `run_mocker_trace_replay` of the file; one JSON line on stdout."""
    p = argparse.ArgumentParser()
    p.add_argument("trace")
    p.add_argument("--router", required=True)
    p.add_argument("--backend", required=True)
    a = p.parse_args(argv)
    os.environ.setdefault("DYN_LOG", "error")
    import dynamo._core as core
    engine = {"engine": {"backend": a.backend, "block_size": BLOCK_SIZE, "num_gpu_blocks": NUM_GPU_BLOCKS}}
    t0, c0 = time.perf_counter(), time.process_time()
    result = core.run_mocker_trace_replay([a.trace], trace_format="mooncake-delta", trace_block_size=TRACE_BLOCK,
                                          extra_engine_args=engine, num_workers=WORKERS, router_mode=a.router,
                                          replay_mode="offline")
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = dict(result.summary)
    sys.stdout.write(json.dumps({
        "wall_s": wall, "cpu_s": cpu, "requests": s["completed_requests"], "reuse": s["prefix_cache_reused_ratio"],
        "simulated_s": s["duration_ms"] / 1000, "peak_rss_mb": peak_rss_mb()}) + "\n")
    return 0


def _json_run(cmd: list[str]) -> dict:
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    if done.returncode:
        raise SystemExit(f"{' '.join(cmd[1:4])} ... failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------------------------------- the table
def profile_lines(path: str, requests: int, top: int = 15) -> list[str]:
    """The `top` functions by own time, in microseconds per request, and their call counts per request."""
    import pstats
    stats = pstats.Stats(path)
    rows = sorted(stats.stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    total = stats.total_tt
    out = [f"    own time, us/request (share of {total:.1f} s profiled)   calls/request   function"]
    for (file, line, name), (_cc, calls, tottime, _ct, _callers) in rows:
        where = f"{Path(file).name}:{line}({name})" if line else name
        out.append(f"    {tottime / requests * 1e6:10.1f} ({tottime / total:5.1%})                    "
                   f"{calls / requests:10.1f}   {where}")
    return out


def session_table(sessions: int, *, routers: list[str], engines: list[str], mocker_python: Path, out: Path,
                  rate_per_s: float = RATE_PER_S, reuse_breakdown: bool = True, profile: bool = False,
                  kvsim_side: str = "replay") -> None:
    """Writes the trace and prints one line per (engine, router): the mocker's and kvsim's figures and the ratio."""
    plans = agent_plans(sessions, rate_per_s=rate_per_s)
    figures = trace_figures(plans)
    trace = out / f"agent-{sessions}x{TURNS}.mooncake-delta.jsonl"
    rows = write_trace(plans, trace)
    shown = trace.relative_to(REPO) if trace.is_relative_to(REPO) else trace
    print(f"agent trace: {sessions:,} sessions x {TURNS} turns = {rows:,} requests, {trace.stat().st_size / 1e6:.1f} MB "
          f"({shown}); prompts {figures['prompt_tokens'] / 1e6:,.0f}M tokens = {figures['prompt_blocks'] / 1e6:.1f}M "
          f"blocks of {BLOCK_SIZE}, mean {figures['prompt_tokens'] / rows:,.0f} tokens, largest context "
          f"{figures['largest_context_tokens']:,}; {WORKERS} workers x {NUM_GPU_BLOCKS * BLOCK_SIZE:,} KV tokens",
          flush=True)
    have_mocker = mocker_python.exists()
    if not have_mocker:
        print(f"  (no mocker: {mocker_python} does not exist; see benchmarks/oracles/dynamo-mocker/README.md)")
    print(f"{'sim':6s} {'engine':6s} {'router':26s} {'reuse':>6s} {'wall s':>8s} {'req/s':>7s} {'blocks/s':>10s} "
          f"{'peak RSS MB':>11s} {'sim s':>7s} {'cpu s':>7s} {'ratio':>6s} {'cpu ratio':>9s}")

    def line(sim: str, engine: str, router: str, r: dict, m: dict | None = None) -> None:
        ratio = (f"{(r['requests'] / r['wall_s']) / (m['requests'] / m['wall_s']):6.2f} "
                 f"{m['cpu_s'] / r['cpu_s']:9.2f}") if m else ""
        print(f"{sim:6s} {engine:6s} {router:26s} {r['reuse']:6.4f} {r['wall_s']:8.1f} {r['requests'] / r['wall_s']:7.1f} "
              f"{figures['prompt_blocks'] / r['wall_s']:10,.0f} {r['peak_rss_mb']:11.0f} {r['simulated_s']:7.0f} "
              f"{r['cpu_s']:7.1f} {ratio}",
              flush=True)

    mocker_runs: dict[tuple[str, str], dict] = {}
    for engine in engines:
        for router in routers:
            m = None
            if have_mocker:
                key = (engine, mocker_router(router))
                if key not in mocker_runs:  # once per engine and mocker router, printed then
                    m = mocker_runs[key] = _json_run([str(mocker_python), str(Path(__file__).resolve()), "_mocker",
                                                      str(trace), "--router", key[1], "--backend", engine])
                    if m["requests"] != rows:
                        raise SystemExit(f"the mocker completed {m['requests']} of {rows} requests")
                    line("mocker", engine, key[1], m)
                m = mocker_runs[key]
            stats = out / f"kvsim-{engine}-{router}.prof" if profile else None
            me = [sys.executable, str(Path(__file__).resolve())]
            if kvsim_side == "replay":
                cmd, profiled = me + ["_replay"], replay_command(trace, engine, router, reuse_breakdown)
                cmd, profiled = cmd + profiled, cmd + ["--profile", str(stats)] + profiled
            else:
                cmd = me + ["_kvsim", "--sessions", str(sessions), "--rate", str(rate_per_s), "--router", router,
                            "--engine", engine, "--reuse-breakdown", str(int(reuse_breakdown))]
                profiled = cmd + ["--profile", str(stats)]
            k = _json_run(cmd)
            if k["requests"] != rows:
                raise SystemExit(f"kvsim completed {k['requests']} requests; the trace has {rows}")
            line("kvsim", engine, router, k, m)
            if stats is not None:
                p = _json_run(profiled)
                print(f"  cProfile of kvsim {engine} {router} ({p['wall_s']:.1f} s under the profiler, "
                      f"{stats.relative_to(REPO) if stats.is_relative_to(REPO) else stats}):")
                print("\n".join(profile_lines(str(stats), p["requests"])), flush=True)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_kvsim":
        return kvsim_child(argv[1:])
    if argv and argv[0] == "_mocker":
        return mocker_child(argv[1:])
    if argv and argv[0] == "_replay":
        return replay_child(argv[1:])
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=2000, help="agent sessions (30 turns each; default 2,000)")
    p.add_argument("--rate", type=float, default=RATE_PER_S, help=f"sessions started per second (default {RATE_PER_S})")
    p.add_argument("--routers", default="round-robin,kv-aware",
                   help="kvsim routers, NAME or NAME:key=value (`kvsim routers`); each beside the mocker's "
                        f"{' / '.join(ROUTERS.values())} ({', '.join(ROUTERS)}), the others beside its kv_router")
    p.add_argument("--engines", default="vllm", help=f"among {', '.join(ENGINES)} (default vllm)")
    p.add_argument("--mocker-python", type=Path, default=REPO / ".venv-dynamo" / "bin" / "python",
                   help="python of a venv with ai-dynamo-runtime==1.6.1")
    p.add_argument("--out", type=Path, default=HERE / "session_traces", help="where the trace is written")
    p.add_argument("--no-reuse-breakdown", action="store_true",
                   help="kvsim without cluster.reuse_breakdown (which keeps every block hash ever sent)")
    p.add_argument("--profile", action="store_true", help="also run each kvsim case under cProfile")
    p.add_argument("--kvsim-side", choices=("replay", "driver"), default="replay",
                   help="replay: `kvsim replay FILE` (default); driver: the same sessions built from the plans in Python")
    a = p.parse_args(argv)
    routers = [r for r in a.routers.split(",") if r]
    engines = [e for e in a.engines.split(",") if e]
    from policies import ROUTERS as KVSIM_ROUTERS
    if bad := [r for r in routers if r.partition(":")[0] not in KVSIM_ROUTERS]:
        raise SystemExit(f"--routers: unknown {', '.join(bad)}; allowed: {', '.join(KVSIM_ROUTERS)}")
    if a.kvsim_side == "driver" and (bad := [r for r in routers if r not in ROUTERS]):
        raise SystemExit(f"--routers with --kvsim-side driver: {', '.join(bad)}; allowed: {', '.join(ROUTERS)}")
    if bad := [e for e in engines if e not in ENGINES]:
        raise SystemExit(f"--engines: unknown {', '.join(bad)}; allowed: {', '.join(ENGINES)}")
    if a.sessions < 1:
        raise SystemExit(f"--sessions must be >= 1, got {a.sessions}")
    if not a.rate > 0:
        raise SystemExit(f"--rate must be > 0, got {a.rate}")
    session_table(a.sessions, routers=routers, engines=engines, mocker_python=a.mocker_python, out=a.out,
                  rate_per_s=a.rate, reuse_breakdown=not a.no_reuse_breakdown, profile=a.profile,
                  kvsim_side=a.kvsim_side)
    return 0


if __name__ == "__main__":
    sys.exit(main())
