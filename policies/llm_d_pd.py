"""llm-d's prefill/decode disaggregation: the EPP's `disagg-profile-handler` (formerly `pd-profile-handler`) with a
prefill decider, a decode profile and a prefill profile, each profile an llm-d scheduling profile (`policies.llm_d`).

Sources read (rules in docs/routers/rules.md, "llm-d P/D"): `llm-d/llm-d-router`
`pkg/epp/framework/plugins/scheduling/profilehandler/disagg/` (`disagg_profile_handler.go` `Pick`,
`prefix_based_pd_decider.go` `computeNeedsRemotePrefill`, `always_disagg_pd_decider.go`, README.md),
`pkg/epp/framework/plugins/requestcontrol/dataproducer/inflightload/producer.go` (`PreRequest`, `ResponseBody`);
the older `llm-d/llm-d-inference-scheduler` `pkg/plugins/profile/pd_profile_handler.go` and
`prefix_based_pd_decider.go` @06c08c0; the guide `llm-d/llm-d` `guides/pd-disaggregation/router/
pd-disaggregation.values.yaml` @83bb7c1 (the defaults here).

Per request, when it reaches the EPP:

    d = decode profile over the decode pool                       # always first
    if decider(request, d):                                       # always-disagg-pd-decider: true
        p = prefill profile over the prefill pool                 # prefix-based-pd-decider: below
        -> prefill on p (max_tokens 1, x-prefiller-host-port), KV to d, decode on d
    else:
        -> d prefills and decodes (decode-only)

    prefix-based-pd-decider (llm-d-router HEAD), n = prompt tokens, hit = CachedBlockCount(d) x G of the
    approximate prefix producer (the EPP's own routing history, G-token blocks) on the chosen decode pod:
        nonCachedTokens == 0            -> false (the decider is disabled: decode-only)
        promptTokens > 0 and n < promptTokens -> false
        n < nonCachedTokens             -> false
        else                            -> n - hit >= nonCachedTokens

Both choices are made at arrival (one scheduling cycle), so the decode pod's in-flight counts start then. In-flight
accounting (inflight-load-producer), per profile target: +1 request and the target's uncached prompt tokens at
dispatch; at the first response chunk the prefill target's entry is released whole and the decode target's tokens;
the decode target's request at the response's end. The approximate producer records the decode target at dispatch
(and the prefill target: the prefill profile's own index here).
NOTE: upstream one approximate producer indexes every pod; here each pool's profile keeps its own index (the
prefill profile's, and the decider's over the decode pool). A match walk stops at the first key no pod of *the
pool* holds, where upstream it stops at the first key no pod at all holds: they differ only for a decode pod that
holds a later block of a prefix and not an earlier one.
NOTE: the older inference-scheduler decider took nonCachedTokens <= 0 as "always disaggregate" and estimated the
prompt as characters / 4; decider=always gives the former.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from policies.disaggregated import PdRouterBase, PdRouterOptions
from policies.llm_d_approx import ApproxPrefixIndex
from sim.routing.interface import ClusterView, PdChoice, PdStage
from sim.workloads.request import Request

GUIDE_PREFILL: dict[str, Any] = {
    "prefix_cache_weight": 0.0, "queue_weight": 0.0, "kv_cache_utilization_weight": 0.0,
    "affinity_filter": True, "affinity_threshold": 0.80, "peak_prefill_throughput_tokens_per_s": 33821.0,
    "token_load_weight": 1.0, "max_prefix_tokens_to_match": 131072}
"""The guide's prefill profile: prefill-filter, prefix-cache-affinity-filter (peakPrefillThroughput 33821),
token-load-scorer."""

GUIDE_DECODE: dict[str, Any] = {
    "prefix_cache_weight": 0.0, "queue_weight": 0.0, "kv_cache_utilization_weight": 0.0, "active_request_weight": 1.0}
"""The guide's decode profile: decode-filter, active-request-scorer."""


