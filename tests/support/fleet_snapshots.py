"""Hand-made fleet snapshots for autoscaler tests (`sim.scaling.FleetSnapshot`): the ready workers' metrics,
how many are starting, and the window's traffic."""

from __future__ import annotations

from collections.abc import Sequence

from sim.scaling import FleetSnapshot, WorkerSnapshot


def fleet(now_s: float, in_flight: Sequence[int], *, starting: int = 0, waiting: Sequence[int] | None = None,
          kv_usage: Sequence[float] | None = None, ttft_ms: Sequence[float] = (), arrivals: int = 0, completed: int = 0,
          window_s: float = 15.0, draining: int = 0) -> FleetSnapshot:
    """Ready workers 0..R-1 with `in_flight[i]` requests (and `waiting[i]`, `kv_usage[i]`), then `starting` starting
    and `draining` draining workers, each its own instance."""
    ready = len(in_flight)
    waiting = list(waiting) if waiting is not None else [0] * ready
    kv_usage = list(kv_usage) if kv_usage is not None else [0.0] * ready
    workers = [WorkerSnapshot(worker=i, instance=i, phase="ready", phase_since_s=0.0, in_flight=in_flight[i],
                              num_running=in_flight[i] - waiting[i] if in_flight[i] >= waiting[i] else 0,
                              num_waiting=waiting[i], kv_usage=kv_usage[i]) for i in range(ready)]
    workers += [WorkerSnapshot(worker=ready + j, instance=ready + j, phase="starting", phase_since_s=now_s,
                               in_flight=0, num_running=0, num_waiting=0, kv_usage=0.0) for j in range(starting)]
    workers += [WorkerSnapshot(worker=ready + starting + j, instance=ready + starting + j, phase="draining",
                               phase_since_s=now_s, in_flight=1, num_running=1, num_waiting=0, kv_usage=0.1)
                for j in range(draining)]
    return FleetSnapshot(now_s=now_s, workers=tuple(workers), window_s=window_s, arrivals=arrivals,
                         arrival_prompt_tokens=0, completed=completed, completed_output_tokens=0, ttft_ms=tuple(ttft_ms),
                         cached_prompt_tokens=0, admitted_prompt_tokens=0)
