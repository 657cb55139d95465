"""NVIDIA Dynamo's KV router: its default cost (newest form) or the `lmetric` worker-selection policy.

Sources read (`ai-dynamo/dynamo`): `lib/kv-router/src/scheduling/selector/default.rs` @07a6c9c and @a4bdb9b
(`DefaultWorkerScorer::worker_logit`, `minimum_cost_index`, `softmax_sample_index`),
`lib/kv-router/src/scheduling/selector/mod.rs` @07a6c9c (`WorkerSelectionInput::row`: `raw_prefill_blocks`),
`lib/kv-router/src/scheduling/config.rs` @0243c51 (defaults; `apply_deprecated_overlap_score_weight_override`),
`lib/kv-router/src/approx.rs` @209c9e8 (`PruneConfig`, `PruneManager`), `lib/router-plugins/builtin/src/lmetric.rs`
@6dcfceb and `signals.rs` @6dcfceb (the `lmetric` policy).

Default cost. For each worker w, B the block size (tokens), ISL the prompt tokens, all terms in blocks (floats):

    overlap_w          = the request's leading blocks cached on w, up to w's first miss (`RadixTree::find_matches`:
                         a worker drops out of the walk at the first node it lacks)
    raw_prefill_w      = (active_prefill_tokens_w + ISL) / B          # `raw_prefill_blocks`; ISL/B is not rounded
    credit_w           = overlap_score_credit * overlap_w             # + tiers, below
    adjusted_prefill_w = max(raw_prefill_w - credit_w, 0)
    decode_w           = active_blocks_w + new_blocks_w               # `potential_decode_blocks`
    cost_w             = prefill_load_scale * adjusted_prefill_w + decode_w
argmin with uniform random ties (reservoir sampling) at temperature 0; at T > 0 softmax over
`-(c - c_min) / (T (c_max - c_min))` (uniform if all costs are equal), first w whose cumulative p >= u.
Tiers (Dynamo's tiered matches; `cache_hit_estimates_from_tiered_matches` and `router_credit_blocks` in
`lib/llm/src/kv_router.rs`, defaults in `lib/kv-router/src/scheduling/config.rs`), read from the tiers' KV events
(`sim.routing.tier_index.TierIndex`) only when a weight is set:

    credit_w += host_cache_hit_weight * host_extension_w              # host-tier blocks right after the GPU match
              + shared_cache_multiplier * max(0, shared - overlap_w)  # the shared store's leading run beyond it
Dynamo's defaults are 0.75 and 0; kvsim's host weight defaults to 0, so that routing stays on GPU hits unless the
option is set (`kv-aware:host_cache_hit_weight=0.75`). The disk tier (`disk_cache_hit_weight`) has no kvsim tier.
With the defaults (credit 1, scale 1) this equals the older `overlap_score_weight * (P + ISL - overlap*B)/B + decode`
with weight 1, bit for bit when B is a power of two (every term is then an exact float).
Deprecated `overlap_score_weight = x`: `prefill_load_scale = x`, and x = 0 also sets `overlap_score_credit = 0`
(then no prefix state is read: cost = decode blocks, routing by load only). The `overlap_score_credit_decay` term
(default 0) and `decode_active_request_weight` (newest scorer only) are not modelled.

`router_selection_policy=lmetric` (`lmetric.rs`, "Simple is Better: Multiplication May Be All You Need", arXiv
2603.15202). NOTE: docs/routers/rules.md (Dynamo) gives `adjusted_prefill * (decode_blocks + 1)`; the code is

    new_prefill_w = max(ISL - overlap_w * B, 1)                       # tokens, floored at 1
    score_w       = new_prefill_w * (active_requests_w + 1)            # active_requests = router in-flight
    best          = argmin score_w, ties to the lowest worker (not random; temperature unused)
plus its hot-spot detector (on by default): class = the request's block hash at index `class_prefix_blocks - 1`
(prompts shorter than that have no class and are not counted); over the last `window_requests` classed requests,
x = the class's share, M = workers whose overlap >= class_prefix_blocks, M' the rest. Alarm when
x / (1 - x) > |M| / |M'| (tested as x |M'| > (1 - x) |M|; no alarm if M or M' is empty). A class's streak counts
consecutive alarmed requests whose best worker is in M (reset to 0 otherwise); once streak >= 2|M| the request goes
to the best worker of M' instead (the streak is not reset by that).

Router-side load (Dynamo's active-sequence tracking): at dispatch a request adds ISL - overlap * B prefill tokens
(removed at its first token) and its full-block hashes to the worker's active set (ref-counted, removed at
completion); `active_blocks_w` is that set's size and `new_blocks_w` the request's blocks not in it.

Prefix state (`state`): exact peeks (default here; Dynamo's default is KV events), `events` with optional
`router_predicted_ttl_s` (Dynamo `--router-predicted-ttl-secs`: a routing-time side index kept that long; a worker's
match is the max of both; requires events), or `approximate` (`--no-router-kv-events`) with Dynamo's `PruneConfig`:
each (block, worker) entry expires `router_ttl_s` (120) after it was last inserted (re-insertion refreshes, lookups do
not; expired when now >= insert + ttl); above `router_max_tree_size` (2^20) entries it is pruned to
floor(`router_prune_target_ratio` (0.8) x max), earliest-expiring first and, among equal expiries, the deepest
block first (`BlockEntry` orders by `seq_position` in a max-heap).

Session affinity, as Dynamo 1.6.1 has it: `RouterConfig(session_affinity_ttl_secs=None, session_affinity_mode="hard")`
and `KvRouterConfig(enable_session_prefix_index=False)` (`dynamo/_core.pyi` of PyPI `ai-dynamo-runtime` 1.6.1; flags
`--router-session-affinity-ttl-secs`, `--router-session-affinity-mode`, `--enable-session-prefix-index`). The session
is the `X-Dynamo-Session-ID` header (kvsim: `request.session_id`; a request without one is routed as before). Read in
`lib/kv-router/src/services/selection/affinity.rs` @0a2aa91 (`SessionAffinity::try_acquire`, `commit`,
`AffinityLease::release` / `rebind`), `lib/kv-router/src/scheduling/selector/mod.rs` (`uses_exclusive_affinity_target`:
true for the default selector), `lib/llm/src/kv_router/routing_host.rs` (hard passes the binding as `pinned_worker`,
soft as `affinity_target`), and the docs' "Session Affinity" (`docs/components/router/router-configuration.md`). The
1.6.1 wheel ships no source; its strings name these files and carry their messages ("session affinity miss: pin
expired (idle past TTL), re-selecting worker", "Session affinity hit: reusing pinned worker"). The affinity.rs read
is a later revision (it adds a manual clock for simulation hosts); the rules below are the ones both share. With
`session_affinity_ttl_s` = T:

    binding:   session -> (worker, version, active requests, idle deadline)
    live:      active > 0 or now < idle deadline          (expired: no request in flight and now >= deadline)
    route:     live binding, hard -> its worker, exactly: pinned, the costs are not compared (lmetric's picker and its
                                     hot-spot window do not run)
               live binding, soft -> its worker as an advisory target: the default selector narrows the candidates
                                     to it while it is eligible, so it is chosen; lmetric (a custom policy upstream)
                                     ignores the target and picks as usual
               none or expired    -> the usual choice
    dispatch:  none or expired    -> bind the chosen worker: active 1, idle deadline now + T, a new version
               live               -> active + 1; soft and dispatched elsewhere -> rebind there, a new version
    complete:  active - 1; if the binding is still at the version this request took, idle deadline = now + T

So T is an idle timeout from the end of the session's last response; a request in flight keeps the binding, and an
arrival does not refresh it. Hard and soft differ only when the bound worker is not eligible: gone (hard invalidates
the binding and selects again; soft selects elsewhere and rebinds) or over a busy threshold. kvsim has neither (a
fixed worker set, no busy thresholds), so with the default cost both modes choose alike; with lmetric soft is advisory.
`enable_session_prefix_index` keeps per session and worker the frontier of the session's blocks
(`lib/kv-router/src/session_prefix_index.rs`), fed from routing matches and stored-block events that carry the session
id, written after the worker is chosen ("Indexing failures never affect routing", `KvRouter::find_best_match`) and read
by lineage queries and KV-hint policies, never by the cost: kvsim takes the option and routes the same. Not modelled:
the 65,536-binding cap (a full table routes without affinity), bindings synchronised between router replicas over the
event plane (here each replica keeps its own), and separate prefill/decode bindings.

Membership (Dynamo's KV router watches the workers' instances in discovery): the costs are computed over the current
instances only; an instance that leaves is removed from the indexer (`remove_worker`: its blocks leave the radix
tree) and from the host-tier index, and a new instance starts with none; a worker that left keeps its active blocks
until its requests complete, and is never a candidate meanwhile. Session affinity: a binding whose worker is no
longer routable is not live for routing (hard: invalidated and a worker selected again; soft: selected elsewhere);
the dispatch then rebinds the session to the new worker (a new version, as soft's rebind). The softmax (T > 0) and
lmetric's hot-spot test (holders M, the others M') range over the routable workers.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Literal

from pydantic import Field, model_validator

from policies.active_blocks import ActiveBlocks
from policies.base import PrefixStateOptions, RouterBase
from sim.routing.interface import ClusterView, PrefixStateSpec
from sim.routing.knobs import FloatKnob
from sim.routing.tier_index import TierIndex
from sim.workloads.request import Request


class KvAwareOptions(PrefixStateOptions):
    overlap_score_credit: float = Field(1.0, ge=0, le=1, description="Device-overlap credit per cached block, in [0, 1] (Dynamo --router-kv-overlap-score-credit); 0 = ignore prefix matches.")
    prefill_load_scale: float = Field(1.0, ge=0, description="Scale on the adjusted prefill blocks (Dynamo --router-prefill-load-scale).")
    overlap_score_weight: float | None = Field(None, ge=0, description="Deprecated Dynamo --router-kv-overlap-score-weight x: sets prefill_load_scale = x, and x = 0 also sets overlap_score_credit = 0 (load only, no prefix state).")
    temperature: float = Field(0.0, ge=0, description="Softmax temperature over costs (Dynamo --router-temperature); 0 = argmin with random tie-break.")
    router_selection_policy: Literal["default", "lmetric"] = Field("default", description="Worker selection: Dynamo's default cost, or the built-in lmetric policy (new prefill tokens x (in-flight + 1)).")
    lmetric_hotspot_detection: bool = Field(True, description="lmetric: the hot-spot detector (hotspot_detection).")
    lmetric_class_prefix_blocks: int = Field(4, ge=1, description="lmetric: leading blocks that define a request class (class_prefix_blocks).")
    lmetric_window_requests: int = Field(1000, ge=1, description="lmetric: classed requests over which class shares are measured (window_requests).")
    router_ttl_s: float = Field(120.0, gt=0, description="state=approximate: an entry expires this long after it was last inserted (Dynamo --router-ttl-secs).")
    router_max_tree_size: int = Field(2**20, ge=1, description="state=approximate: (block, worker) entries above which the index is pruned (Dynamo --router-max-tree-size).")
    router_prune_target_ratio: float = Field(0.8, gt=0, le=1, description="state=approximate: prune to this fraction of the max size, earliest-expiring first (Dynamo --router-prune-target-ratio).")
    router_predicted_ttl_s: float | None = Field(None, gt=0, description="state=events: also count the router's own choices for this long (Dynamo --router-predicted-ttl-secs); null = off.")
    session_affinity_ttl_s: int | None = Field(None, ge=1, le=31_536_000, description="Session affinity with this idle TTL (s) from the end of a session's last response (Dynamo --router-session-affinity-ttl-secs); null = off.")
    session_affinity_mode: Literal["hard", "soft"] = Field("hard", description="How a live binding is used (Dynamo --router-session-affinity-mode): hard pins the worker; soft passes it as a target the default cost keeps while eligible and lmetric ignores (then the binding follows the dispatch).")
    router_track_active_blocks: bool = Field(True, description="Count the workers' active (in-flight) blocks in the cost (Dynamo router_track_active_blocks); false: the prefill term alone, as Dynamo's prefill-pool router in disaggregated serving.")
    router_assume_kv_reuse: bool = Field(True, description="A request's blocks already active on a worker are not new there (Dynamo router_assume_kv_reuse); false: every block counts as new, as Dynamo's decode-pool router.")
    host_cache_hit_weight: float = Field(0.0, ge=0, description="Credit per block of a worker's host (CPU) tier that extends its GPU match, from the tier's KV events (Dynamo --router-host-cache-hit-weight, default 0.75 there; kvsim's 0 routes on GPU hits only, as before tiers were indexed).")
    shared_cache_multiplier: float = Field(0.0, ge=0, description="Credit per block the cluster-shared store holds beyond a worker's GPU match (Dynamo shared_cache_multiplier, default 0).")
    enable_session_prefix_index: bool = Field(False, description="Dynamo --enable-session-prefix-index: a per-session lineage index written after routing, read by KV-hint policies, not by the cost (kvsim routes the same).")

    @model_validator(mode="after")
    def _predicted_needs_events(self) -> KvAwareOptions:
        if self.router_predicted_ttl_s is not None and self.state != "events":
            raise ValueError(f"router_predicted_ttl_s needs state=events (Dynamo requires use_kv_events), "
                             f"got state={self.state}")
        return self


class _HotspotDetector:
    """lmetric's sliding window over the last `window_requests` classed arrivals: per class its arrivals in the
    window and its streak of alarmed requests whose best worker held the class."""

    def __init__(self, window_requests: int) -> None:
        self.window_requests = window_requests
        self.window: deque[Hashable] = deque()
        self.arrivals: dict[Hashable, int] = {}
        self.streak: dict[Hashable, int] = {}

    def record(self, cls: Hashable) -> float:
        """Count one arrival of `cls` (dropping the oldest past the window); its share of the window now."""
        window = self.window
        if len(window) == self.window_requests:
            expired = window.popleft()
            left = self.arrivals[expired] - 1
            if left:
                self.arrivals[expired] = left
            else:
                del self.arrivals[expired]
                self.streak.pop(expired, None)  # Dynamo drops the class state with its last arrival
        window.append(cls)
        self.arrivals[cls] = self.arrivals.get(cls, 0) + 1
        return self.arrivals[cls] / len(window)


@dataclass(slots=True)
class _SessionBinding:
    """A session's binding (Dynamo's `AffinityEntry::Bound`): its worker, version, requests in flight (leases) and the
    time from which, with none in flight, it has expired."""

    worker: int
    version: int
    active_requests: int
    idle_deadline_s: float


class KvAwareRouter(RouterBase):
    """Dynamo's KV router: default cost (see the module docstring for the arithmetic) or lmetric.

    Invariants: `_prefill_tokens[w]` is the sum of pending prefill tokens of requests dispatched to w and not yet at
    their first token; `_active[w]` holds the block hashes of w's in-flight requests, ref-counted.
    """

    name = "kv-aware"
    summary = "Dynamo KV router: prefill blocks after overlap credit + active blocks (or lmetric)"
    Options = KvAwareOptions
    # NOTE: overlap_score_weight is left out: it only aliases prefill_load_scale (and credit 0 at 0).
    search_space = (FloatKnob("prefill_load_scale", 0, 16), FloatKnob("overlap_score_credit", 0, 1),
                    FloatKnob("temperature", 0, 1))
    needs_cache_state = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        opts = self.options
        self.overlap_score_credit = opts.overlap_score_credit
        self.prefill_load_scale = opts.prefill_load_scale
        if opts.overlap_score_weight is not None:  # Dynamo's deprecated-flag mapping (config.rs)
            self.prefill_load_scale = opts.overlap_score_weight
            if opts.overlap_score_weight == 0:
                self.overlap_score_credit = 0.0
        self._tiers: TierIndex | None = None
        self._prefill_tokens = [0] * self.num_workers
        self._active = [ActiveBlocks() for _ in range(self.num_workers)]
        self._pending_prefill: dict[int, int] = {}
        self._chosen_overlap: dict[int, int] = {}
        self._hotspots = (_HotspotDetector(opts.lmetric_window_requests)
                          if opts.router_selection_policy == "lmetric" and opts.lmetric_hotspot_detection else None)
        self._sessions: dict[int, _SessionBinding] = {}
        self._leases: dict[int, tuple[int, int]] = {}  # request id -> (session, the binding version it took)
        self._binding_versions = 0
        self._next_reap_s = 0.0

    def bind(self, view: ClusterView) -> None:
        super().bind(view)
        opts = self.options
        self._tiers = TierIndex(view) if opts.host_cache_hit_weight or opts.shared_cache_multiplier else None

    def prefix_state_spec(self) -> PrefixStateSpec:
        opts = self.options
        if opts.state == "approximate":
            return PrefixStateSpec(mode="approximate", ttl_s=opts.router_ttl_s, capacity_keys=opts.router_max_tree_size,
                                   prune_to=opts.router_prune_target_ratio, check_interval_s=0.0, leaves_first=True)
        if opts.state == "events":
            return PrefixStateSpec(mode="events", event_lag_s=self.event_lags(), event_loss=opts.event_loss,
                                   predicted_ttl_s=opts.router_predicted_ttl_s)
        return PrefixStateSpec(mode="exact")

    def overlaps(self, request: Request, view: ClusterView) -> list[int]:
        if self.overlap_score_credit == 0 and self.options.router_selection_policy == "default":
            return [0] * self.num_workers  # nothing to credit: Dynamo's load-only routing reads no prefix state
        B = self.block_size
        return [t // B for t in self.prefix_tokens(request)]

    def costs(self, request: Request, view: ClusterView) -> tuple[list[float], list[int]]:
        """Per worker the cost (lmetric: score) the policy minimises, and the overlaps (blocks) it used."""
        overlap = self.overlaps(request, view)
        if self.options.router_selection_policy == "lmetric":
            return self._lmetric_scores(request, overlap), overlap
        B = self.block_size
        isl = request.prompt_tokens
        credit, scale = self.overlap_score_credit, self.prefill_load_scale
        costs = []
        hashes = request.block_hashes
        track_active, assume_reuse = self.options.router_track_active_blocks, self.options.router_assume_kv_reuse
        tier_credit = self._tier_credit(request, overlap) if self._tiers is not None else None
        for w in range(self.num_workers):
            active = self._active[w]
            raw_prefill_blocks = (self._prefill_tokens[w] + isl) / B
            credit_blocks = credit * overlap[w] if tier_credit is None else credit * overlap[w] + tier_credit[w]
            adjusted_prefill_blocks = max(raw_prefill_blocks - credit_blocks, 0.0)
            if not track_active:
                costs.append(scale * adjusted_prefill_blocks)
                continue
            new_blocks = len(hashes) - active.held(hashes) if assume_reuse else len(hashes)
            costs.append(scale * adjusted_prefill_blocks + len(active) + new_blocks)
        return costs, overlap

    def _tier_credit(self, request: Request, overlap: list[int]) -> list[float]:
        """Per worker the credit of its tiers beyond the GPU match (Dynamo `router_credit_blocks` less the device
        term, `lib/llm/src/kv_router.rs`): host_cache_hit_weight x host extension + shared_cache_multiplier x the
        shared store's blocks beyond the device match."""
        tiers, keys = self._tiers, self.view.cache_block_keys(request)
        host_w, shared_w = self.options.host_cache_hit_weight, self.options.shared_cache_multiplier
        shared = tiers.shared_blocks(keys) if shared_w else 0
        return [host_w * tiers.host_extension_blocks(w, keys, overlap[w]) + shared_w * max(0, shared - overlap[w])
                for w in range(self.num_workers)]

    def _lmetric_scores(self, request: Request, overlap: list[int]) -> list[float]:
        B, isl = self.block_size, request.prompt_tokens
        return [float(max(isl - overlap[w] * B, 1) * (self.in_flight[w] + 1)) for w in range(self.num_workers)]

    def route(self, request: Request, view: ClusterView) -> int:
        costs, overlap = self.costs(request, view)
        bound = self._live_binding(request, view.now_s)
        if bound is not None and bound.worker not in self.workers:
            bound = None  # its worker left: select again (the dispatch rebinds the session)
        lmetric = self.options.router_selection_policy == "lmetric"
        if bound is not None and (self.options.session_affinity_mode == "hard" or not lmetric):
            worker = bound.worker  # hard: pinned; soft: the default selector's exclusive affinity target
        elif lmetric:
            worker = self._lmetric_pick(request, costs, overlap)
        else:
            worker = self._select(costs)
        self._chosen_overlap[request.request_id] = overlap[worker]
        return worker

    # ------------------------------------------------------------------ session affinity
    def _live_binding(self, request: Request, now_s: float) -> _SessionBinding | None:
        """The session's binding if affinity is on and it has not expired (module docstring)."""
        if self.options.session_affinity_ttl_s is None or request.session_id is None:
            return None
        binding = self._sessions.get(request.session_id)
        if binding is None or (binding.active_requests == 0 and binding.idle_deadline_s <= now_s):
            return None
        return binding

    def _commit_session(self, request: Request, worker: int) -> None:
        now_s = self.view.now_s
        self._reap(now_s)
        binding = self._live_binding(request, now_s)
        if binding is None:
            self._binding_versions += 1
            binding = _SessionBinding(worker, self._binding_versions, 0, now_s + self.options.session_affinity_ttl_s)
            self._sessions[request.session_id] = binding
        elif binding.worker != worker:  # only soft with lmetric dispatches a bound session elsewhere
            self._binding_versions += 1
            binding.worker, binding.version = worker, self._binding_versions
        binding.active_requests += 1
        self._leases[request.request_id] = (request.session_id, binding.version)

    def _release_session(self, request: Request) -> None:
        lease = self._leases.pop(request.request_id, None)
        if lease is None:
            return
        binding = self._sessions.get(lease[0])
        if binding is None or binding.active_requests == 0:
            return
        binding.active_requests -= 1
        if binding.version == lease[1]:
            binding.idle_deadline_s = self.view.now_s + self.options.session_affinity_ttl_s

    def _reap(self, now_s: float) -> None:
        """Forget expired bindings every min(T, 30 s) (Dynamo's reaper period), so that ended sessions do not
        accumulate; an expired binding routes as none whether or not it was reaped yet."""
        if now_s < self._next_reap_s:
            return
        self._next_reap_s = now_s + min(self.options.session_affinity_ttl_s, 30)
        self._sessions = {s: b for s, b in self._sessions.items()
                          if b.active_requests or b.idle_deadline_s > now_s}

    def _lmetric_pick(self, request: Request, scores: list[float], overlap: list[int]) -> int:
        workers = self.workers
        best = min(workers, key=scores.__getitem__)  # first minimum: the lowest worker wins ties
        detector = self._hotspots
        k = self.options.lmetric_class_prefix_blocks
        if detector is None or len(request.block_hashes) < k:
            return best
        cls = request.block_hashes[k - 1]  # a chained hash: it names the whole k-block prefix
        holds = [o >= k for o in overlap]
        holders = sum(holds[w] for w in workers)
        others = len(workers) - holders
        share = detector.record(cls)
        if holders == 0 or others == 0 or share * others <= (1 - share) * holders or not holds[best]:
            detector.streak[cls] = 0
            return best
        streak = detector.streak.get(cls, 0) + 1
        detector.streak[cls] = streak
        if streak < 2 * holders:
            return best
        return min((w for w in workers if not holds[w]), key=scores.__getitem__)

    def _select(self, costs: list[float]) -> int:
        """argmin over the routable workers (random ties), or the softmax over them at T > 0."""
        workers = self.workers
        routable = [costs[w] for w in workers]
        lo, hi = min(routable), max(routable)
        if self.options.temperature > 0 and hi > lo:
            t = self.options.temperature
            weights = [math.exp(-(c - lo) / (t * (hi - lo))) for c in routable]
            u = self.rng.random() * sum(weights)
            acc = 0.0
            for w, p in zip(workers, weights):
                acc += p
                if acc >= u:
                    return w
            return workers[-1]
        return self.random_argmin(costs)

    def after_set_workers(self, left, joined, renewed) -> None:
        if self._tiers is not None:
            for w in sorted(set(left) | set(renewed)):
                self._tiers.remove_worker(w)

    def after_dispatch(self, request: Request, worker: int) -> None:
        overlap = self._chosen_overlap.pop(request.request_id, 0)
        tokens = max(request.prompt_tokens - overlap * self.block_size, 0)
        self._pending_prefill[request.request_id] = tokens
        self._prefill_tokens[worker] += tokens
        self._active[worker].add(request.block_hashes)
        if self.options.session_affinity_ttl_s is not None and request.session_id is not None:
            self._commit_session(request, worker)

    def after_first_token(self, request: Request, worker: int) -> None:
        self._prefill_tokens[worker] -= self._pending_prefill.pop(request.request_id, 0)

    def after_complete(self, request: Request, worker: int) -> None:
        self.after_first_token(request, worker)
        self._active[worker].remove(request.block_hashes)
        self._release_session(request)
