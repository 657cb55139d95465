"""llm-d's endpoint picker (EPP): filters -> weighted scorers -> max-score picker, with llm-d's published presets.

Read from `llm-d/llm-d-router` @ebab687 (2026-08-22; the module renamed from llm-d-inference-scheduler, which also
holds the former gateway-api-inference-extension EPP code), `llm-d/llm-d-inference-scheduler` @520af47 (2026-05-17,
for the older forms), `llm-d/llm-d-kv-cache-manager` @a378f5b and the `llm-d/llm-d` guides named per preset below.
Paths are relative to `pkg/epp/` of llm-d-router unless said otherwise.

Pipeline (`scheduling/scheduler_profile.go`, `framework/plugins/scheduling/picker/maxscore/picker.go`):

    candidates = filter(all workers)                 # only prefix-cache-affinity-filter here (off unless a preset sets it)
    total[e]   = sum_s weight_s * clamp(score_s(e), 0, 1)       over e in candidates, scorers in profile order
    pick       = shuffle(candidates) (self.rng), stable sort by total descending, first  -> ties uniformly random

Membership: the EPP's datastore holds the InferencePool's ready pods (a terminating pod leaves it, a new pod joins when
ready); the candidates are those, every scorer's min/max and ranks are over them. The approximate producer removes
pods no longer in the pod list from its indexer (`CleanUpInactivePods`, a ticker every `podActiveCheckInterval`,
`requestcontrol/dataproducer/approximateprefix/`); kvsim removes them at once (NOTE: until upstream's tick a departed
pod's keys can still carry the match walk past a key no live pod holds). A new pod's LRU starts empty. The no-hit LRU keeps pod names (departed ones
too, as upstream never removes them; a new pod is never used).

A scorer whose weight is 0 is not in the profile (and reads nothing). Every scorer sees only the filtered candidates
(min/max of the queue scorer, the busiest count of the active-request scorer, the no-hit LRU ranks are over them).

Scorers (`framework/plugins/scheduling/scorer/...`), Q = waiting queue and U = KV usage as scraped every
`scrape_interval_s` (EPP `--refresh-metrics-interval`, default 50 ms, `datalayer/runtime.go` defaultRefreshInterval):

    prefix-cache-scorer (prefix_cache_weight)  matched_blocks / total_blocks of the prefix producer (0 if total is 0)
    queue-scorer (queue_weight)                (maxQ - Q_e) / (maxQ - minQ); 1.0 for all if maxQ == minQ
    kv-cache-utilization (kv_..._weight)       1 - U_e
    load-aware-scorer (load_aware_weight)      0.5 if Q_e == 0 else 0.5 * (1 - min(Q_e, 128) / 128)
    active-request-scorer                      n_e = router in-flight requests (dispatch .. response end);
                                               1.0 if n_e <= idleThreshold (0) else (max_n - n_e) / max_n
    token-load-scorer (token_load_weight)      t_e = inflight_tokens_e + uncached_e(request);
                                               1.0 if t_e <= 0 else 1 - min(t_e, 4,194,304) / 4,194,304
    no-hit-lru-scorer (no_hit_lru_weight)      cold = no candidate has a prefix match > 0 (approximate producer,
                                               the DataKey's default producer). Warm: 0.5 everywhere. Cold: never-used
                                               candidates first in worker order, then used ones oldest first,
                                               rank r -> max(0, 1 - r / (n - 1)) (r of a used pod = #never-used +
                                               its position among all LRU keys); after a cold request the chosen
                                               pod becomes most recent (LRU of `lruSize` 1024 pods).
    session-affinity-scorer                    the session's pod 1.0 if it is a candidate, every other 0 (all 0
      (session_affinity_weight)                without a session, an unknown one, or a pod filtered out or gone).
                                               Session: `policies.base.session_key` (the request's session; its
                                               prefix_id in a workload without sessions). The pod, by
                                               `session_affinity_strategy`: `encoded_endpoint_header` (default,
                                               stateless) the pod named in the x-session-token header of the
                                               session's last response, which the client echoes (learnt when that
                                               response starts: its first token); `session_id` the router's own
                                               binding (below).

In-flight tokens (`requestcontrol/dataproducer/inflightload/producer.go`, addEstimatedOutputTokens=false): at
dispatch the chosen pod gains the request's *uncached* prompt tokens per the approximate producer,
    uncached_e = (total_blocks - matched_e) * G + max(0, prompt_tokens - total_blocks * G)
(G = the producer's block size; the partial last block counts whole), released at the first token (StartOfStream,
streaming). This is not `RouterBase.in_flight_tokens` (whole prompts until completion).

Approximate prefix producer (`requestcontrol/dataproducer/approximateprefix/`, `.../prefixhash/hashing.go`): chained
hashes of G-token blocks of the tokenized prompt, the trailing partial block included, at most
`maxPrefixTokensToMatch / G` blocks (131,072 tokens; `maxPrefixBlocksToMatch` 2048 only when the token cap is 0;
both 0: whole prompt). G = the engine's block size when autoTune (default true) reads it from the metrics (vLLM
`cache_config_info` block_size, SGLang page_size), else `blockSizeTokens` 16, and then **floored at 64 tokens**
(`minBlockSizeTokens`, #1160, 2026-06-02): with vLLM's 16 the router keys 64-token blocks. State: one LRU per pod
(hashicorp golang-lru) of capacity = the pod's `num_gpu_blocks` under autoTune, else `lruCapacityPerServer` 31,250;
**only routing adds entries** (PreRequest, in the request's block order, so a pod's oldest entry is a prefix root),
lookups never refresh, an LRU eviction removes the pod from that hash. Modelled by `RoutingHistory(per_worker=True,
leaves_first=False, check_interval_s=0, ttl_s=None)`. Match (`matchLongestPrefix`): walk the request's hashes, stop
at the first hash *no* pod holds, else +1 for *every* holder -- a pod that lost an early block still counts the
later ones it holds (unlike a first-miss walk).
NOTE: the partial last block is keyed per request (a simulated prompt's tail is its own), so it never matches
another request but does take one LRU entry, as upstream.

Precise prefix producer (`requestcontrol/dataproducer/preciseprefixcache/`, kv-cache-manager
`pkg/kvcache/kvblock_scorer.go` LongestPrefixScorer): an index of the engines' KV events (`state=events`, with
`event_lag_s` / `event_loss`); a pod scores the depth of its run of the request's full blocks from the first (active
set intersected block by block, GPU tier weight 1.0). Score (`prefix-cache-scorer` on its PrefixCacheMatchInfo, as
the legacy `precise-prefix-cache-scorer` since #1107, 2026-05-14): min(depth / full_blocks, 1). Before #1107
(`precise_normalization=min_max`, inference-scheduler @9060840): min-max over the pods with depth > 0,
(d - min) / (max - min), 1.0 for all of them if equal, 0 for pods without a hit.
`speculativeIndexing`: the router also indexes its own choices for `speculativeTTL` 2 s
(`PrefixStateSpec.predicted_ttl_s`); a pod's depth is the larger of the two.
NOTE: the guides' `blockSize: 64  # must match vLLM --block-size` presumes an engine with 64-token blocks; here the
router's keys are the engine's own blocks whatever their size (with vLLM's 16, 16-token keys), which is what "must
match" means. Newer producers re-chunk event token ids at their own block size; not modelled.

session-affinity-scorer, `session_id` strategy (`framework/plugins/scheduling/scorer/sessionaffinity/
session_id_header.go`, `.../util/sessionaffinity/session_id.go` SessionIDHeader, PR #2238, 2026-08-05): a store
session -> (pod, last seen), written only at PreRequest (dispatch):

    no binding                          -> bind to the chosen pod, last seen = now
    bound to the chosen pod             -> last seen = now
    bound elsewhere, that pod was not   -> migrate: bind to the chosen pod, last seen = now
      among this request's candidates
    bound elsewhere, that pod was a     -> unchanged (not even last seen: another scorer outweighed the session)
      candidate
    sweep every `session_eviction_sweep_s` (10) from the start: drop bindings with sweep time - last seen >
      `session_eviction_ttl_s` (300); a lookup never checks expiry, so a binding lives until the first sweep past it.

prefix-cache-affinity-filter (`framework/plugins/scheduling/filter/prefixcacheaffinity/plugin.go`), on the
approximate producer's fraction f_e = matched_e / total_blocks:

    if len(candidates) <= 1 or affinityThreshold <= 0: keep all
    if rng < explorationProbability:                    keep all
    sticky = {e : f_e >= affinityThreshold (0.80)};     none sticky -> keep all
    TTFT gate (maxTTFTPenaltyMs > 0, some non-sticky):  ttft_e = inflight_tokens_e / peakPrefillThroughput * 1000 ms
        min_sticky ttft - min_non_sticky ttft > maxTTFTPenaltyMs      -> keep all
    token gate (maxTokensInFlightPenalty > 0, some non-sticky):
        min_sticky inflight_tokens - min_non_sticky inflight_tokens > maxTokensInFlightPenalty -> keep all
    else keep sticky

Both gates are kept because the guides and the code moved apart: the token gate existed from #1024 (2026-05-20) to
#1547 (2026-06-11), which replaced it by the TTFT gate on in-flight tokens (default 18,000 ms since #1639; exploration
default 0.01 until #1664, 0 since). The optimized-baseline guide (@0a3b0c9) still sets the token gate (286,720) with
`maxTTFTPenaltyMs: 0`; 286,720 tokens at 15,928 tok/s is 18.0 s, so HEAD's default TTFT gate is the same bound.
NOTE: the TTFT estimate uses the in-flight tokens only (HEAD code), not + the request's own uncached tokens.

Presets (`preset`, applied before validation: an option given explicitly wins over the preset's value):
* `default` -- `config/loader/defaults.go` and the chart's `routerlib/templates/_config.yaml`: queue 2,
  kv-cache-utilization 2, prefix-cache 3 (approximate).
* `optimized-baseline` -- `llm-d/llm-d` `guides/optimized-baseline/router/optimized-baseline.values.yaml` @0a3b0c9:
  affinity filter (0.80, token gate 286,720, TTFT gate off, exploration 0.01 = the default of the router releases
  that had the token gate), token-load-scorer 1, approximate producer with maxPrefixTokensToMatch 40,960.
* `precise` -- `guides/precise-prefix-cache-routing/router/precise-prefix-cache-routing.values.yaml` @076e65d:
  precise 3 + speculative indexing, kv-cache-utilization 2, queue 2, no-hit-lru 2, 2 EPP replicas active-active
  (each its own index and counts; event indexes converge). The no-hit-lru scorer there names no producer, so its
  cold test reads the auto-created approximate producer (`no_hit_lru_source=approximate`).
* `estimate` -- `deploy/config/epp-estimate-prefix-cache-config.yaml`: prefix-cache 1 (approximate), load-aware 1.
* `precise-sample` -- `deploy/config/epp-precise-prefix-cache-config.yaml`: precise 2, kv-cache-utilization 1, queue 1.
* `payload-agnostic` -- the chart's `payload-agnostic.yaml`: active-request 1, session-affinity 1.
The decode-filter of the guides keeps every worker here (no P/D roles).

Older form (GIE / inference-scheduler @520af47): the approximate producer hashed request *characters* (JSON of the
chat messages) in blocks of blockSizeTokens x 4 = 64 characters (16 tokens), at most 256 blocks, with no 64-token
floor: `min_block_size_tokens=16, max_prefix_tokens_to_match=0, max_prefix_blocks_to_match=256` reproduces it.
Not modelled: the session-affinity-filter (the same pod as a hard pin; the scorer is the soft preference); the
speculative TTL's 2 s cleanup ticker (entries live 2..4 s upstream, exactly 2 s here); the union (not max) of
speculative and event entries in one index; the session header being the client's across EPP replicas (here each
replica learns its own; the no-hit LRU is per replica upstream too).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable
from typing import Any, Literal

from pydantic import Field, model_validator

from policies.base import LoadOptions, RouterBase, session_key
from policies.llm_d_approx import ApproxPrefixIndex
from sim.routing.interface import ClusterView, PrefixState, PrefixStateSpec
from sim.routing.knobs import FloatKnob
from sim.routing.tier_index import TierIndex
from sim.workloads.request import Request

PRESETS: dict[str, dict[str, Any]] = {
    "default": {"queue_weight": 2.0, "kv_cache_utilization_weight": 2.0, "prefix_cache_weight": 3.0},
    "optimized-baseline": {"affinity_filter": True, "affinity_threshold": 0.80, "max_tokens_in_flight_penalty": 286720,
                           "max_ttft_penalty_ms": 0.0, "exploration_probability": 0.01, "token_load_weight": 1.0,
                           "max_prefix_tokens_to_match": 40960},
    "precise": {"prefix_cache": "precise", "prefix_cache_weight": 3.0, "kv_cache_utilization_weight": 2.0,
                "queue_weight": 2.0, "no_hit_lru_weight": 2.0, "speculative_indexing": True, "replicas": 2},
    "estimate": {"prefix_cache_weight": 1.0, "load_aware_weight": 1.0},
    "precise-sample": {"prefix_cache": "precise", "prefix_cache_weight": 2.0, "kv_cache_utilization_weight": 1.0,
                       "queue_weight": 1.0},
    "payload-agnostic": {"active_request_weight": 1.0, "session_affinity_weight": 1.0},
}
"""Each published configuration as option values (see the module docstring for the files they come from)."""


class LlmdOptions(LoadOptions):
    preset: Literal["default", "optimized-baseline", "precise", "estimate", "precise-sample", "payload-agnostic"] = Field(
        "default", description="A published llm-d configuration; sets the weights and modes below unless given explicitly.")
    # ---- scorer weights (0: scorer not in the profile)
    prefix_cache_weight: float = Field(0.0, ge=0, description="prefix-cache-scorer weight (chart default 3).")
    queue_weight: float = Field(0.0, ge=0, description="queue-scorer weight (chart default 2).")
    kv_cache_utilization_weight: float = Field(0.0, ge=0, description="kv-cache-utilization-scorer weight (chart default 2).")
    load_aware_weight: float = Field(0.0, ge=0, description="load-aware-scorer weight.")
    active_request_weight: float = Field(0.0, ge=0, description="active-request-scorer weight (router in-flight requests).")
    token_load_weight: float = Field(0.0, ge=0, description="token-load-scorer weight (router in-flight uncached prompt tokens).")
    no_hit_lru_weight: float = Field(0.0, ge=0, description="no-hit-lru-scorer weight.")
    session_affinity_weight: float = Field(0.0, ge=0, description="session-affinity-scorer weight (the session: its session_id; its prefix_id in a workload without sessions).")
    # ---- prefix producers
    prefix_cache: Literal["approximate", "precise"] = Field(
        "approximate", description="What the prefix-cache-scorer reads: approx-prefix-cache-producer (routing history) or precise-prefix-cache-producer (KV events).")
    auto_tune: bool = Field(True, description="approx producer autoTune: block size and per-pod LRU capacity from the engine's metrics.")
    block_size_tokens: int = Field(16, ge=1, description="approx producer blockSizeTokens (used when autoTune has no metric).")
    min_block_size_tokens: int = Field(64, ge=1, description="approx producer block-size floor (minBlockSizeTokens, code constant since #1160; 16 = older releases).")
    max_prefix_tokens_to_match: int = Field(131072, ge=0, description="approx producer maxPrefixTokensToMatch (0: use max_prefix_blocks_to_match).")
    max_prefix_blocks_to_match: int = Field(2048, ge=0, description="approx producer maxPrefixBlocksToMatch, only when the token cap is 0 (both 0: whole prompt).")
    lru_capacity_per_server: int = Field(31250, ge=1, description="approx producer lruCapacityPerServer (per-pod LRU entries when autoTune has no block count).")
    event_lag_s: float = Field(0.0, ge=0, description="precise: delay from an engine publishing KV events to the router applying them.")
    event_loss: float = Field(0.0, ge=0, lt=1, description="precise: probability that each KV event is lost.")
    speculative_indexing: bool = Field(False, description="precise producer speculativeIndexing: index the router's own choices too.")
    speculative_ttl_s: float = Field(2.0, gt=0, description="precise producer speculativeTTL.")
    cpu_tier_weight: float = Field(0.0, ge=0, description="precise: weight of a block found only in the worker's host (CPU) tier, from the tier's KV events (kvCacheBackendConfigs cpu, 0.8 in llm-d; kvsim's 0 scores GPU blocks only, as before tiers were indexed).")
    shared_tier_weight: float = Field(0.0, ge=0, description="precise: weight of a block found only in the cluster-shared store (a pool: pseudo-pod tier, e.g. lmcache-l2-<backend>: no llm-d default, set explicitly).")
    precise_normalization: Literal["ratio", "min_max"] = Field(
        "ratio", description="precise score: min(depth/blocks, 1) (since PR #1107, 2026-05-14) or min-max over the hit pods (before).")
    # ---- scorer parameters
    load_aware_queue_threshold: int = Field(128, ge=1, description="load-aware-scorer threshold (waiting requests).")
    active_request_idle_threshold: int = Field(0, ge=0, description="active-request-scorer idleThreshold.")
    token_load_queue_threshold_tokens: int = Field(4194304, ge=1, description="token-load-scorer queueThresholdTokens.")
    no_hit_lru_size: int = Field(1024, ge=1, description="no-hit-lru-scorer lruSize (pods).")
    no_hit_lru_source: Literal["approximate", "prefix_cache"] = Field(
        "approximate", description="Whose matches decide 'cold': the approximate producer (the default DataKey) or the prefix-cache scorer's producer.")
    session_affinity_strategy: Literal["encoded_endpoint_header", "session_id"] = Field(
        "encoded_endpoint_header", description="session-affinity-scorer strategy: the pod the session's last response named (x-session-token, echoed by the client), or the router's own session -> pod binding (x-session-id).")
    session_eviction_ttl_s: float = Field(300.0, gt=0, description="session_id strategy: sessionIdConfig.evictionTtlSeconds, how long a binding survives unused.")
    session_eviction_sweep_s: float = Field(10.0, gt=0, description="session_id strategy: sessionIdConfig.evictionSweepSeconds, how often expired bindings are swept.")
    # ---- prefix-cache-affinity-filter
    affinity_filter: bool = Field(False, description="Run prefix-cache-affinity-filter before the scorers.")
    affinity_threshold: float = Field(0.80, le=1.0, description="filter affinityThreshold (prefix match fraction to be sticky).")
    exploration_probability: float = Field(0.0, ge=0, le=1, description="filter explorationProbability (skip the gate).")
    max_ttft_penalty_ms: float = Field(18000.0, ge=0, description="filter maxTTFTPenaltyMs (0: TTFT gate off).")
    peak_prefill_throughput_tokens_per_s: float = Field(15928.0, gt=0, description="filter peakPrefillThroughput.")
    max_tokens_in_flight_penalty: int = Field(0, ge=0, description="filter maxTokensInFlightPenalty (#1024..#1547; 0: off).")

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        preset = data.get("preset", "default")
        values = PRESETS.get(preset)
        if values is None:
            return data  # the field's own validation names the allowed presets
        return {**values, **data}


class LlmdRouter(RouterBase):
    name = "llm-d"
    summary = "llm-d EPP: filter -> weighted scorers (prefix, queue, KV usage, load...) -> max-score pick; presets"
    Options = LlmdOptions
    # The default profile's three scorers (only their ratios matter: the picker takes the max of the weighted sum).
    search_space = (FloatKnob("prefix_cache_weight", 0, 5), FloatKnob("queue_weight", 0, 5),
                    FloatKnob("kv_cache_utilization_weight", 0, 5))
    needs_cache_state = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        o = self.options
        self._approx: ApproxPrefixIndex | None = None
        self._precise: PrefixState | None = None
        self._tiers: TierIndex | None = None
        self._inflight_tokens = [0] * self.num_workers
        self._pending_tokens: dict[int, tuple[int, int]] = {}
        self._cold: dict[int, bool] = {}
        self._lru: OrderedDict[int, None] = OrderedDict()  # no-hit LRU, oldest first
        self._session_pod: dict[Hashable, int] = {}  # encoded_endpoint_header: the pod each session's client echoes
        self._bindings: dict[Hashable, tuple[int, float]] = {}  # session_id: session -> (pod, last seen s)
        self._swept_s = 0.0  # the last sweep applied (sweeps run at multiples of session_eviction_sweep_s)
        self._bound_absent: tuple[int, bool] | None = None  # (request id, its binding's pod was not a candidate)
        self._pending_uncached: tuple[int, list[int]] | None = None
        self._needs_approx = ((o.prefix_cache == "approximate" and o.prefix_cache_weight > 0) or o.affinity_filter
                              or o.token_load_weight > 0
                              or (o.no_hit_lru_weight > 0 and (o.no_hit_lru_source == "approximate"
                                                               or o.prefix_cache == "approximate")))

    # ------------------------------------------------------------------ what the router sees
    def prefix_state_spec(self) -> PrefixStateSpec | None:
        o = self.options
        reads_precise = o.prefix_cache_weight > 0 or (o.no_hit_lru_weight > 0 and o.no_hit_lru_source == "prefix_cache")
        if o.prefix_cache != "precise" or not reads_precise:
            return None
        return PrefixStateSpec(mode="events", event_lag_s=o.event_lag_s, event_loss=o.event_loss,
                               predicted_ttl_s=o.speculative_ttl_s if o.speculative_indexing else None)

    def bind(self, view: ClusterView) -> None:
        super().bind(view)
        self._precise = self.prefix
        o = self.options
        self._tiers = (TierIndex(view) if o.prefix_cache == "precise" and (o.cpu_tier_weight or o.shared_tier_weight)
                       else None)
        if self._needs_approx:
            self._approx = ApproxPrefixIndex.for_options(view, self.options)
            if self.prefix is None:
                self.prefix = self._approx  # the base records it at dispatch and keeps the belief

    # ------------------------------------------------------------------ the pipeline
    def scores(self, request: Request, view: ClusterView) -> tuple[list[int], dict[int, float]]:
        """The filtered candidates and their weighted totals (before the picker)."""
        o = self.options
        n = self.num_workers
        approx = self._approx
        if approx is not None:
            matched, total = approx.match_blocks(request)
            if self.prefix is approx:
                self.prefix_tokens(request)  # registers the belief for the view-error counters
            # _uncached_tokens of each worker, inlined (per request and worker)
            G = approx.tokens_per_key
            indexed = total * G
            tail = max(request.prompt_tokens - indexed, 0)
            uncached = [max(indexed - m * G, 0) + tail for m in matched]
        candidates = list(self.workers)  # the datastore's ready endpoints
        if o.affinity_filter:
            candidates = self._affinity_filter(candidates, matched, total)

        # NOTE: totals in candidate order; each scorer's scores are a list in that order (the same floats, added in
        # the same order as `totals[w] += weight * clamp(score(w))`; plain lists where the default profile's scorers
        # ran a closure per candidate).
        sums = [0.0] * len(candidates)

        def add(weight: float, scores) -> None:
            for i, score in enumerate(scores):
                sums[i] += weight * min(max(score, 0.0), 1.0)

        if o.prefix_cache_weight > 0:
            if o.prefix_cache == "approximate":
                add(o.prefix_cache_weight, [matched[w] / total for w in candidates] if total
                    else [0.0] * len(candidates))
            else:
                precise = self._precise_scores(request, view)
                add(o.prefix_cache_weight, [precise[w] for w in candidates])
        if o.queue_weight > 0 or o.kv_cache_utilization_weight > 0 or o.load_aware_weight > 0:
            interval = o.scrape_interval_s
            loads = [view.scraped_load(w, interval) for w in candidates]
            if o.queue_weight > 0:
                qs = [load.num_waiting for load in loads]
                lo, hi = min(qs), max(qs)
                add(o.queue_weight, [1.0] * len(qs) if hi == lo else [(hi - q) / (hi - lo) for q in qs])
            if o.kv_cache_utilization_weight > 0:
                add(o.kv_cache_utilization_weight, [1.0 - load.kv_usage for load in loads])
            if o.load_aware_weight > 0:
                threshold = o.load_aware_queue_threshold
                add(o.load_aware_weight, [0.5 if load.num_waiting == 0
                                          else 0.5 * (1.0 - min(load.num_waiting, threshold) / threshold)
                                          for load in loads])
        if o.active_request_weight > 0:
            busiest = max(self.in_flight[w] for w in candidates)
            idle = o.active_request_idle_threshold
            add(o.active_request_weight, [1.0 if self.in_flight[w] <= idle else (busiest - self.in_flight[w]) / busiest
                                          for w in candidates])
        if o.token_load_weight > 0:
            cap = o.token_load_queue_threshold_tokens
            add(o.token_load_weight, [1.0 if self._inflight_tokens[w] + uncached[w] <= 0
                                      else 1.0 - min(self._inflight_tokens[w] + uncached[w], cap) / cap
                                      for w in candidates])
        if o.no_hit_lru_weight > 0:
            if o.no_hit_lru_source == "approximate" or o.prefix_cache == "approximate":
                hits = matched
            else:
                hits = [t // view.cache_block_size() for t in self.prefix_tokens(request)]
            cold = not any(hits[w] > 0 for w in candidates)
            self._cold[request.request_id] = cold
            if cold:
                score = self._no_hit_lru_scores(candidates)
                add(o.no_hit_lru_weight, [score(w) for w in candidates])
            else:
                add(o.no_hit_lru_weight, [0.5] * len(candidates))
        if o.session_affinity_weight > 0:
            pod = self._session_target(request, candidates, view.now_s)
            add(o.session_affinity_weight, [1.0 if w == pod else 0.0 for w in candidates])
        if approx is not None:
            self._pending_uncached = (request.request_id, uncached)
        return candidates, dict(zip(candidates, sums))

    def route(self, request: Request, view: ClusterView) -> int:
        candidates, totals = self.scores(request, view)
        # max-score-picker: shuffle (random tie-break), stable sort by score descending, take the first.
        order = list(candidates)
        self.rng.shuffle(order)
        order.sort(key=totals.__getitem__, reverse=True)
        return order[0]

    # ------------------------------------------------------------------ the pieces
    def _uncached_tokens(self, request: Request, matched_blocks: int, total_blocks: int) -> int:
        """The prompt tokens `request` would add to a pod's in-flight count (inflightload `uncachedInputTokens`):
        | matched x G | (total - matched) x G uncached | tail beyond the indexed blocks |; the partial last block
        counts as a whole G, so the uncached part may exceed the prompt's by up to G - 1 tokens."""
        G = self._approx.tokens_per_key
        indexed = total_blocks * G
        return max(indexed - matched_blocks * G, 0) + max(request.prompt_tokens - indexed, 0)

    def _affinity_filter(self, candidates: list[int], matched: list[int], total: int) -> list[int]:
        o = self.options
        if len(candidates) <= 1 or o.affinity_threshold <= 0:
            return candidates
        if o.exploration_probability > 0 and self.rng.random() < o.exploration_probability:
            return candidates
        fraction = [(matched[w] / total if total else 0.0) for w in range(self.num_workers)]
        sticky = [w for w in candidates if fraction[w] >= o.affinity_threshold]
        if not sticky:
            return candidates
        others = [w for w in candidates if fraction[w] < o.affinity_threshold]
        if others:
            tokens = self._inflight_tokens
            if o.max_ttft_penalty_ms > 0:
                to_ms = 1000.0 / o.peak_prefill_throughput_tokens_per_s
                if (min(tokens[w] for w in sticky) * to_ms - min(tokens[w] for w in others) * to_ms
                        > o.max_ttft_penalty_ms):
                    return candidates
            if o.max_tokens_in_flight_penalty > 0:
                if min(tokens[w] for w in sticky) - min(tokens[w] for w in others) > o.max_tokens_in_flight_penalty:
                    return candidates
        return sticky

    def _session_target(self, request: Request, candidates: list[int], now_s: float) -> int | None:
        """The pod the session-affinity scorer gives 1.0 (None: none). With the session_id strategy, also notes for
        PreRequest whether the session's bound pod was among the candidates."""
        key = session_key(request)
        if key is None:
            return None
        if self.options.session_affinity_strategy == "encoded_endpoint_header":
            return self._session_pod.get(key)  # a pod not among the candidates scores nowhere
        self._sweep_bindings(now_s)
        binding = self._bindings.get(key)
        if binding is None:
            return None
        absent = binding[0] not in candidates
        self._bound_absent = (request.request_id, absent)
        return None if absent else binding[0]

    def _sweep_bindings(self, now_s: float) -> None:
        """Apply the last eviction sweep due by `now_s`. The ticker runs every `session_eviction_sweep_s` from the
        start; a binding's last-seen time changes only at a dispatch, which applies the sweeps due first, so the
        latest sweep removes exactly what the ones skipped since would have."""
        o = self.options
        sweep_s = int(now_s / o.session_eviction_sweep_s) * o.session_eviction_sweep_s
        if sweep_s <= self._swept_s:
            return
        self._swept_s = sweep_s
        ttl = o.session_eviction_ttl_s
        self._bindings = {k: b for k, b in self._bindings.items() if not sweep_s - b[1] > ttl}

    def _bind_session(self, request: Request, worker: int) -> None:
        """session_id strategy's PreRequest: the only place bindings change (module docstring)."""
        key = session_key(request)
        if key is None:
            return
        now_s = self.view.now_s
        noted, self._bound_absent = self._bound_absent, None
        binding = self._bindings.get(key)
        if binding is None or binding[0] == worker:
            self._bindings[key] = (worker, now_s)
        elif noted is not None and noted == (request.request_id, True):
            self._bindings[key] = (worker, now_s)  # the bound pod was not a candidate: the session migrates

    def _precise_scores(self, request: Request, view: ClusterView) -> list[float]:
        block = view.cache_block_size()
        depths = [t // block for t in self.prefix_tokens(request)]
        full_blocks = len(view.cache_block_keys(request))
        if self._tiers is not None:
            # NOTE: llm-d's LongestPrefixScorer walks on through blocks held on any medium, each at the largest
            # weight among its media (`pkg/kvcache/kvblock_scorer.go` fillMainWeights); the GPU's weight is 1.
            keys, o = view.cache_block_keys(request), self.options
            weights = {"GPU": 1.0, "CPU": o.cpu_tier_weight, "SHARED": o.shared_tier_weight}
            depths = [self._tiers.weighted_depth(w, keys, d, weights) for w, d in enumerate(depths)]
        if self.options.precise_normalization == "ratio":
            return [min(d / full_blocks, 1.0) if full_blocks else 0.0 for d in depths]
        hits = [d for d in depths if d > 0]
        if not hits:
            return [0.0] * len(depths)
        lo, hi = min(hits), max(hits)
        return [0.0 if d == 0 else 1.0 if hi == lo else (d - lo) / (hi - lo) for d in depths]

    def _no_hit_lru_scores(self, candidates: list[int]):
        n = len(candidates)
        if n == 1:
            return lambda w: 1.0
        # NOTE: the LRU holds pod names (kvsim: instance ids), departed pods included: upstream never removes them
        # (`lruCache.Keys()` counts them in every position), and a new pod has a name of its own: never used.
        position = {pod: i for i, pod in enumerate(self._lru)}  # oldest first, over every pod in the LRU
        pod = {w: self.instance_of(w) for w in candidates}
        never = [w for w in candidates if pod[w] not in position]
        score = {w: 1.0 - i / (n - 1) for i, w in enumerate(never)}
        for w in candidates:
            if pod[w] in position:
                score[w] = max(0.0, 1.0 - (len(never) + position[pod[w]]) / (n - 1))
        return score.__getitem__

    # ------------------------------------------------------------------ membership
    def after_set_workers(self, left, joined, renewed) -> None:
        """A pod that leaves the datastore takes its approximate LRU and host-tier entries with it (the base drops
        the prefix state); a session pointing at it, by echoed header or by binding, scores nowhere from now on,
        as upstream's does for a pod that is no longer a candidate (then migrates at its next dispatch): dropped."""
        gone = set(left) | set(renewed)
        if not gone:
            return
        for w in sorted(gone):
            if self._approx is not None and self.prefix is not self._approx:
                self._approx.remove_worker(w)
            if self._tiers is not None:
                self._tiers.remove_worker(w)
        self._session_pod = {k: w for k, w in self._session_pod.items() if w not in gone}
        self._bindings = {k: b for k, b in self._bindings.items() if b[0] not in gone}

    # ------------------------------------------------------------------ hooks
    def after_dispatch(self, request: Request, worker: int) -> None:
        if self._approx is not None and self.prefix is not self._approx:
            self._approx.record(request, worker)
        pending = self._pending_uncached
        if pending is not None and pending[0] == request.request_id:
            tokens = pending[1][worker]
            self._inflight_tokens[worker] += tokens
            self._pending_tokens[request.request_id] = (worker, tokens)
            self._pending_uncached = None
        o = self.options
        if o.session_affinity_weight > 0 and o.session_affinity_strategy == "session_id":
            self._bind_session(request, worker)
        if self._cold.pop(request.request_id, False):
            pod = self.instance_of(worker)
            self._lru[pod] = None
            self._lru.move_to_end(pod)
            while len(self._lru) > self.options.no_hit_lru_size:
                self._lru.popitem(last=False)

    def after_first_token(self, request: Request, worker: int) -> None:
        pending = self._pending_tokens.pop(request.request_id, None)
        if pending is not None:
            self._inflight_tokens[pending[0]] -= pending[1]
        o = self.options
        key = session_key(request)
        if o.session_affinity_weight > 0 and o.session_affinity_strategy == "encoded_endpoint_header" and key is not None:
            self._session_pod[key] = worker  # the response's x-session-token, which the client sends next time

    def after_complete(self, request: Request, worker: int) -> None:
        pending = self._pending_tokens.pop(request.request_id, None)  # a response that ended without a first token
        if pending is not None:
            self._inflight_tokens[pending[0]] -= pending[1]
