"""AIBrix gateway routers: `prefix-cache` and `least-kv-cache`.

Read from github:vllm-project/aibrix @e3e10f9e4aebe9aac5e7d992fb87d2648e01628b (2026-08-22):
`pkg/plugins/gateway/algorithms/prefix_cache.go` (routeOriginal, getTargetPodFromMatchedPods,
getTargetPodListOnLoadImbalance), `least_request.go` (selectTargetPodWithLeastRequestCount, getRequestCounts),
`least_kv_cache.go`, `util.go` (mean, standardDeviation), `pkg/utils/prefixcacheindexer/hash.go`
(PrefixHashTable), `pkg/utils/lrustore/lru_store.go`, `pkg/utils/tokenizer/local_characters.go`,
`pkg/cache/cache_trace.go` (addPodStats / donePodStats) and the deployed settings in `dist/chart/values.yaml` and
`config/gateway/gateway-plugin/gateway-plugin.yaml` (both set the same gateway env).

Membership: both routers choose among the routing context's ready pods (the gateway's pod cache lists a model's pods
and routes only to ready ones; a terminating pod is not ready). `prefix-cache` takes the running counts, their mean
and standard deviation, and the least-running pods over the ready pods, and matches its prefix index against them
only (`MatchPrefix(..., readyPodsMap)`): a departed pod's entries stay in the index until they expire, under a pod
name no later pod has; kvsim drops them when the pod leaves (its slot may be reused), which routes the same.
"""

from __future__ import annotations

import math
import statistics
from typing import Literal

from pydantic import Field

from policies.base import LoadOptions, PrefixStateOptions, RouterBase
from sim.routing.interface import ClusterView, PrefixStateSpec, StateMode
from sim.routing.knobs import FloatKnob, IntKnob
from sim.workloads.request import Request

CHARS_PER_TOKEN = 4
"""kvsim models text as 4 characters a token (AIBrix's default tokenizer hashes bytes of the prompt text)."""


