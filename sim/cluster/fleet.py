"""The elastic fleet: slots whose workers start, serve, drain and stop as an autoscaler asks.

An autoscaled cluster is built with `max_workers` slots, one device each. A slot holds at most one live worker (an
*instance*) at a time and goes through

    stopped --launch--> starting --provisioning delay--> ready --drain--> draining --last request done--> stopped
                           |                                                                          ^
                           +------------------------ cancel (scale-in) -------------------------------+

* starting: the autoscaler asked for it; weights load and the engine starts (`AutoscalingSpec.provisioning_s`). Not
  routable; it holds its device (and is paid for).
* ready: routable. It is a NEW engine: an empty cache and counters of its own (summed into the slot's totals).
* draining: not routable; it finishes the requests already sent to it.
* stopped: its engine (and cache) is dropped; the slot gets a fresh one for its next instance. The slot's KV event
  subscribers receive a `cleared` event (vLLM `AllBlocksCleared`), so an event-fed router index forgets it.

Every `interval_s` of simulated time (the first at `interval_s`) the fleet hands the autoscaler a `FleetSnapshot` and
reconciles to its answer clamped to [min_workers, max_workers] as a ReplicaSet does: more workers are launched in
the lowest stopped slots; fewer are removed in Kubernetes' deletion order (`ActivePodsWithRanks.Less`,
`pkg/controller/controller_utils.go`): a not-ready (starting) one before a ready one, then the one ready for the
shortest time (log2 buckets of the ready duration, `LogarithmicScaleDown`, on since Kubernetes 1.22), then the newest
(`fleet_deletion_order`). A draining worker is not counted: a Deployment does not resurrect a terminating pod.
Routers hear each change of the routable set through `Router.set_workers`.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import simpy

from sim.engines.interface import EngineLoad
from sim.results.records import RequestRecord, Slo
from sim.results.timeline import FleetRecord, InstanceSpan, ScaleDecision, Timeline
from sim.routing.interface import Router
from sim.scaling import Autoscaler, FleetSnapshot, WorkerPhase, WorkerSnapshot

if TYPE_CHECKING:
    from sim.engines.interface import ServedRequest
    from sim.scenario import AutoscalingSpec


class _Loaded(Protocol):
    def load(self) -> EngineLoad: ...


class FleetHost(Protocol):
    """What the fleet reads of its cluster (`sim.cluster.cluster.Cluster`): the slots' workers, the in-flight counts
    and the router."""

    workers: Sequence[_Loaded]
    router: Router

    def in_flight(self, worker: int) -> int: ...


@dataclass(slots=True)
class _Instance:
    """One live worker in a slot, and what it served (counted as its requests complete)."""

    slot: int
    instance: int
    started_s: float
    ready_s: float | None = None
    drained_s: float | None = None
    stopped_s: float | None = None
    requests: int = 0
    hit_requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0

    @property
    def phase(self) -> WorkerPhase:
        if self.drained_s is not None:
            return "draining"
        return "starting" if self.ready_s is None else "ready"

    def span(self) -> InstanceSpan:
        return InstanceSpan(slot=self.slot, instance=self.instance, started_s=self.started_s, ready_s=self.ready_s,
                            drained_s=self.drained_s, stopped_s=self.stopped_s, requests=self.requests,
                            hit_requests=self.hit_requests, prompt_tokens=self.prompt_tokens,
                            cached_tokens=self.cached_tokens)


def _log2_rank(duration_s: float) -> int:
    """Kubernetes' `logarithmicRankDiff` bucket of a duration: int(log2(nanoseconds)), -1 for none."""
    ns = duration_s * 1e9
    return int(math.log2(ns)) if ns >= 1 else -1


def _deletion_less(a: _Instance, b: _Instance, now_s: float) -> bool:
    """Kubernetes `ActivePodsWithRanks.Less` for two live instances: True if `a` goes first. Rules 1, 2, 4, 5 and
    7 (unassigned, pod phase, deletion cost, pods doubled up on a node, restarts) never differ here: one worker per
    device, no annotations, no restarts. Where Kubernetes falls back to UID order (pseudo-random), kvsim takes the
    newer instance first."""
    a_ready, b_ready = a.ready_s is not None, b.ready_s is not None
    if a_ready != b_ready:  # 3. not ready < ready
        return not a_ready
    if a_ready and a.ready_s != b.ready_s:  # 6. ready for a shorter time (log2 buckets) first
        diff = _log2_rank(now_s - a.ready_s) - _log2_rank(now_s - b.ready_s)
        return a.instance > b.instance if diff == 0 else diff < 0
    if a.started_s != b.started_s:  # 8. newer first (log2 buckets)
        diff = _log2_rank(now_s - a.started_s) - _log2_rank(now_s - b.started_s)
        return a.instance > b.instance if diff == 0 else diff < 0
    # NOTE: Kubernetes answers False both ways here and leaves the order to its unstable sort; kvsim takes the newer.
    return a.instance > b.instance


