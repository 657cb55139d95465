"""NVIDIA Dynamo's disaggregated routing: the frontend's `PrefillRouter` in front of a prefill pool and a decode pool.

Sources read (`ai-dynamo/dynamo`; rules in docs/routers/rules.md, "Dynamo disaggregated"):
`lib/llm/src/kv_router/prefill_router/conditional_bypass.rs` @07a6c9c
(`select_decode_worker_for_conditional_disagg`, `decode_gate_allows_bypass`), `lib/kv-router/src/conditional_disagg.rs`
@088ca50 (`IslBoundingPolicy`, `ConditionalDisaggDecisionInput::net_new_tokens`, defaults 2048 and 0.7), and the
mocker's disaggregated replay `lib/mocker/src/replay/offline/disagg.rs` @02e4b1e (`derive_prefill_router_config`,
`derive_decode_router_config`, `build_prefill_request`, `enqueue_decode_after_handoff`).

    1. conditional disaggregation (off by default): peek the decode pool's KV router for the worker d it would
       pick, with its device overlap o_d blocks (no admission, no booking);
           eff_isl = prompt_tokens - o_d * B,  ratio = eff_isl / max(prompt_tokens, 1)
           bypass  = eff_isl < eff_isl_threshold and ratio < eff_isl_ratio_threshold
       bypass: the request goes to d as an aggregated request (prefilled locally there).
    2. otherwise the prefill pool's KV router (Dynamo's cost, `kv-aware`) picks the prefill worker; the prompt
       runs there with max_tokens = 1; when its response is back the decode pool's router picks the decode
       worker. The two routers are `kv-aware` with Dynamo's derived configs (`composition_disagg.rs`): prefill
       `router_track_active_blocks = false` (cost = prefill_load_scale x max(active prefill blocks + request
       blocks - overlap, 0)), decode `overlap_score_credit = 0`, `router_assume_kv_reuse = false` (cost = active
       blocks + the request's blocks: load only, cache-blind).
Not modelled: the decode-busy gate (`conditional_disagg_decode_busy_threshold`, off by default), the prefill-load
policies (`PrefillLoad`, `IslOrLoad`), router queueing, session pins.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from policies.disaggregated import PdRouterBase, PdRouterOptions
from sim.routing.interface import ClusterView, PdChoice
from sim.workloads.request import Request


class DynamoDisaggOptions(PdRouterOptions):
    prefill_options: dict[str, Any] = Field(default_factory=lambda: {"router_track_active_blocks": False}, description="kv-aware options of the prefill pool's KV router (Dynamo's derive_prefill_router_config: router_track_active_blocks false, the prefill term alone).")
    decode_options: dict[str, Any] = Field(default_factory=lambda: {"overlap_score_weight": 0.0, "router_assume_kv_reuse": False}, description="kv-aware options of the decode pool's router (Dynamo's derive_decode_router_config: no overlap credit, router_assume_kv_reuse false: active blocks + the request's blocks, cache-blind).")
    conditional_disagg: bool = Field(False, description="Prefill locally on the decode worker when the uncached part is short (Dynamo conditional_disagg_enabled, policy isl_bounding).")
    eff_isl_threshold: int = Field(2048, ge=0, description="Conditional: bypass only if prompt - decode overlap < this many tokens (Dynamo conditional_disagg_eff_isl_threshold).")
    eff_isl_ratio_threshold: float = Field(0.7, ge=0, le=1, description="Conditional: and only if (prompt - decode overlap) / prompt < this (Dynamo conditional_disagg_eff_isl_ratio_threshold).")


class DynamoDisaggRouter(PdRouterBase):
    """Dynamo's PrefillRouter (module docstring): KV router over the prefill pool, decode by load after the
    prefill, optional conditional disaggregation on the decode worker's overlap."""

    name = "dynamo-disagg"
    summary = "Dynamo PrefillRouter: KV cost over the prefill pool, decode by load; conditional_disagg prefills short uncached parts locally"
    Options = DynamoDisaggOptions

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        opts = self.options
        self.prefill = self.stage_router("prefill", "kv-aware", opts.prefill_options)
        self.decode = self.stage_router("decode", "kv-aware", opts.decode_options)

    def bypasses(self, request: Request, overlap_tokens: int) -> bool:
        """Dynamo's `IslBoundingPolicy`: prefill locally when the net-new tokens on the decode worker are few, in
        tokens and as a share of the prompt (both strict)."""
        opts = self.options
        eff_isl = max(request.prompt_tokens - overlap_tokens, 0)
        if eff_isl >= opts.eff_isl_threshold:
            return False
        return eff_isl / max(request.prompt_tokens, 1) < opts.eff_isl_ratio_threshold

    def route_pd(self, request: Request, prefill: ClusterView, decode: ClusterView) -> PdChoice:
        if self.options.conditional_disagg:
            d = self.decode.route(request, decode)
            # NOTE: the overlap is the decode worker's whole cached blocks (`overlap_blocks * block_size`), as the
            # decode router sees them; a peek (Dynamo: find_best_match_details_without_admission).
            B = decode.cache_block_size()
            overlap = decode.cached_prefix_tokens(d, request) // B * B
            if self.bypasses(request, overlap):
                return PdChoice(prefill_worker=None, decode_worker=d)
        return PdChoice(prefill_worker=self.prefill.route(request, prefill), decode_worker=None)
