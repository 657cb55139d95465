"""What a host (CPU) KV tier costs the simulator: `python benchmarks/speed/host_tier_speed.py`.

The built-in workload at the study's point (6 workers, N = 24, concurrency 8, random routing) without a tier and with
4 and 16 GiB of host KV per worker, best of 3 runs each, in one process; printed as seconds and as the ratio to the run
without a tier (the tier adds copy jobs, empty polling steps and fewer decode fast-forwards).
"""

from __future__ import annotations

import time

from sim.runner import run
from sim.scenario import load_scenario, with_cpu_kv_gib


def best_of(scenario, n: int = 3) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        run(scenario)
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    base, _ = load_scenario()
    point = base.with_overrides(**{"workload.prefixes": 24, "cluster.workers": 6, "router.name": "random"})
    none = best_of(point)
    print(f"no host tier: {none:.3f} s")
    for gib in (4, 16):
        t = best_of(with_cpu_kv_gib(point, gib))
        print(f"{gib:2d} GiB host KV per worker: {t:.3f} s = {t / none:.2f}x")


if __name__ == "__main__":
    main()
