"""The cluster: devices, the workers on them, and the router in front; requests in, records out."""

from __future__ import annotations

from collections.abc import Callable

import simpy

from sim.cluster.device import Device
from sim.cluster.network_link import NetworkLinkQueue
from sim.cluster.reuse import ReuseLedger
from sim.cluster.tier_links import TierLinks
from sim.cluster.worker import Worker
from sim.cluster.workers_view import WorkersView
from sim.engines.interface import ServedRequest
from sim.engines.registry import bind_peer_fetch, build_engine
from sim.results.records import RequestRecord, WorkerCounters
from sim.routing.interface import Router
from sim.scenario import Scenario, ScenarioError
from sim.timing.build import build_time_model
from sim.workloads.request import Request, computed_block_hashes


class Cluster(WorkersView):
    """Routes each request as it is sent, delivers it to its worker after the router hop and the per-request
    overhead, and completes the sender's event with the request's record when its last token is out.

    Also the router's `ClusterView` over all its workers (`WorkersView`). Each worker runs the scenario's engine
    (`engine.kind`), built from the engine registry; the cluster knows it only through the engine interface. At
    dispatch the cluster also books the request's reuse available and captured (`ReuseLedger`) and, for a router
    with non-exact state, what it believed of the chosen worker against what the worker held (the view error).
    """

    def __init__(self, env: simpy.Environment, scenario: Scenario, router: Router, *, fast_forward: bool = True) -> None:
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
        nics = []  # each worker's device NIC, for G2 peer fetch
        tiers = TierLinks(scenario, scenario.engine)
        for dev in scenario.cluster.devices():
            device = Device(env, dev.name, speed=dev.speed, sharing_efficiency=dev.sharing_efficiency,
                            num_workers=dev.workers, cores=dev.cores)
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
                engine = build_engine(scenario.engine, kv_bytes_per_token=scenario.model.kv_bytes_per_token,
                                      host_link=link, shared_tier=shared_tier)
                worker = Worker(
                    env, len(self.workers), engine, device, time_model,
                    on_first_token=self._first_token, on_finished=self._finished, fast_forward=fast_forward,
                )
                self.workers.append(worker)
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
        self.dispatched(worker, 1)
        ledger = self._ledger
        available, captured = (-1, -1) if ledger is None else ledger.dispatch(
            computed_block_hashes(request, ledger.block_size), request.prompt_tokens, worker)
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
            self._ledger.dispatch(computed_block_hashes(request, self._ledger.block_size), request.prompt_tokens,
                                  worker)

    def _after(self, delay_s: float, action) -> None:
        if delay_s > 0:
            self.env.timeout(delay_s).callbacks.append(lambda _event: action())
        else:
            action()

    # NOTE: the client and the router see a token `response_overhead_s` after the engine emits it.
    def _first_token(self, state: ServedRequest) -> None:
        self._after(self._response_delay_s, lambda: self.router.on_first_token(state.request, state.worker))

    def _finished(self, state: ServedRequest) -> None:
        self._after(self._response_delay_s, lambda: self._complete(state))

    def _complete(self, state: ServedRequest) -> None:
        self._in_flight[state.worker] -= 1
        self.router.on_complete(state.request, state.worker)
        sent_s, on_done, routing = self._pending.pop(state.request.request_id)
        on_done(RequestRecord.from_state(state, sent_s, response_delay_s=self._response_delay_s, routing=routing))

    # ------------------------------------------------------------------ counters
    def counters(self) -> tuple[WorkerCounters, ...]:
        for w in self.workers:
            w.sync()
        return tuple(WorkerCounters.of(w.index, w.device.name, w.engine.counters(), steps=w.num_steps)
                     for w in self.workers)
