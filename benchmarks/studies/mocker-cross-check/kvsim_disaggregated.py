"""kvsim's side of the disaggregated mocker cross-check (driver: disaggregated.py in this folder).

A scenario from scenarios/trace-replay.yaml with `cluster.disaggregation` (pd's P/D pools), replayed open loop
through `sim.runner.build_cluster` (the DisaggregatedCluster), every record kept for exact percentiles.

What is matched to the mocker (../../oracles/dynamo-mocker/disaggregated.md):
* pools: P prefill and D decode vLLM workers, 64-token blocks, num_gpu_blocks per pool + 1 (kvsim counts vLLM's
  null block, the mocker does not: builtin_shape.md);
* the transfer: the mocker's default takes no time (kv_bytes_per_token unset), so the link has latency 0 and a
  bandwidth of 1e18 B/s (about 0.3 ns for a 2,400-token prompt at 320 KiB a token);
* routers: `round-robin` = pd-stages with round robin on both pools, the decode worker chosen when the prefill is
  back (the mocker hands decode workers out in prefill-completion order); `kv` = dynamo-disagg (Dynamo's KV cost on
  the prefill pool, load only on the decode pool);
* step times, `--time-model`:
  - `poly` (default): the mocker's own polynomial per pool (harness-local, swapped in for the pools' time models):
    prefill pool 4.209989e-07 t^2 + 1.518344e-02 t + 16.50142 ms for t new tokens (its requests have one output
    token, so it never decodes); decode pool -25.74 u^2 + 54.01 u + 5.74 ms (floor 1) with u = decode context
    tokens / the pool's KV tokens, and the one prompt token kvsim's decode worker recomputes costs nothing (the
    mocker's decode worker computes no prompt token);
  - `linear`: the same as scenario-file linear models per pool device (what a user can write without code):
    prefill base 16.50142 ms + 15.18344 us/token + 8.42e-10 s per attention pair (the t^2 term of one cold prompt);
    decode base 5.74 ms + 54.01 ms / KV tokens per context token and per sequence, prompt tokens free.
"""

from __future__ import annotations

import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


class MockerPolynomial:
    """The Dynamo mocker's default vLLM step time (AISimulate polynomial, lib/mocker/src/common/perf_model.rs), one
    pool's half: `prefill` charges the prefill polynomial on the step's prompt tokens, `decode` the decode one on
    the KV utilisation and nothing for prompt tokens. A `StepTimeModel` (sim.engines.interface)."""

    def __init__(self, pool: str, capacity_tokens: int) -> None:
        self.pool = pool
        self.capacity_tokens = capacity_tokens

    def decode_steps(self, num_decodes: int, context_tokens: int):
        return None  # not an arithmetic series: every decode step is simulated

    def step_seconds(self, plan) -> float:
        ms = 0.0
        t = plan.num_prefill_tokens
        if self.pool == "prefill":
            if t > 0:
                ms += 4.209989e-07 * t * t + 1.518344e-02 * t + 1.650142e+01
            return ms / 1000.0
        # NOTE: the decode pool's only prompt tokens are the last token of each request it received, recomputed in
        # the step that samples the request's first token: the mocker's first decode step of that request. So each
        # counts as a decoding sequence whose context is its prompt.
        seqs = plan.num_decode_seqs + t
        if seqs > 0:
            u = (plan.num_decode_context_tokens + plan.num_prefill_context_tokens + seqs) / self.capacity_tokens
            ms += max(-25.74 * u * u + 54.01 * u + 5.74, 1.0)
        return ms / 1000.0


def linear_specs(decode_capacity_tokens: int) -> dict[str, dict]:
    per_token = 54.01e-3 / decode_capacity_tokens
    return {
        "prefill": {"base_s": 16.50142e-3, "prefill_token_s": 15.18344e-6, "decode_seq_s": 0.0,
                    "decode_context_token_s": 0.0, "prefill_attention_pair_s": 8.42e-10},
        "decode": {"base_s": 5.74e-3, "prefill_token_s": 0.0, "decode_seq_s": per_token,
                   "decode_context_token_s": per_token, "prefill_attention_pair_s": 0.0},
    }


