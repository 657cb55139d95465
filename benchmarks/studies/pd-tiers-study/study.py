"""The P/D and KV-tiers study (issue 25 part 5): at equal GPU count, aggregated workers with KV-aware or random routing
against prefill/decode splits and against aggregated workers with a cluster-shared KV store, on the built-in workload
and on Mooncake's conversation trace.

    python benchmarks/studies/pd-tiers-study/study.py [--repeats 5] [--jobs 2] [--trace traces/conversation_trace.jsonl]
        [--limit N] [--parts builtin,trace] [--out benchmarks/studies/pd-tiers-study]

Every cell is one run on GPUs of one kind (each worker on a device of its own, the scenario's default device; the
built-in scenario's shared 24 GB GPU is dropped so that every layout has the same hardware):

* built-in (`scenarios/service-baseline.yaml`: Qwen3-0.6B, vLLM, 1 GiB KV per worker, concurrency 8) at N = 7 and
  N = 24 prefixes, `--repeats` seeds each (repeat r: seed r, the same requests for every layout);
* the conversation trace (`scenarios/trace-replay.yaml`: a 70B-class model's 320 KiB of KV per token, the mocker-like
  linear step times; open loop at its timestamps), once per layout, with the scenario's 3M KV tokens per worker and
  with a tight 300k.

Writes results.csv (a row per run) and results.txt (a table per workload and GPU count: mean ± 95 % t-interval over
the repeats); `--parts ''` rewrites results.txt from results.csv, and the rows of parts not run are kept, so the parts
(and `--only-pd-store`) can run one at a time. The TTFT split is computed from the records the same way for every
layout: engine queues, the prefill (admission to the first token on the worker that prefilled), the P/D transfer,
the load from a tier (vLLM admits a tier hit once its blocks are loaded: the load is taken out of the queue), and the
rest (hops, per-request overhead, the decode worker's last-token step). On 2 shared cores: the built-in part a few
minutes; the trace's first 3,000 requests 10 to 60 s per layout (a store on a slow link the longest).
"""

from __future__ import annotations

import argparse
import csv
import math
import multiprocessing
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))

from policies import PD_ROUTERS  # noqa: E402
from sim.replay import replay  # noqa: E402
from sim.results.stats import t_interval  # noqa: E402
from sim.results.summary import summarize  # noqa: E402
from sim.routing.spec import router_overrides  # noqa: E402
from sim.runner import run  # noqa: E402
from sim.scenario import load_scenario, with_pools, with_shared_kv_gib  # noqa: E402
from sim.workloads.traces import read_mooncake  # noqa: E402

SLOW_LINK = 1.25e9
"""Bytes/s of a slow store link (10 GbE-class, an LMCache server over TCP): against the default 2.2e10 (200 Gb/s RDMA)."""


TRACE_STORE_GIB = 8192.0
"""The store on the trace: 8 TiB, 26.8M tokens of 320 KiB (the trace's distinct blocks are 93.6M tokens, 28.6 TiB)."""


@dataclass(frozen=True)
class Layout:
    """One way to use `gpus` GPUs: aggregated (pools None) or prefill/decode pools; a router; a shared store."""

    gpus: int
    pools: tuple[int, int] | None
    router: str
    shared_gib: float = 0.0
    shared_link: float | None = None
    """The store link's bytes/s per direction (None: the default NIC)."""

    @property
    def layout(self) -> str:
        return "aggregated" if self.pools is None else f"{self.pools[0]}P+{self.pools[1]}D"

    @property
    def store(self) -> str:
        if not self.shared_gib:
            return "-"
        return f"{self.shared_gib:g} GiB" + (f" @ {self.shared_link / 1e9:g} GB/s" if self.shared_link else "")


