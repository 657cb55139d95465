"""A disaggregated cluster: a prefill pool and a decode pool behind a two-stage router, the KV moving between them.

A request's path (times are simulated; `hop` = router hop + router processing, `overhead` = the per-request
overhead (HTTP, tokenisation: paid once), `resp` = the response overhead):

    sent --hop + overhead--> prefill worker: queue, prefill (a request of 1 output token) --resp--> router: decode
         choice --hop--> decode worker: admitted (local hit), receives the rest of the prompt's KV over the link,
                  computes the last prompt token, samples the first token --resp--> client ... decode ... end

A request the router prefills locally (`PdChoice.prefill_worker` None) goes straight to its decode worker as in an
aggregated cluster. See docs/concepts/disaggregation.md for the rules and their upstream sources.

A cluster-shared KV store (`engine.shared_kv_bytes`) belongs to the prefill pool, as Dynamo deploys KVBM with
disaggregation (`examples/backends/vllm/launch/disagg_kvbm.sh`: prefill workers `--connector kvbm nixl`, decode
workers `--connector nixl`; `PdConnector`, `lib/bindings/kvbm/python/kvbm/vllm_integration/connector/
pd_connector.py`: the offloading connector looks up, loads and stores on the prefill worker, NIXL only serves the
decode worker's read). Decode workers neither read nor write it: their KV comes from the prefill worker.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import simpy

from sim.cluster.device import Device
from sim.cluster.reuse import ReuseLedger
from sim.cluster.tier_links import TierLinks
from sim.cluster.transfer_link import KvTransferLink, RemoteKv
from sim.cluster.worker import Worker
from sim.cluster.workers_view import WorkersView
from sim.engines.interface import ServedRequest
from sim.engines.registry import build_engine
from sim.results.records import RequestRecord, WorkerCounters
from sim.routing.interface import PdChoice, PdStage
from sim.scenario import Scenario, ScenarioError
from sim.timing.build import build_time_model
from sim.workloads.request import Request


class PoolView(WorkersView):
    """One pool's workers as a router's `ClusterView`: workers 0..n-1 of the pool (the cluster's `offset`..);
    cache queries are peeks; in-flight counts are the pool's; prefix states draw their event losses from streams
    named after the stage."""

    def __init__(self, env: simpy.Environment, stage: PdStage, workers: Sequence[Worker], *, block_size: int,
                 cache_num_blocks: int, seed: int) -> None:
        super().__init__(env, workers, block_size=block_size, cache_num_blocks=cache_num_blocks, seed=seed,
                         events_stream=f"{stage}-router-events")
        self.stage = stage


@dataclass(slots=True)
class _Pending:
    """A request on its way through the pools."""

    request: Request
    sent_s: float
    on_done: Callable[[RequestRecord], object]
    choice: PdChoice
    prefill: ServedRequest | None = None
    """The prefill worker's request (one output token), once it is done."""
    reuse: tuple[int, int] = (-1, -1)
    """(available, captured) tokens as the reuse ledger booked them at dispatch (-1: not booked)."""


class DisaggregatedCluster:
    """Routes each request through the two-stage router and its pools (module docstring); completes the sender's
    callback with the request's record, whose worker is the decode worker (the cluster's index) and whose
    `cached_tokens` is the hit of the worker that prefilled it (the prefill worker, or the decode worker for a
    local prefill). Same `send` / `counters` contract as `sim.cluster.cluster.Cluster`."""

    def __init__(self, env: simpy.Environment, scenario: Scenario, router, *, fast_forward: bool = True) -> None:
        pd = scenario.cluster.disaggregation
        if pd is None:
            raise ValueError("DisaggregatedCluster needs cluster.disaggregation")
        if not getattr(router, "disaggregated", False):
            raise ScenarioError(f"router {router.name!r} routes an aggregated cluster; a disaggregated one needs a "
                                f"disaggregated router (see `kvsim routers`)")
        self.env = env
        self.router = router
        self.num_prefill_workers = pd.prefill.workers
        kv_bytes_per_token = scenario.model.kv_bytes_per_token
        # NOTE: layer-wise, the prefill has streamed all but the last layer's KV by the time the decode side asks.
        self._kv_bytes_per_token = (kv_bytes_per_token / scenario.model.architecture.num_hidden_layers
                                    if pd.link.layerwise else kv_bytes_per_token)
        # NOTE: the request overhead (HTTP, tokenisation) is paid once, on the way in; the hop from the router to the
        # decode worker after a remote prefill carries an already tokenised request (Dynamo's request plane).
        self._decode_hop_s = scenario.cluster.router_hop_s + getattr(router, "processing_s", 0.0)
        self._hop_s = self._decode_hop_s + scenario.cluster.request_overhead_s
        self._response_delay_s = scenario.cluster.response_overhead_s
        self.devices: list[Device] = []
        self.workers: list[Worker] = []
        self.links: list[KvTransferLink | None] = []
        engines = {stage: scenario.pool_engine(stage) for stage in ("prefill", "decode")}
        # NOTE: the store is the prefill pool's (module docstring); the decode workers' engines have none.
        if getattr(engines["decode"], "shared_kv_bytes", 0):
            engines["decode"] = engines["decode"].model_copy(update={"shared_kv_bytes": 0})
        tiers = {stage: TierLinks(scenario, spec) for stage, spec in engines.items()}
        for dev in scenario.cluster.devices():
            stage = pd.pool_of(len(self.workers))
            device = Device.of_spec(env, dev, seed=scenario.seed + len(self.devices))
            self.devices.append(device)
            time_model = build_time_model(scenario.device_time_model(dev), scenario.model)
            prefill = stage == "prefill"
            host_link, shared_tier = tiers[stage].host_link(dev), tiers[stage].shared_tier(dev)
            engine = build_engine(engines[stage], kv_bytes_per_token=kv_bytes_per_token, host_link=host_link,
                                  shared_tier=shared_tier)
            self.workers.append(Worker(
                env, len(self.workers), engine, device, time_model,
                on_first_token=self._prefill_done if prefill else self._first_token,
                on_finished=self._ignore if prefill else self._finished, fast_forward=fast_forward))
            link = pd.link
            self.links.append(None if prefill else KvTransferLink(
                bandwidth_bytes_per_s=link.bandwidth_bytes_per_s, latency_s=link.latency_s,
                overhead_s=link.overhead_s))
        P = self.num_prefill_workers
        self.prefill_view = PoolView(env, "prefill", self.workers[:P], block_size=scenario.engine.block_size,
                                     cache_num_blocks=engines["prefill"].num_blocks(kv_bytes_per_token),
                                     seed=scenario.seed)
        self.decode_view = PoolView(env, "decode", self.workers[P:], block_size=scenario.engine.block_size,
                                    cache_num_blocks=engines["decode"].num_blocks(kv_bytes_per_token),
                                    seed=scenario.seed)
        self._pending: dict[int, _Pending] = {}
        # NOTE: the reuse captured is booked on the worker that prefills (whose cache gives the hit).
        self._ledger = (ReuseLedger(len(self.workers), scenario.engine.block_size)
                        if scenario.cluster.reuse_breakdown else None)
        try:
            router.bind(self.prefill_view, self.decode_view)
        except ValueError as err:
            raise ScenarioError(f"router.options ({router.name}): {err}") from None

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    # ------------------------------------------------------------------ requests
    def send(self, request: Request, on_done: Callable[[RequestRecord], object] | None = None) -> simpy.Event | None:
        """Route `request` now; its record goes to `on_done` (or becomes the returned event's value)."""
        done = None
        if on_done is None:
            done = self.env.event()
            on_done = done.succeed
        choice = self.router.route_pd(request, self.prefill_view, self.decode_view)
        self._check(choice)
        pending = self._pending[request.request_id] = _Pending(request, self.env.now, on_done, choice)
        # NOTE: the prefill worker runs the prompt as a request of one output token (vLLM max_tokens=1 with
        # do_remote_decode; Dynamo's mocker build_prefill_request): what it leaves cached is that request's.
        prefill_request = request if choice.prefill_worker is None else replace(request, output_tokens=1)
        ledger = self._ledger
        if ledger is not None:
            worker = (self.num_prefill_workers + choice.decode_worker if choice.prefill_worker is None
                      else choice.prefill_worker)
            pending.reuse = ledger.book(prefill_request, worker)
        if choice.prefill_worker is None:
            self._dispatch_decode(pending, choice.decode_worker, remote=False)
            return done
        p = choice.prefill_worker
        self.router.on_dispatch(request, p, "prefill")
        self.prefill_view.dispatched(p, 1)
        target = self.workers[p]
        arrival_s = self.env.now + self._hop_s
        self._after(self._hop_s, lambda: target.submit_remote_decode(prefill_request, arrival_s))
        return done

    def _check(self, choice: PdChoice) -> None:
        for worker, view in ((choice.prefill_worker, self.prefill_view), (choice.decode_worker, self.decode_view)):
            if worker is not None and not 0 <= worker < view.num_workers:
                raise RuntimeError(f"router {self.router.name!r} chose {view.stage} worker {worker}; valid: "
                                   f"0..{view.num_workers - 1}")

    def _dispatch_decode(self, pending: _Pending, d: int, *, remote: bool) -> None:
        request = pending.request
        self.router.on_dispatch(request, d, "decode")
        self.decode_view.dispatched(d, 1)
        index = self.num_prefill_workers + d
        target = self.workers[index]
        if not remote:
            arrival_s = self.env.now + self._hop_s
            self._after(self._hop_s, lambda: target.submit(request, arrival_s))
            return
        arrival_s = self.env.now + self._decode_hop_s
        prefill = pending.prefill
        source = RemoteKv(self.links[index], self._kv_bytes_per_token, prefill.worker,
                          on_read=lambda done_s: self._after(done_s - self.env.now, lambda: self._release(prefill)))
        self._after(self._decode_hop_s, lambda: target.submit_remote(request, arrival_s, source))

    def _after(self, delay_s: float, action) -> None:
        if delay_s > 0:
            self.env.timeout(delay_s).callbacks.append(lambda _event: action())
        else:
            action()

    def _ignore(self, state: ServedRequest) -> None:
        pass  # a prefill request finishes with its first (and only) token: handled there

    def _prefill_done(self, state: ServedRequest) -> None:
        # NOTE: the prefill's response (its KV transfer parameters) reaches the router `response_overhead_s` later.
        self._after(self._response_delay_s, lambda: self._to_decode(state))

    def _to_decode(self, state: ServedRequest) -> None:
        request = state.request
        pending = self._pending[request.request_id]
        pending.prefill = state
        p = state.worker
        self.prefill_view.dispatched(p, -1)
        self.router.on_complete(pending.request, p, "prefill")
        d = pending.choice.decode_worker
        if d is None:
            d = self.router.route_decode(pending.request, self.decode_view, prefill_worker=p)
            self._check(PdChoice(p, d))
        self._dispatch_decode(pending, d, remote=True)

    def _release(self, prefill: ServedRequest) -> None:
        # NOTE: the decode side's completion notice reaches the prefill worker when the read is done (NIXL's
        # notification; its latency is in the link's).
        self.workers[prefill.worker].release_remote_decode(prefill)

    def _first_token(self, state: ServedRequest) -> None:
        d = state.worker - self.num_prefill_workers
        self._after(self._response_delay_s, lambda: self.router.on_first_token(state.request, d, "decode"))

    def _finished(self, state: ServedRequest) -> None:
        self._after(self._response_delay_s, lambda: self._complete(state))

    def _complete(self, state: ServedRequest) -> None:
        d = state.worker - self.num_prefill_workers
        self.decode_view.dispatched(d, -1)
        pending = self._pending.pop(state.request.request_id)
        self.router.on_complete(pending.request, d, "decode")
        record = RequestRecord.from_state(state, pending.sent_s, response_delay_s=self._response_delay_s,
                                          routing=(*pending.reuse, -1, -1))
        pending.on_done(pd_record(record, state, pending.prefill))

    # ------------------------------------------------------------------ counters
    def counters(self) -> tuple[WorkerCounters, ...]:
        for w in self.workers:
            w.sync()
        return tuple(WorkerCounters.of(w.index, w.device.name, w.engine.counters(), steps=w.num_steps)
                     for w in self.workers)


def pd_record(record: RequestRecord, decode: ServedRequest, prefill: ServedRequest | None) -> RequestRecord:
    """`record` (built from the decode worker's request) with the P/D fields; for a remote prefill the hit and the
    TTFT split are the prefill worker's, and so are its tier hits and load time (a tier the prefill worker loaded
    from: its host tier or the prefill pool's shared store):

        sent | hop | prefill queue | prefill | resp + hop | decode queue | transfer | last token | resp
             ^ prefill arrival     ^admitted ^ prefill first token        ^ decode arrival   ^ ttft
    ttft_queue_s = prefill queue + decode queue (decode arrival to the transfer's start); ttft_prefill_s = prefill
    (admission to its first token); ttft_transfer_s = the transfer; the rest of the TTFT is hops, overheads and the
    decode worker's step that computes the last prompt token.
    """
    if prefill is None:
        queue = decode.admitted_s - decode.arrival_s
        return replace(record, pd_prefill_worker=decode.worker, ttft_queue_s=queue,
                       ttft_prefill_s=decode.first_token_s - decode.admitted_s, ttft_transfer_s=0.0)
    assert prefill.admitted_s is not None and prefill.first_token_s is not None
    start, end = decode.remote_kv_start_s, decode.remote_kv_done_s
    transfer = 0.0 if start is None else end - start
    decode_queue = (decode.admitted_s if start is None else start) - decode.arrival_s
    return replace(record, cached_tokens=prefill.num_cached_tokens, cpu_cached_tokens=prefill.num_cpu_hit_tokens,
                   shared_cached_tokens=prefill.num_shared_hit_tokens, tier_load_s=prefill.tier_load_s,
                   pd_prefill_worker=prefill.worker, transfer_tokens=decode.num_remote_kv_tokens,
                   ttft_queue_s=(prefill.admitted_s - prefill.arrival_s) + decode_queue,
                   ttft_prefill_s=prefill.first_token_s - prefill.admitted_s, ttft_transfer_s=transfer)