def scenario_for(*, topology: tuple[int, int], router: str, seed: int, block_size: int,
                 pool_blocks: tuple[int, int], time_model: str):
    from sim.scenario import load_scenario
    base, _ = load_scenario(REPO / "scenarios" / "trace-replay.yaml")
    P, D = topology
    pb, db = pool_blocks
    specs = linear_specs(db * block_size)

    def pool(workers: int, stage: str, blocks: int) -> dict:
        device = {"name": f"mocker-{stage}", "time_model": specs[stage]}
        # NOTE: + 1: kvsim's block count includes vLLM's null block, the mocker's does not (builtin_shape.md).
        return {"workers": workers, "device": device, "engine": {"num_gpu_blocks_override": blocks + 1}}

    routers = {
        "round-robin": ("pd-stages", {"prefill_router": "round-robin", "decode_router": "round-robin",
                                      "decode_after_prefill": True}),
        "kv": ("dynamo-disagg", {}),
    }
    name, options = routers[router]
    return base.with_overrides(**{
        "seed": seed, "engine.block_size": block_size, "cluster.workers": P + D,
        "cluster.disaggregation": {"prefill": pool(P, "prefill", pb), "decode": pool(D, "decode", db),
                                   "link": {"bandwidth_bytes_per_s": 1e18, "latency_s": 0.0, "overhead_s": 0.0}},
        "router.name": name, "router.options": options})


def run(trace: Path, *, trace_name: str, topology: tuple[int, int], router: str, seed: int, block_size: int,
        trace_block: int, pool_blocks: tuple[int, int], time_model: str = "poly") -> dict:
    import simpy

    import sim.cluster.disaggregated as disaggregated
    from sim.runner import build_cluster, build_router
    from sim.workloads.traces import read_mooncake

    scenario = scenario_for(topology=topology, router=router, seed=seed, block_size=block_size,
                            pool_blocks=pool_blocks, time_model=time_model)
    builder = disaggregated.build_time_model
    if time_model == "poly":
        prefill_base_s = scenario.cluster.disaggregation.prefill.device.time_model.base_s
        models = {"prefill": MockerPolynomial("prefill", 0),
                  "decode": MockerPolynomial("decode", pool_blocks[1] * block_size)}
        # NOTE: the pools' linear specs differ in base_s, which tells the pool each device belongs to.
        disaggregated.build_time_model = lambda spec, model: models[
            "prefill" if spec.base_s == prefill_base_s else "decode"]
    try:
        env = simpy.Environment()
        cluster = build_cluster(env, scenario, build_router(scenario))
        records = []
        max_tokens = scenario.max_request_tokens
        rejected = 0

        def arrivals():
            nonlocal rejected
            for item in read_mooncake(trace, block_size=block_size, trace_block_tokens=trace_block):
                request = item.request
                if request.prompt_tokens + request.output_tokens > max_tokens:
                    rejected += 1
                    continue
                if item.arrival_s > env.now:
                    yield env.timeout(item.arrival_s - env.now)
                cluster.send(request, records.append)

        t0 = time.perf_counter()
        env.process(arrivals())
        env.run()
        wall = time.perf_counter() - t0
    finally:
        disaggregated.build_time_model = builder
    ttft = sorted(r.ttft_s * 1000 for r in records)
    n = len(ttft)

    def pct(q: float) -> float:
        return ttft[min(n - 1, max(0, round(q / 100 * n + 0.5) - 1))]

    prompt = sum(r.prompt_tokens for r in records)
    return {"wall_s": wall, "requests": n, "rejected": rejected,
            "reuse": sum(r.cached_tokens for r in records) / prompt,
            "ttft_p50_ms": pct(50), "ttft_p90_ms": pct(90), "ttft_p99_ms": pct(99), "ttft_mean_ms": sum(ttft) / n,
            "e2e_p50_ms": sorted(r.e2e_s * 1000 for r in records)[n // 2],
            "decode_span_ms_p50": sorted((r.first_token_s - r.arrival_s) * 1000 for r in records)[n // 2],
            "ttft_transfer_ms_max": max(r.ttft_transfer_s for r in records) * 1000,
            "transfer_tokens": sum(r.transfer_tokens for r in records),
            "time_model": time_model}
