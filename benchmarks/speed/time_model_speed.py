"""What the roofline time model costs against the linear one: `python benchmarks/speed/time_model_speed.py`.

Runs the reference grid (prefixes 2,7,12,24 x workers 3,6 x concurrency 4,8,16, 1 repeat) of the built-in scenario
(roofline) and of the same scenario with its previous linear fit, in one process and in the same run, and prints
wall seconds and the ratio (the machine is shared and noisy: compare the ratio, not the seconds).
"""

from __future__ import annotations

import time

from sim.scenario import load_scenario, validate_scenario
from sim.studies.sweep import run_sweep, sweep_points

LINEAR = {"kind": "linear", "base_s": 0.004899502386278894, "prefill_token_s": 3.1629867389337654e-05,
          "decode_seq_s": 0.0005416960974883227}  # the built-in scenario's fit before the roofline


def main() -> None:
    roofline, _ = load_scenario()
    data = roofline.model_dump()
    data["time_model"] = LINEAR
    linear = validate_scenario(data, source="built-in, linear time model")
    points = sweep_points(workers=[3, 6], prefixes=[2, 7, 12, 24], concurrency=[4, 8, 16],
                          routers=[roofline.router.name], repeats=1, seed=roofline.seed)
    seconds = {}
    for name, scenario in (("linear", linear), ("roofline", roofline), ("linear again", linear)):
        t0 = time.perf_counter()
        run_sweep(scenario, points, jobs=1)
        seconds[name] = time.perf_counter() - t0
        print(f"{name:12s}: {len(points)} runs in {seconds[name]:.2f} s")
    base = (seconds["linear"] + seconds["linear again"]) / 2
    print(f"roofline / linear: {seconds['roofline'] / base:.2f}x")


if __name__ == "__main__":
    main()