def sample_stdev(counts: list[int]) -> float:
    """`statistics.stdev(counts)` of integers (>= 2 of them), the same float without its Fractions: the correctly
    rounded square root of the exact sample variance (n sum x^2 - (sum x)^2) / (n (n - 1)), reduced as a Fraction
    reduces it. statistics.stdev of 8 counts took several times longer than the rest of the gate."""
    sqrt_of_frac = getattr(statistics, "_float_sqrt_of_frac", None)
    if sqrt_of_frac is None or not all(type(x) is int for x in counts):
        return statistics.stdev(counts)
    n, total = len(counts), sum(counts)
    numerator, denominator = n * sum([x * x for x in counts]) - total * total, n * (n - 1)
    common = math.gcd(numerator, denominator)
    return sqrt_of_frac(numerator // common, denominator // common)


class AibrixPrefixCacheOptions(PrefixStateOptions):
    """Defaults are the deployed gateway's (the Helm chart and the kustomize manifest set the same env); the code's
    own fallbacks, used when the env is unset, are given in each description."""

    state: StateMode = Field("approximate", description="approximate: the gateway's own routing history (AIBrix default); events: AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED (vLLM KV events; its sync indexer is not modelled beyond the matching); exact: peeks.")
    imbalance_abs_count: int = Field(16, ge=0, description="AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT: max - min running requests above this is 'imbalanced' (chart 16; code default 8).")
    standard_deviation_factor: float = Field(2.0, ge=0, description="AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR: a matched pod qualifies if running <= mean + factor x sample std (chart 2; code default 1).")
    prefix_block_chars: int = Field(128, ge=4, multiple_of=4, description="AIBRIX_PREFIX_CACHE_BLOCK_SIZE: bytes of prompt text per hashed block (chart 128 = 32 tokens; code default 4 = 1 token, finer than kvsim's request blocks). 4 chars a token; the tokens must be a multiple of the request block size.")
    block_number: int = Field(200_000, ge=1, description="AIBRIX_PREFIX_CACHE_BLOCK_NUMBER: capacity of the prefix index LRU, in blocks.")
    eviction_duration_s: float = Field(1200.0, gt=0, description="AIBRIX_PREFIX_CACHE_EVICTION_DURATION_MINS x 60: an index entry not refreshed for this long is dropped (20 min).")
    eviction_interval_s: float = Field(1.0, gt=0, description="AIBRIX_PREFIX_CACHE_EVICTION_INTERVAL_SECONDS: how often the TTL sweep runs (1 s).")
    running_requests: Literal["all_gateways", "this_gateway"] = Field("all_gateways", description="Whose running-request counts the gateway reads: all_gateways (with Redis, the deployed default, each metrics refresh adds the other gateways' snapshots; modelled as the cluster's live in-flight count) or this_gateway (no Redis: this replica's own count).")


class AibrixPrefixCacheRouter(RouterBase):
    """AIBrix `prefix-cache` (`routeOriginal` in prefix_cache.go). Per request, with `running[w]` the gateway's
    running-request count of pod w (`realtime_num_requests_running`: incremented when the gateway routes a request
    to w, decremented when its response ends; a router-side count, not a scraped engine metric):

    1. Imbalance filter. If max(running) - min(running) > `imbalance_abs_count`, the candidates are the pods at
       min(running); otherwise all pods.
    2. Prefix match over the candidates. The prompt's bytes are cut into blocks of `prefix_block_chars` (the last
       partial block is not hashed), chained xxhash64 (seed = parent hash); K = number of blocks. Walking blocks
       0, 1, ..., a pod stays in the walk while the index holds the block for it; a pod that held blocks 0..i gets
       match % = (i + 1) * 100 // K (integer division; a pod that held block 0 is matched even at 0 %). kvsim:
       K = floor(prompt_tokens / key_tokens), key_tokens = prefix_block_chars / 4, depth from the prefix state.
    3. If some candidate matched: shuffle the matched pods (rng), stable-sort by match % descending, then running
       ascending; take the first with running <= mean + `standard_deviation_factor` x sigma, where mean and sigma
       are over ALL pods and sigma is the sample standard deviation (n - 1; 0 for one pod).
    4. Otherwise (nothing matched, or no matched pod under the bound): a uniformly random pod among those at
       min(running) over ALL pods.
    5. The request's blocks are recorded for the chosen pod (PostRouteUpdate), whichever branch chose it.

    Example, 3 pods, running [5, 0, 1], no imbalance (5 - 0 <= 16): mean 2, sigma = sqrt((9+4+1)/2) = 2.65, bound
    2 + 2 x 2.65 = 7.3; pod 0 with 90 % and pod 2 with 90 % -> sorted [2 (running 1), 0 (running 5)] -> pod 2.

    Index (approximate state): an LRU of `block_number` blocks, entries older than `eviction_duration_s` swept
    every `eviction_interval_s`; lookups do not refresh it; a request's blocks are added root first, so within a
    request the root is the least recently used (`leaves_first=False`). It never sees engine evictions.

    Where the doc (docs/routers/rules.md, AIBrix) and the code differ, the code is followed:
    * Imbalanced is not simply "a random least-running pod": the least-running pods are the candidates of the
      prefix match, so the one with the longest match among them wins (the std bound always holds for them), and
      only if none matched is it a random least-running pod.
    * Match % uses integer division over all of the prompt's blocks.
    Modelling differences (kvsim's `RoutingHistory`, `sim.routing.routing_history`):
    * AIBrix's LRU holds one entry per block with the set of pods, and any pod's Put refreshes the block's age;
      kvsim keeps one entry per (block, pod), each with its own age and counted against `block_number`.
    * AIBrix's capacity is enforced at every Put; kvsim enforces it (like the TTL) at the 1 s checks.
    * A TTL boundary tie (age exactly = duration) is dropped here, kept by AIBrix (`> ttl`).
    * The Redis snapshot of other gateways' counts is ~100 ms stale; kvsim reads the cluster count live.
    """

    name = "aibrix-prefix-cache"
    summary = "AIBrix prefix-cache: imbalance filter, prefix match %, std-bounded load gate, least-running fallback"
    Options = AibrixPrefixCacheOptions
    search_space = (IntKnob("imbalance_abs_count", 0, 32), FloatKnob("standard_deviation_factor", 0, 4))
    needs_cache_state = True

    def prefix_state_spec(self) -> PrefixStateSpec:
        o = self.options
        return PrefixStateSpec(
            mode=o.state, event_lag_s=self.event_lags(), event_loss=o.event_loss,
            ttl_s=o.eviction_duration_s, capacity_keys=o.block_number, per_worker=False, prune_to=1.0,
            check_interval_s=o.eviction_interval_s, leaves_first=False,
            key_block_tokens=o.prefix_block_chars // CHARS_PER_TOKEN)

    def running(self, view: ClusterView) -> list[int]:
        if self.options.running_requests == "this_gateway":
            return list(self.in_flight)
        return [view.in_flight(w) for w in range(self.num_workers)]

    def match_percents(self, request: Request, view: ClusterView) -> dict[int, int]:
        """Matched pods -> match %, as `PrefixHashTable.MatchPrefix` over all pods (each pod's depth is its own)."""
        key_tokens = (self.options.prefix_block_chars // CHARS_PER_TOKEN if self.prefix.mode == "approximate"
                      else view.cache_block_size())
        num_keys = request.prompt_tokens // key_tokens
        if num_keys == 0:
            return {}  # no full block: no hashes, nothing matches
        matched = self.prefix_tokens(request)
        return {w: (matched[w] // key_tokens) * 100 // num_keys for w in self.workers
                if matched[w] // key_tokens > 0}

    def route(self, request: Request, view: ClusterView) -> int:
        running = self.running(view)
        ready = [running[w] for w in self.workers]
        lo = min(ready)
        least = [w for w in self.workers if running[w] == lo]
        imbalanced = max(ready) - lo > self.options.imbalance_abs_count
        percents = self.match_percents(request, view)
        if imbalanced:
            percents = {w: p for w, p in percents.items() if running[w] == lo}
        if percents:
            target = self._gate(percents, running)
            if target is not None:
                return target
        return self.pick_one(least)

    def _gate(self, percents: dict[int, int], running: list[int]) -> int | None:
        ready = [running[w] for w in self.workers]  # mean and sigma over the ready pods
        mean = sum(ready) / len(ready)
        sigma = sample_stdev(ready) if len(ready) > 1 else 0.0
        bound = mean + self.options.standard_deviation_factor * sigma
        pods = sorted(percents)
        self.rng.shuffle(pods)  # Go map order, then rand.Shuffle: equal (%, running) pairs are in random order
        pods.sort(key=lambda w: (-percents[w], running[w]))  # stable, as sort.SliceStable
        for w in pods:
            if running[w] <= bound:
                return w
        return None


class AibrixLeastKvCacheOptions(LoadOptions):
    scrape_interval_s: float = Field(0.05, ge=0, description="AIBRIX_POD_METRIC_REFRESH_INTERVAL_MS / 1000: the gateway scrapes engine metrics every 50 ms (chart).")


class AibrixLeastKvCacheRouter(RouterBase):
    """AIBrix `least-kv-cache` (least_kv_cache.go `Route`): the pod with the least GPU + CPU KV cache usage
    (`gpu_cache_usage_perc` + `cpu_cache_usage_perc`, as last scraped), scanning the ready pods in list order with
    `total <= min`, so among equal usages the LAST one in the list wins (kvsim: worker order). kvsim engines have no
    CPU KV tier, so the CPU term is 0. A pod with no metrics is skipped (all skipped: a random pod; kvsim always has
    metrics). No prefix state, no router-side load.
    """

    name = "aibrix-least-kv-cache"
    summary = "AIBrix least-kv-cache: argmin scraped GPU + CPU KV usage, last of equals"
    Options = AibrixLeastKvCacheOptions

    def route(self, request: Request, view: ClusterView) -> int:
        interval = self.options.scrape_interval_s
        best, best_usage = self.workers[0], math.inf
        for w in self.workers:  # the ready pods, in list order
            usage = view.scraped_load(w, interval).kv_usage  # + cpu_cache_usage_perc, always 0 here
            if usage <= best_usage:
                best, best_usage = w, usage
        return best