def layouts(gpus: int, store_gib: tuple[float, ...]) -> list[Layout]:
    """Aggregated random and kv-aware; the P/D splits with Dynamo's disaggregated router; at 2P every P/D router this
    checkout registers; aggregated + a shared store (random and kv-aware, and random on a slow link); at 2P with the
    store (random, dynamo-disagg) where the checkout models a store with P/D pools."""
    out = [Layout(gpus, None, "random"), Layout(gpus, None, "kv-aware")]
    splits = [(p, gpus - p) for p in (1, 2, gpus // 2) if 0 < p < gpus]
    for pools in dict.fromkeys(splits):
        out.append(Layout(gpus, pools, "dynamo-disagg"))
    mid = (2, gpus - 2)
    out += [Layout(gpus, mid, "random"), Layout(gpus, mid, "kv-aware"),
            Layout(gpus, mid, "dynamo-disagg:conditional_disagg=true")]
    out += [Layout(gpus, mid, name) for name in ("llm-d-pd", "sglang-pd") if name in PD_ROUTERS]
    for gib in store_gib:
        out += [Layout(gpus, None, "random", gib), Layout(gpus, None, "kv-aware", gib)]
    out.append(Layout(gpus, None, "random", store_gib[-1], SLOW_LINK))
    if pd_with_store():  # both: the store is the prefill pool's (Dynamo's KVBM with disaggregation)
        for gib in store_gib:
            out += [Layout(gpus, mid, "random", gib), Layout(gpus, mid, "dynamo-disagg", gib)]
    return out


def pd_with_store() -> bool:
    """Whether this checkout models a shared store with prefill/decode pools (kvsim refused them at first)."""
    from sim.scenario import ScenarioError

    base, _ = load_scenario(REPO / "scenarios" / "service-baseline.yaml")
    try:
        with_shared_kv_gib(with_pools(base.with_overrides(**{"cluster.deployments": []}), 1, 1), 1.0)
    except (ScenarioError, ValueError):
        return False
    return True


def scenario_for(base, layout: Layout, overrides: dict):
    s = base.with_overrides(**{**overrides, "cluster.workers": layout.gpus})
    if layout.pools is not None:
        s = with_pools(s, *layout.pools)
    if layout.shared_gib:
        s = with_shared_kv_gib(s, layout.shared_gib)
        if layout.shared_link:
            s = s.with_overrides(**{"engine.shared_link": {"bandwidth": layout.shared_link}})
    return s.with_overrides(**router_overrides(layout.router, s.router.name, s.router.options))


def ttft_split_ms(records) -> dict[str, float]:
    """Mean TTFT parts over `records`, in ms: queue, prefill, transfer, tier load, other (they sum to the mean)."""
    parts = {"queue": 0.0, "prefill": 0.0, "transfer": 0.0, "tier_load": 0.0, "other": 0.0}
    for r in records:
        tier = getattr(r, "tier_load_s", 0.0)
        # NOTE: vLLM admits a tier hit when its loaded blocks are promoted (`admitted_s`), so the load (`tier_load_s`,
        # from the step that started it) lies between arrival and admission: it is taken out of the queue.
        if r.pd_prefill_worker >= 0:  # disaggregated: the record carries its split (a tier load is the prefill's)
            queue, prefill, transfer = r.ttft_queue_s - tier, r.ttft_prefill_s, r.ttft_transfer_s
        else:
            queue, transfer = r.admitted_s - r.arrival_s - tier, 0.0
            prefill = r.engine_first_token_s - r.admitted_s
        parts["queue"] += queue
        parts["prefill"] += prefill
        parts["transfer"] += transfer
        parts["tier_load"] += tier
        parts["other"] += r.ttft_s - queue - prefill - transfer - tier
    n = max(1, len(records))
    return {f"ttft_{k}_ms": 1000 * v / n for k, v in parts.items()}


def tier_hits(records) -> dict[str, float]:
    """Request and token hit rates by tier: GPU (the worker's own cache), host, shared store."""
    n = max(1, len(records))
    prompt = max(1, sum(r.prompt_tokens for r in records))
    shared = [getattr(r, "shared_cached_tokens", 0) for r in records]
    cpu = [r.cpu_cached_tokens for r in records]
    return {
        "gpu_request_hit_rate": sum(r.is_hit and not c and not s for r, c, s in zip(records, cpu, shared)) / n,
        "shared_request_hit_rate": sum(s > 0 for s in shared) / n,
        "gpu_token_hit_rate": sum(r.cached_tokens - c - s for r, c, s in zip(records, cpu, shared)) / prompt,
        "shared_token_hit_rate": sum(shared) / prompt,
    }


METRICS = ("request_hit_rate", "token_hit_rate", "reuse_available", "gpu_request_hit_rate", "shared_request_hit_rate",
           "gpu_token_hit_rate", "shared_token_hit_rate", "ttft_p50_ms", "ttft_p99_ms", "ttft_queue_ms",
           "ttft_prefill_ms", "ttft_transfer_ms", "ttft_tier_load_ms", "ttft_other_ms", "transfer_p50_ms",
           "prefill_utilisation", "decode_utilisation", "throughput_rps")


def one_builtin(args: tuple[int, Layout, int]) -> dict:
    prefixes, layout, repeat = args
    base, _ = load_scenario(REPO / "scenarios" / "service-baseline.yaml")
    scenario = scenario_for(base, layout, {"cluster.deployments": [], "workload.prefixes": prefixes,
                                           "seed": base.seed + repeat})
    result = run(scenario)
    row = summarize(result).row()
    measured = result.measured
    return {"workload": f"built-in N={prefixes}", **_keys(layout), "repeat": repeat,
            **{m: row.get(m, math.nan) for m in METRICS}, **ttft_split_ms(measured), **tier_hits(measured)}


def one_trace(args: tuple[str, int | None, int, Layout]) -> dict:
    trace, limit, kv_tokens, layout = args
    base, _ = load_scenario(REPO / "scenarios" / "trace-replay.yaml")
    scenario = scenario_for(base, layout, base.engine.capacity_overrides(tokens=kv_tokens))
    result = replay(scenario, read_mooncake(trace, block_size=scenario.engine.block_size, limit=limit),
                    keep_records=True)
    row = {**result.row(), "token_hit_rate": result.row()["prefix_reuse"]}
    return {"workload": f"conversation {kv_tokens // 1000}k KV tokens/GPU", **_keys(layout), "repeat": 0,
            **{m: row.get(m, math.nan) for m in METRICS}, **ttft_split_ms(result.records),
            **tier_hits(result.records)}


def _keys(layout: Layout) -> dict:
    return {"gpus": layout.gpus, "layout": layout.layout, "router": layout.router, "store": layout.store,
            "shared_kv_gib": layout.shared_gib, "shared_link_bytes_per_s": layout.shared_link or ""}


SHOWN = (("req hit", "request_hit_rate", ".3f"), ("token hit", "token_hit_rate", ".3f"),
         ("GPU/shared req hit", ("gpu_request_hit_rate", "shared_request_hit_rate"), ".2f"),
         ("TTFT p50", "ttft_p50_ms", ".0f"), ("TTFT p99", "ttft_p99_ms", ".0f"),
         ("queue/prefill/transfer/tier/other ms", ("ttft_queue_ms", "ttft_prefill_ms", "ttft_transfer_ms",
                                                   "ttft_tier_load_ms", "ttft_other_ms"), ".0f"),
         ("req/s", "throughput_rps", ".2f"))


def table(rows: list[dict], workload: str, gpus: int) -> list[str]:
    sel = [r for r in rows if r["workload"] == workload and int(r["gpus"]) == gpus]
    if not sel:
        return []
    reps = len({str(r["repeat"]) for r in sel})
    lines = [f"\n{workload}, {gpus} GPUs ({'mean ± 95% CI over ' + str(reps) + ' seeds' if reps > 1 else 'one run'}; "
             f"reuse available {mean(r['reuse_available'] for r in sel):.3f})",
             "| layout | router | store | " + " | ".join(h for h, _, _ in SHOWN) + " |",
             "|---" * (3 + len(SHOWN)) + "|"]
    for key in dict.fromkeys((r["layout"], r["router"], r["store"]) for r in sel):
        group = [r for r in sel if (r["layout"], r["router"], r["store"]) == key]
        cells = []
        for _, cols, spec in SHOWN:
            if isinstance(cols, tuple):
                cells.append(" / ".join(format(mean(float(r[c]) for r in group), spec) for c in cols))
                continue
            ci = t_interval([float(r[cols]) for r in group])
            cells.append(format(ci.mean, spec) + (f" ± {format(ci.half_width, spec)}" if reps > 1 else ""))
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(cells) + " |")
    return lines


def _part(workload: str) -> str:
    return "builtin" if workload.startswith("built-in") else "trace"


def mean(values) -> float:
    xs = [float(v) for v in values if not math.isnan(float(v))]
    return sum(xs) / len(xs) if xs else math.nan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent)
    parser.add_argument("--parts", default="builtin,trace",
                        help="Parts to run (builtin, trace; '' runs none: the tables are rewritten from results.csv).")
    parser.add_argument("--gpus", default="6,8")
    parser.add_argument("--trace", type=Path, default=REPO / "traces" / "conversation_trace.jsonl")
    parser.add_argument("--limit", type=int, default=None, help="Replay only the trace's first N requests.")
    parser.add_argument("--trace-kv-tokens", default="3000000,300000",
                        help="KV tokens per GPU on the trace, comma-separated.")
    parser.add_argument("--trace-gpus", default="6", help="GPU counts on the trace, comma-separated.")
    parser.add_argument("--only-pd-store", action="store_true",
                        help="Run only the P/D + shared store layouts of the built-in part (to append their rows).")
    args = parser.parse_args()
    gpus = [int(g) for g in args.gpus.split(",")]
    parts = [p for p in args.parts.split(",") if p]
    todo_builtin = [(n, layout, k) for n, stores in ((7, (64.0,)), (24, (4.0, 64.0))) for g in gpus
                    for layout in layouts(g, stores) for k in range(args.repeats)] if "builtin" in parts else []
    if args.only_pd_store:  # add the P/D + store arm to an existing results.csv (see --only-pd-store)
        todo_builtin = [t for t in todo_builtin if t[1].pools and t[1].shared_gib]
    todo_trace = [(str(args.trace), args.limit, int(kv), layout) for kv in args.trace_kv_tokens.split(",")
                  for g in args.trace_gpus.split(",") for layout in layouts(int(g), (TRACE_STORE_GIB,))
                  ] if "trace" in parts else []
    with multiprocessing.get_context("fork").Pool(max(1, args.jobs)) as pool:
        rows = pool.map(one_builtin, todo_builtin, chunksize=1) + pool.map(one_trace, todo_trace, chunksize=1)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "results.csv"
    # NOTE: the rows of the parts not run this time are kept, so that the parts can run one at a time.
    kept = [r for r in (list(csv.DictReader(path.open())) if path.exists() else [])
            if _part(r["workload"]) not in parts]
    rows = kept + rows
    if not rows:
        sys.exit(f"nothing to tabulate: no parts run and no rows in {path}")
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[-1]), extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    lines = []
    for workload in dict.fromkeys(r["workload"] for r in rows):
        for g in sorted({int(r["gpus"]) for r in rows}):
            lines += table(rows, workload, g)
    text = "\n".join(lines) + "\n"
    (args.out / "results.txt").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