class LlmdPdOptions(PdRouterOptions):
    decider: Literal["always", "prefix"] = Field("always", description="Prefill decider: always-disagg-pd-decider (the guide's) or prefix-based-pd-decider.")
    non_cached_tokens: int = Field(0, ge=0, description="prefix-based-pd-decider nonCachedTokens: remote prefill only if the prompt minus the decode pod's cached prefix is at least this (0 disables the decider: decode-only).")
    prompt_tokens: int = Field(0, ge=0, description="prefix-based-pd-decider promptTokens: prompts shorter than this are never disaggregated (0: no gate).")
    prefill_options: dict[str, Any] = Field(default_factory=lambda: dict(GUIDE_PREFILL), description="llm-d options of the prefill profile (default: the P/D guide's prefill profile).")
    decode_options: dict[str, Any] = Field(default_factory=lambda: dict(GUIDE_DECODE), description="llm-d options of the decode profile (default: the P/D guide's decode profile).")


class LlmdPdRouter(PdRouterBase):
    """llm-d's disagg-profile-handler (module docstring): the decode profile first, the prefill decider on the chosen
    decode pod, then the prefill profile; both pods booked at arrival."""

    name = "llm-d-pd"
    summary = "llm-d P/D: the decode profile first, a prefill decider (always / prefix) on its pod, then prefill"
    Options = LlmdPdOptions

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        opts = self.options
        self.prefill = self.stage_router("prefill", "llm-d", opts.prefill_options)
        self.decode = self.stage_router("decode", "llm-d", opts.decode_options)
        self._decider_index: ApproxPrefixIndex | None = None
        self._prefill_of: dict[int, int] = {}
        """Requests prefilled remotely whose prefill pod's in-flight entry is still held: request id -> pod."""

    def bind(self, prefill: ClusterView, decode: ClusterView) -> None:
        super().bind(prefill, decode)
        if self.options.decider == "prefix":
            # the approximate producer over the decode pool, configured as the decode profile's options say
            self._decider_index = ApproxPrefixIndex.for_options(decode, self.decode.options)

    # ------------------------------------------------------------------ decision
    def disaggregate(self, request: Request, decode_worker: int) -> bool:
        """The prefill decider on the chosen decode pod (module docstring)."""
        o = self.options
        if o.decider == "always":
            return True
        n = request.prompt_tokens
        if o.non_cached_tokens == 0 or (o.prompt_tokens > 0 and n < o.prompt_tokens) or n < o.non_cached_tokens:
            return False
        index = self._decider_index
        matched, _ = index.match_blocks(request)
        return n - matched[decode_worker] * index.tokens_per_key >= o.non_cached_tokens

    def route_pd(self, request: Request, prefill: ClusterView, decode: ClusterView) -> PdChoice:
        d = self.decode.route(request, decode)
        remote = self.disaggregate(request, d)
        # NOTE: one scheduling cycle picks both pods; the decode pod's entries (in-flight, prefix record) start at
        # this dispatch, not when the prefill is done.
        self.decode.on_dispatch(request, d)
        if self._decider_index is not None:
            self._decider_index.record(request, d)
        if not remote:
            return PdChoice(prefill_worker=None, decode_worker=d)
        return PdChoice(prefill_worker=self.prefill.route(request, prefill), decode_worker=d)

    # ------------------------------------------------------------------ hooks
    def on_dispatch(self, request: Request, worker: int, stage: PdStage) -> None:
        if stage == "prefill":
            self.prefill.on_dispatch(request, worker)
            self._prefill_of[request.request_id] = worker
        # the decode pod was booked in route_pd

    def on_first_token(self, request: Request, worker: int, stage: PdStage) -> None:
        # the first response chunk: the prefill pod's entry goes whole, the decode pod's tokens
        self._release_prefill(request)
        self.decode.on_first_token(request, worker)

    def on_complete(self, request: Request, worker: int, stage: PdStage) -> None:
        if stage == "prefill":
            return  # held until the response's first chunk reaches the EPP
        self._release_prefill(request)  # a response that ended without a first chunk
        self.decode.on_complete(request, worker)

    def _release_prefill(self, request: Request) -> None:
        p = self._prefill_of.pop(request.request_id, None)
        if p is not None:
            self.prefill.on_first_token(request, p)
            self.prefill.on_complete(request, p)
