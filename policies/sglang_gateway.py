"""SGLang Model Gateway's default policy, `cache_aware` (an approximate radix tree of routed request text per worker).

Upstream read:
* sgl-project/sglang `sgl-model-gateway/src/policies/cache_aware.rs` @b93974f1 and @053b63ff, `tree.rs` @24ce7f6c,
  older `sgl-router/src/policies/cache_aware.rs` @026f853b; CLI defaults
  `sgl-model-gateway/bindings/python/src/sglang_router/router_args.py`.
* smg-project/smg (the gateway's continuation) `model_gateway/src/policies/cache_aware.rs`, `crates/kv_index/src/
  string_tree.rs`, `bindings/python/src/smg/router_args.py`: @3d145182 (after PR #1621 token-usage guards, #1714
  min-load tie-break, #2137 shared tree budget; before #2161) and HEAD @f8daa883 (2026-08-22, after #2161).

Membership: the gateway routes among its healthy workers (the worker registry's current list), so the imbalance
test, the min-load fallback, the KV-usage guards and the matched tenants range over the routable workers. A worker
removed from the registry is removed from the tree: `CacheAwarePolicy::remove_worker` -> `tree.remove_tenant(url)`
(sgl-model-gateway `src/policies/cache_aware.rs`; smg: "Remove a worker from the model-scoped trees as soon as it
drains"), which drops its characters from every node and its size. A new worker is added as an empty tenant
(`tree.insert("", url)`) with no requests processed.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from policies.base import LoadOptions, PrefixStateOptions, RouterBase
from policies.prefix_hash import stable_hash64
from sim.routing.interface import ClusterView, PrefixStateSpec, StateMode
from sim.routing.knobs import ChoiceKnob, FloatKnob, IntKnob
from sim.workloads.request import Request

CHARS_PER_TOKEN = 4
"""kvsim models request text as 4 characters a token."""

MATCHED_TENANTS_CAP = 8
"""smg `kv_index::MATCHED_TENANTS_CAP`: at most this many holders of the matched node are candidates (PR #2161)."""


class SglangCacheAwareOptions(PrefixStateOptions, LoadOptions):
    state: StateMode = Field("approximate", description="cache_aware keeps only its own approximate tree (approximate); exact/events are what-ifs.")
    cache_threshold: float = Field(0.3, ge=0, le=1, description="--cache-threshold: route to the matched tenant only if matched/len(text) exceeds this.")
    balance_abs_threshold: int = Field(64, ge=0, description="--balance-abs-threshold: imbalanced needs max_load - min_load > this (in-flight requests).")
    balance_rel_threshold: float = Field(1.5, ge=0, description="--balance-rel-threshold: imbalanced also needs max_load > this x min_load.")
    eviction_interval_secs: float = Field(60, ge=0, description="--eviction-interval-secs: the tree's LRU eviction runs every this many seconds (0: no eviction thread, the tree never shrinks).")
    max_tree_size: int = Field(2**26, ge=1, description="--max-tree-size, in characters (4 a token): per tenant (sglang) or for the whole tree (smg, tree_budget=shared).")
    balance_token_usage_threshold: float = Field(1.0, ge=0, le=1, description="--balance-token-usage-threshold (smg PR #1621): imbalanced if max - min scraped KV usage exceeds this; 1.0 = off.")
    overload_token_usage_threshold: float = Field(1.0, ge=0, le=1, description="--overload-token-usage-threshold (smg PR #1621): imbalanced if any scraped KV usage exceeds this; 1.0 = off.")
    scrape_interval_s: float = Field(10.0, ge=0, description="smg --load-monitor-interval: KV usage (token_usage) is polled every this many seconds (read only when a token-usage guard is on).")
    miss_fallback: Literal["min_load", "smallest_tree"] = Field("min_load", description="Below the threshold: min_load = sgl-model-gateway / smg (argmin in-flight); smallest_tree = older sgl-router (tenant with the fewest characters).")
    match_tenant: Literal["hash_order", "first_inserted"] = Field("hash_order", description="Which holder of the deepest matched node a match returns: hash_order = first key of its hash map (sglang tree.rs), first_inserted = the node's creator while it still holds it (smg last_tenant cache).")
    min_load_tie: Literal["first", "fewest_processed"] = Field("first", description="argmin-load ties: first in worker order (sglang min_by_key) or fewest requests routed so far, then worker order (smg PR #1714).")
    tree_budget: Literal["per_tenant", "shared"] = Field("per_tenant", description="max_tree_size per tenant (sglang) or one budget for the whole tree, LRU leaves across tenants (smg PR #2137).")
    load_gate: Literal["global", "per_request"] = Field("global", description="global = the request-count imbalance switch over all workers (sglang, smg before #2161); per_request = smg PR #2161: least-loaded of up to 8 matched tenants, spilled to min-load if its load > rel x mean and > mean + abs.")


class SglangCacheAwareRouter(RouterBase):
    """SGLang Model Gateway `cache_aware`: a load-imbalance switch in front of a prefix match on the router's own
    approximate tree of routed text. Per request, with load_w = this router's in-flight requests to worker w:

        imbalanced = (max_w load - min_w load) > balance_abs_threshold
                     and max_w load > balance_rel_threshold * min_w load                  # over all workers
                     or max_w kv_w > overload_token_usage_threshold                       # smg #1621, off at 1.0
                     or max_w kv_w - min_w kv_w > balance_token_usage_threshold           # smg #1621, off at 1.0
        if imbalanced:   w = argmin load (first minimum in worker order)
        else:
            matched = deepest prefix of the text any worker holds in the tree; rate = matched / len(text)
            w = tenant(matched node) if rate > cache_threshold else argmin load   (miss_fallback=smallest_tree:
                                                                                   the tenant with the fewest chars)
        tree.insert(text, w)   # in both branches (the base records the request for w at dispatch)

    e.g. defaults, 6 idle workers, a 2371-token prompt whose 127 x 16 = 2032 leading tokens worker 4 holds in the tree:
    rate = 2032 / 2371 = 0.857 > 0.3 -> worker 4; with worker 4 at 100 in flight and the others at 20: 100 - 20 = 80 > 64
    and 100 > 1.5 x 20 -> imbalanced -> worker 0 (the first minimum), and the tree now records the prompt for worker 0
    as well.

    Text and granularity: the upstream tree is over characters; kvsim models 4 characters a token and keys the tree
    by the request's 16-token blocks (64 characters). A character tree also matches partially inside a block; this
    model matches whole blocks only, and drops each prompt's partial last block: the match error is < 16 tokens per
    request (rate and tree sizes alike). `max_tree_size` characters = max_tree_size / 4 / 16 keys (2^26 -> 2^20 keys).

    The tree as a `RoutingHistory` (state=approximate): per worker (`tree_budget=per_tenant`, sglang's
    `tenant_char_count` per tenant) or shared (smg #2137), capacity max_tree_size/64 keys, enforced only every
    `eviction_interval_secs` from t = 0 (the eviction thread), LRU leaves first, down to the budget itself (prune_to
    1); with `eviction_interval_secs` 0 there is no thread and the tree only grows. No TTL; engine evictions are never
    seen. An insert refreshes every node of the path (sglang `Tree::insert`).

    The tenant of a match: upstream returns the first key of the deepest matched node's tenant map, a DashMap whose
    iteration order is its hash order: arbitrary, but fixed for a node while its tenant set is unchanged. Modelled
    (`match_tenant=hash_order`) as the holder with the smallest 64-bit hash of (salt, node key, worker), the salt
    drawn once from the router's rng (a new process, a new order). `first_inserted` is smg's `last_tenant` cache:
    the worker that first inserted the node, while it still holds it (else hash order, which then becomes cached).

    Doc/code notes (followed the code):
    * docs/routers/rules.md (SGLang cache_aware) says the miss fallback is "smallest: tenant with fewest chars"; that is the older sgl-router
      (`tree.get_smallest_tenant()`). sgl-model-gateway and smg take argmin load (`min_by_key(load)`): the default.
    * smg HEAD (PR #2161) removes the request-count switch: only the KV-usage guards are global; a hit picks the
      least-loaded (uniform random among ties) of up to 8 matched tenants, and the pick spills to the min-load worker
      if its load > balance_rel_threshold x mean and > mean + balance_abs_threshold (`load_gate=per_request`). smg's
      current launch = load_gate=per_request, min_load_tie=fewest_processed, tree_budget=shared,
      match_tenant=first_inserted.
    * smg's `--max-tree-size` is a shared per-model budget since PR #2137 (2026-08-13); sglang's is per tenant.
    Left alone: sglang `prefix_match` also refreshes the matched tenant's path timestamps (a lookup touch, here
    only inserts refresh); smg attaches intermediate nodes with timestamp 0 and stamps only the leaf; the byte vs
    character rate (identical for ASCII); smg's event-driven (gRPC + KV events) and hash-index modes; PD-mode text.
    """

    name = "sglang-cache-aware"
    summary = "SGLang gateway cache_aware: imbalance switch, else approximate-tree match > 0.3 or least in-flight"
    Options = SglangCacheAwareOptions
    search_space = (FloatKnob("cache_threshold", 0, 1), IntKnob("balance_abs_threshold", 0, 64),
                    FloatKnob("balance_rel_threshold", 1, 4), ChoiceKnob("min_load_tie", ("first", "fewest_processed")))
    needs_cache_state = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        opts = self.options
        if opts.miss_fallback == "smallest_tree" and opts.state != "approximate":
            raise ValueError("miss_fallback=smallest_tree: needs state=approximate (the tree's own sizes)")
        self._salt = self.rng.getrandbits(64)
        self.processed = [0] * self.num_workers
        """Requests this router sent to each worker so far (smg `increment_processed`, the #1714 tie-break)."""
        self._creator: dict = {}
        self._reads_kv = opts.balance_token_usage_threshold < 1.0 or opts.overload_token_usage_threshold < 1.0

    # ------------------------------------------------------------------ what the router sees
    def prefix_state_spec(self) -> PrefixStateSpec:
        opts = self.options
        key_block_tokens = self.block_size  # match granularity: the requests' own blocks (16 tokens, 64 chars)
        if opts.state != "approximate":
            return PrefixStateSpec(mode=opts.state, event_lag_s=opts.event_lag_s, event_loss=opts.event_loss,
                                   key_block_tokens=key_block_tokens)
        capacity = None
        if opts.eviction_interval_secs > 0:
            capacity = max(1, opts.max_tree_size // CHARS_PER_TOKEN // key_block_tokens)
        return PrefixStateSpec(mode="approximate", capacity_keys=capacity, per_worker=opts.tree_budget == "per_tenant",
                               prune_to=1.0, check_interval_s=float(opts.eviction_interval_secs), leaves_first=True,
                               key_block_tokens=key_block_tokens)

    def node_key(self, request: Request, matched_tokens: int):
        """The identity of the tree node a match of `matched_tokens` ends in: the chained hash of its last block
        (exact/events state may match a partial first block, at an engine page size below 16: a head node)."""
        i = matched_tokens // self.block_size - 1
        return request.block_hashes[i] if i >= 0 else ("head", matched_tokens)

    def hash_order(self, request: Request, matched_tokens: int, workers: list[int]) -> list[int]:
        """`workers` in the tenant-map order of the node that ends `matched_tokens` into the request."""
        node = self.node_key(request, matched_tokens)
        salt = self._salt
        return sorted(workers, key=lambda w: stable_hash64((salt, node, w)))

    def min_load_worker(self) -> int:
        load = self.in_flight
        if self.options.min_load_tie == "fewest_processed":
            return min(self.workers, key=lambda w: (load[w], self.processed[w], w))
        return min(self.workers, key=load.__getitem__)  # first minimum, as Rust's min_by_key

    def kv_imbalanced(self, view: ClusterView) -> bool:
        if not self._reads_kv:
            return False
        opts = self.options
        usage = [view.scraped_load(w, opts.scrape_interval_s).kv_usage for w in self.workers]
        return max(usage) > opts.overload_token_usage_threshold or \
            max(usage) - min(usage) > opts.balance_token_usage_threshold

    def count_imbalanced(self) -> bool:
        opts = self.options
        loads = [self.in_flight[w] for w in self.workers]
        hi, lo = max(loads), min(loads)
        return hi - lo > opts.balance_abs_threshold and hi > opts.balance_rel_threshold * lo

    # ------------------------------------------------------------------ decision
    def route(self, request: Request, view: ClusterView) -> int:
        opts = self.options
        global_gate = opts.load_gate == "global"
        if self.kv_imbalanced(view) or (global_gate and self.count_imbalanced()):
            return self.min_load_worker()
        matched = self.prefix_tokens(request)
        best = max(matched[w] for w in self.workers)
        rate = best / request.prompt_tokens
        if best == 0 or rate <= opts.cache_threshold:
            if opts.miss_fallback == "smallest_tree":
                return self.smallest_tree_worker(view)
            return self.min_load_worker()
        holders = [w for w in self.workers if matched[w] == best]
        if global_gate:
            return self.match_tenant(request, best, holders)
        return self.gated_pick(request, best, holders)

    def match_tenant(self, request: Request, matched_tokens: int, holders: list[int]) -> int:
        if len(holders) == 1:
            return holders[0]
        if self.options.match_tenant == "first_inserted":
            node = self.node_key(request, matched_tokens)
            creator = self._creator.get(node)
            if creator in holders:
                return creator
            tenant = self.hash_order(request, matched_tokens, holders)[0]
            self._creator[node] = tenant  # smg re-populates its stale last_tenant cache from the map order
            return tenant
        return self.hash_order(request, matched_tokens, holders)[0]

    def gated_pick(self, request: Request, matched_tokens: int, holders: list[int]) -> int:
        """smg PR #2161: least-loaded of the matched tenants (ties uniformly at random), then the load gate."""
        opts = self.options
        load = self.in_flight
        candidates = self.hash_order(request, matched_tokens, holders)[:MATCHED_TENANTS_CAP]
        pick = self.random_argmin(load, candidates)
        mean = sum(load[w] for w in self.workers) / len(self.workers)
        if load[pick] > mean * opts.balance_rel_threshold and load[pick] > mean + opts.balance_abs_threshold:
            return self.min_load_worker()
        return pick

    def smallest_tree_worker(self, view: ClusterView) -> int:
        history = self.prefix.history
        now = view.now_s
        sizes = [history.keys_held(w, now) for w in range(self.num_workers)]
        # NOTE: upstream iterates a DashMap of tenant sizes (hash order); ties here go to the first worker.
        return min(self.workers, key=sizes.__getitem__)

    def after_set_workers(self, left, joined, renewed) -> None:
        # The tree forgot the left tenants (the base's prefix state); a new worker has processed nothing, and a node's
        # first inserter that left is no longer its `last_tenant`.
        for w in renewed:
            self.processed[w] = 0
        gone = set(left) | set(renewed)
        if gone and self._creator:
            self._creator = {node: w for node, w in self._creator.items() if w not in gone}

    def after_dispatch(self, request: Request, worker: int) -> None:
        self.processed[worker] += 1
        if self.options.match_tenant == "first_inserted":
            setdefault = self._creator.setdefault
            for key in request.block_hashes:
                setdefault(key, worker)
