"""What the time models cost: `python benchmarks/speed/time_model_speed.py [--only roofline|sharing]`.

roofline: the reference grid (prefixes 2,7,12,24 x workers 3,6 x concurrency 4,8,16, 1 repeat) of the built-in
scenario (roofline) and of the same scenario with its previous linear fit.

sharing: the device-sharing model (docs/time/device-sharing.md) against strict time slicing, each scenario as shipped
and with its devices' `host_load` and `idle_load` 0, `step_occupancy` 1 and no pauses (the
model before): the built-in scenario's reference grid,
and the CPU scenario (`scenarios/tiny-cpu-shared.yaml`) at 1, 2 and 3 servers, concurrency 1-16. A device whose load can
exceed its cores is shared step by step (no decode stretches), which is where the model costs.

Each pair runs in one process and in the same run, interleaved (A, B, A); the machine is shared and noisy: compare the
ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from sim.scenario import Scenario, load_scenario, validate_scenario
from sim.studies.sweep import run_sweep, sweep_points

REPO = Path(__file__).resolve().parents[2]
LINEAR = {"kind": "linear", "base_s": 0.004899502386278894, "prefill_token_s": 3.1629867389337654e-05,
          "decode_seq_s": 0.0005416960974883227}  # the built-in scenario's fit before the roofline


def _time_slicing(scenario: Scenario) -> Scenario:
    data = scenario.model_dump()
    for dep in data["cluster"]["deployments"]:
        for d in dep["devices"]:
            d.update(host_load=0.0, idle_load=0.0, step_occupancy=1.0, pause_s=0.0, pause_fraction=0.0, handoff_s=0.0)
    return validate_scenario(data, source=f"{scenario.name}, strict time slicing")


def _pair(label: str, a: tuple[str, Scenario], b: tuple[str, Scenario], points) -> None:
    seconds: dict[str, list[float]] = {a[0]: [], b[0]: []}
    for name, scenario in (a, b, a):
        t0 = time.perf_counter()
        run_sweep(scenario, points, jobs=1)
        seconds[name].append(time.perf_counter() - t0)
        print(f"  {label} {name:14s}: {len(points)} runs in {seconds[name][-1]:.2f} s")
    base = sum(seconds[a[0]]) / len(seconds[a[0]])
    print(f"{label}: {b[0]} / {a[0]}: {seconds[b[0]][0] / base:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=["roofline", "sharing"])
    args = parser.parse_args()
    builtin, _ = load_scenario()
    grid = sweep_points(workers=[3, 6], prefixes=[2, 7, 12, 24], concurrency=[4, 8, 16],
                        routers=[builtin.router.name], repeats=1, seed=builtin.seed)
    if args.only in (None, "roofline"):
        data = builtin.model_dump()
        data["time_model"] = LINEAR
        linear = validate_scenario(data, source="built-in, linear time model")
        _pair("built-in grid", ("linear", linear), ("roofline", builtin), grid)
    if args.only in (None, "sharing"):
        _pair("built-in grid", ("time slicing", _time_slicing(builtin)), ("sharing model", builtin), grid)
        cpu, _ = load_scenario(REPO / "scenarios" / "tiny-cpu-shared.yaml")
        cpu_points = sweep_points(workers=[1, 2, 3], prefixes=[7], concurrency=[1, 2, 4, 8, 16],
                                  routers=[cpu.router.name], repeats=1, seed=cpu.seed)
        _pair("tiny-cpu-shared", ("time slicing", _time_slicing(cpu)), ("sharing model", cpu), cpu_points)


if __name__ == "__main__":
    main()
