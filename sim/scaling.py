"""The autoscaling extension point: what an autoscaler sees of the fleet at each tick, and what it answers.

`policies.autoscalers` implements `Autoscaler`; the composition root builds one from the `AUTOSCALERS` registry and
the fleet (`sim.cluster.fleet`) calls it every `interval_s` of simulated time, as Kubernetes' HPA controller syncs
every 15 s and Dynamo's Planner adjusts every `adjustment_interval`. An autoscaler answers a desired worker count;
the fleet clamps it to [min_workers, max_workers] and reconciles: new workers start cold after their provisioning
delay, surplus workers drain (no new requests; running ones finish) and then drop their caches.

This mirrors the offline `scaling_policy` callback of Dynamo's mocker (`ai-dynamo-runtime` 1.6.1,
`run_mocker_trace_replay(scaling_policy=...)`: `initial_tick_ms()`, `on_tick(snapshot) -> dict`), so that one rule
can drive both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Protocol

WorkerPhase = Literal["starting", "ready", "draining"]
"""A live worker's phase: `starting` (provisioning: weights load, engine warms; not routable), `ready` (routable),
`draining` (not routable; finishes what it runs, then stops and drops its cache). Stopped workers are not in a
snapshot."""


@dataclass(frozen=True, slots=True)
class WorkerSnapshot:
    """One live worker at a tick."""

    worker: int
    """Its slot (the worker index routers see; a slot is reused by a later worker after this one stopped)."""
    instance: int
    """Its instance id: a new worker in a reused slot has a new one (what a hashing router hashes)."""
    phase: WorkerPhase
    phase_since_s: float
    """When it entered its phase (simulated seconds)."""
    in_flight: int
    """Requests dispatched to it and not completed."""
    num_running: int
    """Its engine's running requests (vLLM `num_requests_running`)."""
    num_waiting: int
    """Its engine's waiting requests (vLLM `num_requests_waiting`)."""
    kv_usage: float
    """Its engine's KV cache usage, 0..1 (vLLM `kv_cache_usage_perc`)."""


@dataclass(frozen=True, slots=True)
class FleetSnapshot:
    """The fleet at a tick, and the traffic of the window since the previous tick (`window_s` long)."""

    now_s: float
    workers: tuple[WorkerSnapshot, ...]
    """Every live worker (starting, ready, draining), in slot order."""
    window_s: float
    arrivals: int
    """Requests that reached the router in the window."""
    arrival_prompt_tokens: int
    """Their prompt tokens."""
    completed: int
    """Requests whose response ended in the window."""
    completed_output_tokens: int
    """Their output tokens."""
    ttft_ms: tuple[float, ...]
    """TTFTs of the requests whose first token reached the client in the window."""
    cached_prompt_tokens: int
    """Prompt tokens cached at admission, of the requests admitted in the window (with `admitted_prompt_tokens`:
    the window's prefix reuse)."""
    admitted_prompt_tokens: int

    def count(self, phase: WorkerPhase) -> int:
        """Live workers in `phase`."""
        return sum(1 for w in self.workers if w.phase == phase)

    @property
    def ready(self) -> int:
        return self.count("ready")

    @property
    def starting(self) -> int:
        return self.count("starting")


class Autoscaler(Protocol):
    """A scaling rule. `desired_workers` is called every `interval_s` (the first call at `interval_s`); it may keep
    state between calls (stabilisation windows, load predictors). It answers the worker count it wants (ready +
    starting), before clamping to the fleet's bounds; the fleet does the rest."""

    name: ClassVar[str]
    interval_s: float

    def desired_workers(self, snapshot: FleetSnapshot) -> int: ...


class AutoscalerFactory(Protocol):
    """How the composition root builds an autoscaler: the class, called with the fleet's bounds and the options
    (`kvsim replay --autoscaler hpa:target=4,metric=in_flight`)."""

    name: ClassVar[str]

    def __call__(self, *, min_workers: int, max_workers: int, options: dict[str, Any]) -> Autoscaler: ...


def ready_workers(snapshot: FleetSnapshot) -> Sequence[WorkerSnapshot]:
    """The ready workers of `snapshot` (what a metric averaged over the serving pods reads)."""
    return [w for w in snapshot.workers if w.phase == "ready"]
