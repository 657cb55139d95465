"""The cluster: devices, the workers on them, and the router in front; requests in, records out."""

from __future__ import annotations

from collections.abc import Callable

import simpy

from sim.cluster.device import Device
from sim.cluster.fleet import Fleet
from sim.cluster.network_link import NetworkLinkQueue
from sim.cluster.reuse import ReuseLedger
from sim.cluster.tier_links import TierLinks
from sim.cluster.worker import Worker
from sim.cluster.workers_view import WorkersView
from sim.engines.interface import CacheEvent, ServedRequest
from sim.engines.registry import bind_peer_fetch, build_engine
from sim.results.records import RequestRecord, WorkerCounters
from sim.routing.interface import Router
from sim.scaling import Autoscaler
from sim.scenario import Scenario, ScenarioError
from sim.timing.build import build_time_model
from sim.workloads.request import Request


class Cluster(WorkersView):
    """Routes each request as it is sent, delivers it to its worker after the router hop and the per-request
    overhead, and completes the sender's event with the request's record when its last token is out.

    Also the router's `ClusterView` over all its workers (`WorkersView`). Each worker runs the scenario's engine
    (`engine.kind`), built from the engine registry; the cluster knows it only through the engine interface. At
    dispatch the cluster also books the request's reuse available and captured (`ReuseLedger`) and, for a router
    with non-exact state, what it believed of the chosen worker against what the worker held (the view error).

    With `cluster.autoscaling` (and the `autoscaler` the composition root built for it) the workers are the slots
    of an elastic fleet (`sim.cluster.fleet.Fleet`, `fleet`): only its ready workers are routed to, and a slot's
    worker is replaced by a fresh one (`retire`) when its instance stops.
    """

    def __init__(self, env: simpy.Environment, scenario: Scenario, router: Router, *, fast_forward: bool = True,
                 autoscaler: Autoscaler | None = None) -> None:
        if (autoscaler is None) != (scenario.cluster.autoscaling is None):
            raise ValueError("Cluster: an autoscaler goes with cluster.autoscaling, and only with it")
        self.env = env
        self.router = router
        self._seed = scenario.seed
        self._block_size = scenario.engine.block_size
        # NOTE: every worker runs the scenario's one engine spec, so all report the same block count.
        self._cache_num_blocks = scenario.engine.num_blocks(scenario.model.kv_bytes_per_token)
        self._delivery_delay_s = (scenario.cluster.router_hop_s + getattr(router, "processing_s", 0.0)
                                  + scenario.cluster.request_overhead_s)
        self._response_delay_s = scenario.cluster.response_overhead_s
        self.devices: list[Device] = []
        self.workers: list[Worker] = []
        self._new_workers: list[Callable[[int], Worker]] = []  # per slot: a fresh worker (an autoscaled slot's next)
        nics = []  # each worker's device NIC, for G2 peer fetch
        tiers = TierLinks(scenario, scenario.engine)
        for dev in scenario.cluster.devices():
            device = Device.of_spec(env, dev, seed=scenario.seed + len(self.devices))
            time_model = build_time_model(scenario.device_time_model(dev), scenario.model)
            self.devices.append(device)
            # NOTE: the workers sharing a device share its links.
            link, shared_tier = tiers.host_link(dev), tiers.shared_tier(dev)
            nic = None
            if scenario.peer_fetch:
                bandwidth, latency, overhead = scenario.device_shared_link(dev)
                nic = NetworkLinkQueue(bandwidth_bytes_per_s=bandwidth, latency_s=latency, overhead_s=overhead)
            for _ in range(dev.workers):
                nics.append(nic)

                def new_worker(index: int, device=device, time_model=time_model, link=link,
                               shared_tier=shared_tier) -> Worker:
                    engine = build_engine(scenario.engine, kv_bytes_per_token=scenario.model.kv_bytes_per_token,
                                          host_link=link, shared_tier=shared_tier)
                    return Worker(env, index, engine, device, time_model, on_first_token=self._first_token,
                                  on_finished=self._finished, fast_forward=fast_forward)

                self._new_workers.append(new_worker)
                self.workers.append(new_worker(len(self.workers)))
        if scenario.peer_fetch:
            bind_peer_fetch([w.engine for w in self.workers], nics)
        WorkersView.__init__(self, env, self.workers, block_size=self._block_size,
                             cache_num_blocks=self._cache_num_blocks, seed=self._seed)
        self._pending: dict[int, tuple[float, Callable[[RequestRecord], object], tuple[int, int, int, int]]] = {}
        self._ledger = ReuseLedger(len(self.workers), self._block_size) if scenario.cluster.reuse_breakdown else None
        try:
            router.bind(self)
        except ValueError as err:  # options that only the cluster's shape can check (block sizes, worker counts)
            raise ScenarioError(f"router.options ({router.name}): {err}") from None
        self.fleet: Fleet | None = None
        self._retired: dict[int, WorkerCounters] = {}
        if autoscaler is not None:
            spec = scenario.cluster.autoscaling
            self.fleet = Fleet(env, self, spec, autoscaler, provisioning_s=spec.provisioning_s(scenario.model),
                               slo=scenario.slo.to_slo(), retire=self.retire)

    # ------------------------------------------------------------------ requests
    def send(self, request: Request, on_done: Callable[[RequestRecord], object] | None = None) -> simpy.Event | None:
        """Route and dispatch `request` now. Its `RequestRecord` goes to `on_done` when the response ends or, without
        `on_done`, becomes the value of the returned event (for senders that wait on it)."""
        done = None
        if on_done is None:
            done = self.env.event()
            on_done = done.succeed
        self.dispatch(request, self.route(request), on_done)
        return done

    def route(self, request: Request) -> int:
        """Ask the router for `request`'s worker (and tell it the request is dispatched there)."""
        worker = self.router.route(request, self)
        if not 0 <= worker < len(self.workers):
            raise RuntimeError(f"router {self.router.name!r} chose worker {worker}; valid: 0..{len(self.workers) - 1}")
        self.router.on_dispatch(request, worker)
        return worker

    def dispatch(self, request: Request, worker: int, on_done: Callable[[RequestRecord], object]) -> None:
        """Send `request` to `worker` now: it reaches the engine after the router hop and the per-request overhead."""
        env = self.env
        if self.fleet is not None:
            self.fleet.dispatched(request, worker)
        self.dispatched(worker, 1)
        ledger = self._ledger
        available, captured = (-1, -1) if ledger is None else ledger.book(request, worker)
        believed = self.router.believed_prefix_tokens(request)
        held = -1 if believed is None else self.cached_prefix_tokens(worker, request)
        self._pending[request.request_id] = (env.now, on_done, (available, captured,
                                                                -1 if believed is None else believed, held))
        arrival_s = env.now + self._delivery_delay_s
        target = self.workers[worker]
        self._after(self._delivery_delay_s, lambda: target.submit(request, arrival_s))

    def book_elsewhere(self, request: Request, worker: int) -> None:
        """`request` went to a worker another process simulates (a split replay): book its reuse history only, so
        that every process's reuse available is over the whole stream."""
        if self._ledger is not None:
            self._ledger.book(request, worker)

    def _after(self, delay_s: float, action) -> None:
        if delay_s > 0:
            self.env.timeout(delay_s).callbacks.append(lambda _event: action())
        else:
            action()

    # NOTE: the client and the router see a token `response_overhead_s` after the engine emits it.
    def _first_token(self, state: ServedRequest) -> None:
        self._after(self._response_delay_s, lambda: self._first_token_out(state))

    def _first_token_out(self, state: ServedRequest) -> None:
        self.router.on_first_token(state.request, state.worker)
        if self.fleet is not None:
            self.fleet.first_token(state)

    def _finished(self, state: ServedRequest) -> None:
        self._after(self._response_delay_s, lambda: self._complete(state))

    def _complete(self, state: ServedRequest) -> None:
        self._in_flight[state.worker] -= 1
        self.router.on_complete(state.request, state.worker)
        sent_s, on_done, routing = self._pending.pop(state.request.request_id)
        record = RequestRecord.from_state(state, sent_s, response_delay_s=self._response_delay_s, routing=routing)
        on_done(record)
        if self.fleet is not None:
            self.fleet.completed(record)

    # ------------------------------------------------------------------ counters
    def counters(self) -> tuple[WorkerCounters, ...]:
        """Each worker's counters; an autoscaled slot's are those of every engine it has run (`retire`)."""
        return tuple(self._counters_of(w) for w in self.workers)

    def _counters_of(self, w: Worker) -> WorkerCounters:
        w.sync()
        counters = WorkerCounters.of(w.index, w.device.name, w.engine.counters(), steps=w.num_steps)
        retired = self._retired.get(w.index)
        return counters if retired is None else retired.plus(counters)

    # ------------------------------------------------------------------ an autoscaled slot
    def retire(self, slot: int) -> None:
        """The instance in `slot` stopped: keep its engine's counters, drop the engine (and its cache) for a fresh
        one, and tell the slot's KV event subscribers that its cache is gone (a `cleared` event, vLLM
        `AllBlocksCleared`)."""
        self._retired[slot] = self._counters_of(self.workers[slot])
        worker = self.workers[slot] = self._new_workers[slot](slot)
        listeners = self.cache_listeners(slot)
        for listener in listeners:
            listener([CacheEvent("cleared")], self.env.now)
        for listener in listeners:
            worker.engine.cache.subscribe(listener)
        subscribe_tiers = getattr(worker.engine, "subscribe_tiers", None)
        for listener in self.tier_listeners(slot):
            subscribe_tiers(listener)
