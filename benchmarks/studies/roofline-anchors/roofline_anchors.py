"""The roofline time model UNCALIBRATED (its default efficiency factors and overheads) against published figures:

1. the reference run (scenarios/reference/service-baseline.md): Qwen3-0.6B on the built-in cluster (4 workers
   time-sharing the 24 GB-class GPU, one worker on each 8 GB laptop GPU, on the hardware profiles the built-in
   scenario assumes for them), 6 workers, concurrency 4: TTFT of hits ~40 ms (p50 37-42), of misses ~105-113 ms (p50);
2. a published engineering article on vLLM prefix caching (2026; a weak anchor, its workload under-specified; the
   figures it reports are quoted here, the script reads no file): Qwen2.5-72B-Instruct on 4 x A100-80G (TP 4,
   gpu_memory_utilization 0.90, block_size 16), 32 concurrent requests for 5 minutes sharing a system prompt (4,096
   tokens in the article's worked example; the table's length is not stated), max_tokens 2,048 at temperature 0.7:
   TTFT p50 2.1 s off / 0.9 s on, output 2,450 / 3,820 tokens/s.

    python benchmarks/studies/roofline-anchors/roofline_anchors.py            # ~1 min

Prints kvsim's figures beside the published ones and their ratio; nothing is fitted. The second anchor's unknowns
(user-turn length, output lengths, request count) are set as stated below, so read it as an order-of-magnitude check.
"""

from __future__ import annotations

import numpy as np

from sim.results.summary import summarize
from sim.runner import run
from sim.scenario import load_scenario

def reference_point() -> None:
    from sim.scenario import validate_scenario

    base, _ = load_scenario()
    data = base.model_dump()
    # uncalibrated: every efficiency and overhead at its default, no fitted per-request cost or device sharing loss
    data["time_model"] = {"kind": "roofline", "hardware": base.time_model.hardware}
    data["cluster"]["request_overhead_s"] = 0.0
    for dep in data["cluster"]["deployments"]:
        for dev in dep["devices"]:
            dev["speed"] = dev["sharing_efficiency"] = 1.0
    scenario = validate_scenario(data, source="uncalibrated roofline")
    hardware = sorted({scenario.device_time_model(d).hardware for d in scenario.all_devices()[:-1]})
    measured = {"hit": (36, 42), "miss": (104, 113)}  # p50 over N = 2..24 at concurrency 4 (service-baseline.csv)
    print(f"1. reference, 6 workers, concurrency 4, uncalibrated roofline on {', '.join(hardware)}, 3 seeds:")
    for n in (2, 7, 12, 24):
        hit, miss = [], []
        for seed in range(3):
            result = run(scenario.with_overrides(**{"workload.prefixes": n, "workload.concurrency": 4,
                                                     "cluster.workers": 6, "seed": seed}))
            for r in result.measured:
                (hit if r.is_hit else miss).append(r.ttft_s * 1000)
        h, m = float(np.percentile(hit, 50)), float(np.percentile(miss, 50))
        print(f"   N={n:2d}: hit p50 {h:5.1f} ms (measured {measured['hit'][0]}-{measured['hit'][1]}: "
              f"x{h / 39:.2f}), miss p50 {m:5.1f} ms (measured {measured['miss'][0]}-{measured['miss'][1]}: "
              f"x{m / 109:.2f})")


def article_point() -> None:
    base, _ = load_scenario()
    s = base.with_hardware(model="Qwen2.5-72B", hardware="a100-80gb", tensor_parallel=4)
    # 4 x 80 GB x 0.90 (gpu_memory_utilization) - 145 GB of weights - ~10 GB of activations and graphs: ~133 GB of KV
    kv = int(133e9)
    common = {
        "engine.kv_cache_bytes": kv, "engine.max_model_len": 32768, "engine.max_num_batched_tokens": 2048,
        "engine.max_num_seqs": 256, "engine.block_size": 16, "cluster.workers": 1, "workload.concurrency": 32,
        "workload.prefix_tokens": 4096, "workload.tail_tokens": {"kind": "uniform", "low": 50, "high": 250},
        "workload.output_tokens": {"kind": "lognormal", "low": 16, "high": 2048, "mean": 500, "sd": 400},
        "workload.min_requests": 400, "workload.requests_per_prefix": 0, "workload.discard_first": 32,
        "cluster.request_overhead_s": 0.0,
    }
    print("2. article: Qwen2.5-72B, 4 x A100-80G (TP 4), concurrency 32, 4,096-token system prompt, 50-250-token "
          "user turns,")
    print("   outputs lognormal mean 500 (sd 400, 16..2,048 tokens), 400 requests, uncalibrated roofline:")
    for label, prefixes, warmup, published in (("on", 1, 1, (0.9, 3820)), ("off", 100000, 0, (2.1, 2450))):
        # NOTE: prefix caching off = every request its own prefix (no reuse), as vLLM without --enable-prefix-caching
        scenario = s.with_overrides(**common, **{"workload.prefixes": prefixes, "workload.warmup_per_prefix": warmup})
        result = run(scenario)
        summary = summarize(result)
        ttft = float(np.percentile([r.ttft_s for r in result.measured], 50))
        outputs = sum(r.output_tokens for r in result.measured)
        tokens_s = outputs / (result.measured_end_s - result.measured_start_s)
        print(f"   caching {label:3s}: hit rate {summary.request_hit_rate:.2f}, TTFT p50 {ttft:.2f} s (published "
              f"{published[0]} s: x{ttft / published[0]:.2f}), output {tokens_s:,.0f} tokens/s (published "
              f"{published[1]:,}: x{tokens_s / published[1]:.2f})")


if __name__ == "__main__":
    reference_point()
    article_point()