def fleet_deletion_order(instances: list[_Instance], now_s: float) -> list[_Instance]:
    """`instances` (starting and ready) sorted as a ReplicaSet picks pods to delete: the first goes first."""
    def cmp(a: _Instance, b: _Instance) -> int:
        return -1 if _deletion_less(a, b, now_s) else (1 if _deletion_less(b, a, now_s) else 0)
    return sorted(instances, key=functools.cmp_to_key(cmp))


class _Window:
    """The traffic since the previous tick (`FleetSnapshot`'s window fields)."""

    __slots__ = ("arrivals", "arrival_prompt_tokens", "completed", "completed_output_tokens", "ttft_ms",
                 "cached_prompt_tokens", "admitted_prompt_tokens")

    def __init__(self) -> None:
        self.arrivals = self.arrival_prompt_tokens = self.completed = self.completed_output_tokens = 0
        self.cached_prompt_tokens = self.admitted_prompt_tokens = 0
        self.ttft_ms: list[float] = []


class Fleet:
    """The slots of an autoscaled `Cluster`, their instances and the tick process (see the module docstring).

    The cluster calls `dispatched`, `first_token` and `completed` for every request, in time order; `routable`
    says whether a slot may be sent requests. Invariants: a slot holds at most one live instance; after a tick,
    ready + starting is the clamped answer (as far as slots not held by draining workers allow); the routable set is
    never empty (min_workers >= 1, and a scale-in removes starting workers before ready ones).
    """

    def __init__(self, env: simpy.Environment, cluster: FleetHost, spec: AutoscalingSpec, autoscaler: Autoscaler, *,
                 provisioning_s: float, slo: Slo, retire: Callable[[int], None]) -> None:
        if autoscaler.interval_s <= 0:
            raise ValueError(f"autoscaler {autoscaler.name!r}: interval_s must be > 0, got {autoscaler.interval_s}")
        self.env = env
        self.cluster = cluster
        self.spec = spec
        self.autoscaler = autoscaler
        self.provisioning_s = provisioning_s
        self._retire = retire
        self.num_slots = spec.max_workers
        self.live: dict[int, _Instance] = {}
        self.spans: list[InstanceSpan] = []
        """Stopped instances, in stop order (live ones are added by `result`)."""
        self.decisions: list[ScaleDecision] = []
        self.timeline = Timeline(bin_s=spec.timeline_bin_s or autoscaler.interval_s, slo=slo)
        self._window = _Window()
        self._next_instance = 0
        self._sent_s: dict[int, float] = {}
        self._in_flight = 0
        self._all_completed: simpy.Event | None = None
        for slot in range(spec.workers_at_start):
            inst = self._launch(slot)
            inst.ready_s = 0.0  # NOTE: the initial workers were provisioned before time 0
        self._publish_routable()
        self.process = env.process(self._ticks())

    # ------------------------------------------------------------------ the cluster's calls
    def routable(self, slot: int) -> bool:
        inst = self.live.get(slot)
        return inst is not None and inst.phase == "ready"

    def dispatched(self, request, slot: int) -> None:
        if not self.routable(slot):
            raise RuntimeError(f"request {request.request_id} sent to worker {slot}, which is not ready "
                               f"(routable: {self.routable_slots()})")
        self._window.arrivals += 1
        self._window.arrival_prompt_tokens += request.prompt_tokens
        self._sent_s[request.request_id] = self.env.now
        self._in_flight += 1

    def first_token(self, state: ServedRequest) -> None:
        """`state`'s first token reached the client now (its admission's hit is booked here, with its TTFT)."""
        window = self._window
        window.ttft_ms.append((self.env.now - self._sent_s[state.request.request_id]) * 1e3)
        window.cached_prompt_tokens += state.num_cached_tokens or 0
        window.admitted_prompt_tokens += state.request.prompt_tokens

    def all_completed(self) -> simpy.Event:
        """An event that fires when no request is in flight (now, if none is)."""
        event = self._all_completed = self.env.event()
        if self._in_flight == 0:
            event.succeed()
        return event

    def completed(self, record: RequestRecord) -> None:
        self._sent_s.pop(record.request_id, None)
        self._in_flight -= 1
        if self._in_flight == 0 and self._all_completed is not None and not self._all_completed.triggered:
            self._all_completed.succeed()
        self._window.completed += 1
        self._window.completed_output_tokens += record.output_tokens
        inst = self.live[record.worker]  # NOTE: a worker stops only once its last request completed
        inst.requests += 1
        inst.hit_requests += record.cached_tokens > 0
        inst.prompt_tokens += record.prompt_tokens
        inst.cached_tokens += record.cached_tokens
        self.timeline.add(record, cold=record.sent_s - inst.ready_s < self.spec.cold_window_s)
        if inst.phase == "draining" and self.cluster.in_flight(record.worker) == 0:
            self._stop(inst)

    def routable_slots(self) -> tuple[int, ...]:
        return tuple(s for s in sorted(self.live) if self.live[s].phase == "ready")

    # ------------------------------------------------------------------ ticks
    def _ticks(self):
        interval_s = self.autoscaler.interval_s
        while True:
            yield self.env.timeout(interval_s)
            snapshot = self.snapshot(interval_s)
            desired = self.autoscaler.desired_workers(snapshot)
            target = min(max(int(desired), self.spec.min_workers), self.spec.max_workers)
            self._reconcile(target)
            self.decisions.append(ScaleDecision(now_s=self.env.now, desired_workers=int(desired),
                                                target_workers=target, ready=snapshot.ready,
                                                starting=snapshot.starting, draining=snapshot.count("draining")))

    def snapshot(self, window_s: float) -> FleetSnapshot:
        """The fleet now and the window's traffic (which starts anew)."""
        workers = []
        for slot in sorted(self.live):
            inst = self.live[slot]
            load = self.cluster.workers[slot].load()
            phase = inst.phase
            since = {"starting": inst.started_s, "ready": inst.ready_s, "draining": inst.drained_s}[phase]
            workers.append(WorkerSnapshot(worker=slot, instance=inst.instance, phase=phase, phase_since_s=since,
                                          in_flight=self.cluster.in_flight(slot), num_running=load.num_running,
                                          num_waiting=load.num_waiting, kv_usage=load.kv_usage))
        w, self._window = self._window, _Window()
        return FleetSnapshot(now_s=self.env.now, workers=tuple(workers), window_s=window_s, arrivals=w.arrivals,
                             arrival_prompt_tokens=w.arrival_prompt_tokens, completed=w.completed,
                             completed_output_tokens=w.completed_output_tokens, ttft_ms=tuple(w.ttft_ms),
                             cached_prompt_tokens=w.cached_prompt_tokens,
                             admitted_prompt_tokens=w.admitted_prompt_tokens)

    def _reconcile(self, target: int) -> None:
        """Launch or remove workers so that ready + starting = `target` (as far as free slots allow)."""
        active = [i for i in self.live.values() if i.phase != "draining"]
        if target > len(active):
            free = [s for s in range(self.num_slots) if s not in self.live]
            for slot in free[:target - len(active)]:
                inst = self._launch(slot)
                self.env.timeout(self.provisioning_s).callbacks.append(lambda _e, inst=inst: self._ready(inst))
            return
        removed = fleet_deletion_order(active, self.env.now)[:len(active) - target]
        drained = False
        for inst in removed:
            if inst.phase == "starting":
                self._stop(inst)  # cancelled: it never served
            else:
                inst.drained_s = self.env.now
                drained = True
        if drained:
            self._publish_routable()
            for inst in removed:
                if inst.phase == "draining" and self.cluster.in_flight(inst.slot) == 0:
                    self._stop(inst)

    # ------------------------------------------------------------------ phases
    def _launch(self, slot: int) -> _Instance:
        inst = self.live[slot] = _Instance(slot=slot, instance=self._next_instance, started_s=float(self.env.now))
        self._next_instance += 1
        return inst

    def _ready(self, inst: _Instance) -> None:
        if self.live.get(inst.slot) is not inst:
            return  # cancelled while starting
        inst.ready_s = self.env.now
        self._publish_routable()

    def _stop(self, inst: _Instance) -> None:
        inst.stopped_s = self.env.now
        del self.live[inst.slot]
        self.spans.append(inst.span())
        if inst.ready_s is not None:
            self._retire(inst.slot)  # its engine served: drop it (cache, counters kept) for a fresh one

    def _publish_routable(self) -> None:
        slots = self.routable_slots()
        if not slots:
            raise RuntimeError(f"fleet at {self.env.now:g} s: no ready worker left to route to")
        self.cluster.router.set_workers(slots, tuple(self.live[s].instance for s in slots))

    # ------------------------------------------------------------------ results
    def result(self, end_s: float) -> FleetRecord:
        """The fleet's record up to `end_s` (live instances counted as running on to it)."""
        return FleetRecord(instances=tuple(sorted([*self.spans, *(i.span() for i in self.live.values())],
                                                  key=lambda s: s.instance)),
                           decisions=tuple(self.decisions), timeline=self.timeline, end_s=end_s,
                           provisioning_s=self.provisioning_s, cold_window_s=self.spec.cold_window_s)
