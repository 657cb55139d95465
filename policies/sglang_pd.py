"""SGLang Model Gateway's PD router (`--pd-disaggregation`): a prefill policy over the prefill pool and a decode
policy over the decode pool, both picked per request at arrival; every request is prefilled remotely.

Sources read (rules in docs/routers/rules.md, "SGLang PD router"): `sgl-project/sglang`
`sgl-model-gateway/src/routers/http/pd_router/selection.rs` @03744db (`select_pd_pair`,
`pick_worker_by_policy_arc`), `pd_router/dispatch.rs` @03744db (`execute_dual_dispatch_internal`: both requests sent
at once, the bootstrap room from the prefill worker; `WorkerLoadGuard` on both workers), `pd_router.rs`
(`create_streaming_response`: both guards attached to the response body), the router factory `create_pd_router`
(`--prefill-policy` / `--decode-policy`, else `--policy`, default `cache_aware`: a separate instance per pool) and
`policies/registry.rs` (`get_prefill_policy`, `get_decode_policy`).

Per request:

    p = prefill_policy.select(prefill workers, request text)     # first
    d = decode_policy.select(decode workers, request text)       # then; both at arrival, independently
    send the request to p and to d together (d waits for p's KV: SGLang's bootstrap handshake)

A policy's load is the gateway's per-worker in-flight count, which the PD router holds on *both* workers of the pair:
non-streaming from dispatch to the response's end (the guards live for the whole call); streaming (`stream=true`)
from the prefill's response to the end of the decode stream (the guards are attached to the stream). A
cache-aware policy inserts the request into its pool's tree when it selects, in both cases.
Not modelled: the rendezvous gate of the newest dispatch (one pair's prefill handshake at a time), retries on
another pair, DP-rank injection, the circuit breakers.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from policies.disaggregated import PdRouterBase, PdRouterOptions
from sim.routing.interface import ClusterView, PdChoice, PdStage, Router
from sim.workloads.request import Request


class SglangPdOptions(PdRouterOptions):
    prefill_policy: str = Field("sglang-cache-aware", description="Router over the prefill pool (--prefill-policy; default --policy cache_aware = sglang-cache-aware; round_robin = round-robin, random, power_of_two = p2c).")
    prefill_options: dict[str, Any] = Field(default_factory=dict, description="Options of prefill_policy.")
    decode_policy: str = Field("sglang-cache-aware", description="Router over the decode pool (--decode-policy; default --policy cache_aware).")
    decode_options: dict[str, Any] = Field(default_factory=dict, description="Options of decode_policy.")
    stream: bool = Field(True, description="Clients stream (the worker loads count from the prefill's response to the stream's end); false: from dispatch to the response's end.")


class SglangPdRouter(PdRouterBase):
    """SGLang's PD router (module docstring): independent prefill and decode policies, both at arrival."""

    name = "sglang-pd"
    summary = "SGLang PD router: --prefill-policy and --decode-policy (cache_aware each), both picked at arrival"
    Options = SglangPdOptions

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        opts = self.options
        self.prefill = self.stage_router("prefill", opts.prefill_policy, opts.prefill_options)
        self.decode = self.stage_router("decode", opts.decode_policy, opts.decode_options)
        self._pairs: dict[int, tuple[int, int]] = {}
        """Requests in flight: request id -> (prefill worker, decode worker)."""

    def route_pd(self, request: Request, prefill: ClusterView, decode: ClusterView) -> PdChoice:
        p = self.prefill.route(request, prefill)
        d = self.decode.route(request, decode)
        # NOTE: a policy records its choice (a cache-aware tree insert) when it selects; both loads are booked here
        # and, for a streaming client, taken off again until the prefill's response is back.
        self.prefill.on_dispatch(request, p)
        self.decode.on_dispatch(request, d)
        if self.options.stream:
            _hold(self.prefill, request, p, -1)
            _hold(self.decode, request, d, -1)
        self._pairs[request.request_id] = (p, d)
        return PdChoice(prefill_worker=p, decode_worker=d)

    def on_dispatch(self, request: Request, worker: int, stage: PdStage) -> None:
        pass  # booked in route_pd

    def on_complete(self, request: Request, worker: int, stage: PdStage) -> None:
        p, d = self._pairs[request.request_id]
        if stage == "prefill":
            if self.options.stream:
                _hold(self.prefill, request, p, +1)  # the stream starts: both guards from now to its end
                _hold(self.decode, request, d, +1)
            return
        del self._pairs[request.request_id]
        self.prefill.on_complete(request, p)
        self.decode.on_complete(request, d)


def _hold(router: Router, request: Request, worker: int, sign: int) -> None:
    """Add (`sign` +1) or take off (-1) `request`'s share of `worker`'s in-flight load in `router` (the counts
    `policies.base.RouterBase` keeps), without touching what the router recorded of the request."""
    router.in_flight[worker] += sign
    router.in_flight_tokens[worker] += sign * request.prompt_tokens
