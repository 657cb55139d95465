"""vLLM production-stack router (`vllm_router`): `session`, `prefixaware` and `loadaware` routing logics.

Read from github:vllm-project/production-stack @a6c01db05f65f556235413ba8dbcfb0c01132fff (2026-08-05):
`src/vllm_router/routers/routing_logic.py` (RoutingInterface._qps_routing, SessionRouter, PrefixAwareRouter),
`src/vllm_router/prefix/hashtrie.py` (HashTrie), `src/vllm_router/stats/request_stats.py` (RequestStatsMonitor).
`loadaware` (LoadAwareRouter, PR #1035, merged 2026-08-09, after that snapshot) was read from the merged
`routing_logic.py` as stored in the code index and from the PR thread. The session ring follows uhashring
(github:ultrabug/uhashring @9c0e25c11b957f3ced5e2d4cccad9605ae8c3109, `uhashring/ring.py`, `ring_meta.py`).
The session key: `RoutingInterface.extract_session_id` reads the `--session-key` header (then the body field of that
name); the router refuses to start `session` without `--session-key` (`parsers/parser.py`); the tutorials and the
multi-round QA benchmark send `x-user-id` (`tutorials/08-benchmark-multi-round-qa-multi-gpu.md`).

Membership (the router's service discovery lists the current endpoints; every routing logic is handed that list per
request): `session` updates its uhashring ring to the current endpoint URLs (`SessionRouter._update_hash_ring`:
removes the nodes that left, adds the new ones), so only the sessions of a departed endpoint move and a new endpoint
takes only the sessions whose ring position it now owns; `prefixaware` matches the trie against the current endpoints
only (the trie keeps a departed endpoint's URL, which no later pod reuses: kvsim drops its entries, which routes the
same); `_qps_routing` scans the current endpoints, and a new endpoint has no request stats yet, so it is taken first.
"""

from __future__ import annotations

import bisect
import hashlib
from collections import deque

from pydantic import Field

from policies.base import PrefixStateOptions, RouterBase, RouterOptions, session_key
from sim.routing.interface import ClusterView, PrefixStateSpec
from sim.routing.knobs import FloatKnob, IntKnob
from sim.workloads.request import Request

CHARS_PER_TOKEN = 4
"""kvsim models text as 4 characters a token (the trie chunks characters of the prompt)."""


class ProductionStackOptions(RouterOptions):
    request_stats_window_s: float = Field(60.0, gt=0, description="--request-stats-window: the sliding window (s) of the arrival QPS that _qps_routing compares.")


class _ProductionStackRouter(RouterBase):
    """What every production-stack routing logic shares: the router's own `RequestStatsMonitor` (per router
    process; kvsim: per router replica) and its `_qps_routing` fallback.

    An endpoint has stats from the first request this router sent it (for ever after, even once its window is
    empty). `qps(w)` = arrivals at w with time >= now - window, divided by the window. `_qps_routing` scans the
    endpoints in order (kvsim: worker order) and returns the first one with no stats at once; otherwise the
    endpoint with the strictly lowest qps, the first of equals. Engine stats (scraped every 30 s) are not read.
    """

    Options = ProductionStackOptions

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._arrivals_s: list[deque[float]] = [deque() for _ in range(self.num_workers)]
        self._has_stats = [False] * self.num_workers
        self._now_s = 0.0

    def qps(self, worker: int, now_s: float) -> float:
        arrivals = self._arrivals_s[worker]
        start = now_s - self.options.request_stats_window_s
        while arrivals and arrivals[0] < start:  # MovingAverageMonitor pops timestamps < now - window
            arrivals.popleft()
        return len(arrivals) / self.options.request_stats_window_s

    def qps_routing(self, now_s: float) -> int:
        best, lowest = self.workers[0], float("inf")
        for w in self.workers:
            if not self._has_stats[w]:
                return w
            q = self.qps(w, now_s)
            if q < lowest:
                best, lowest = w, q
        return best

    def route(self, request: Request, view: ClusterView) -> int:
        # The router computes request_stats at each request (get_request_stats(time.time())), whatever the logic.
        self._now_s = view.now_s
        return self.choose(request, view)

    def choose(self, request: Request, view: ClusterView) -> int:
        raise NotImplementedError

    def after_set_workers(self, left, joined, renewed) -> None:
        for w in renewed:  # a new endpoint URL: no request stats yet
            self._has_stats[w] = False
            self._arrivals_s[w].clear()

    def after_dispatch(self, request: Request, worker: int) -> None:
        self._has_stats[worker] = True
        self._arrivals_s[worker].append(self._now_s)  # on_new_request(url, id, time of routing)


def _md5_int(text: str) -> int:
    return int(hashlib.md5(text.encode("utf-8")).hexdigest(), 16)


class SessionOptions(ProductionStackOptions):
    vnodes: int = Field(160, ge=1, description="Ring points per endpoint: uhashring HashRing() default (160 with its default md5 hash; 40 with hash_fn='ketama').")


class VllmRouterSession(_ProductionStackRouter):
    """production-stack `session` (SessionRouter): the session id (the `--session-key` header, else the body field;
    kvsim: `policies.base.session_key`, the request's session, or its `prefix_id` in a workload without sessions) is
    placed on a uhashring `HashRing()` of the endpoints (`hash_ring.get_node(session_id)`); no session id ->
    `_qps_routing`. No load bound and no state: a session always goes to its ring node, whatever the load or the gap.

    Ring, as uhashring's default MetaRing: endpoint e gets `vnodes` points md5(f"{e}-{i}") (128-bit int),
    i = 0..vnodes-1; a key k goes to the point at bisect_right(points, md5(str(k))), wrapping to the first point.
    kvsim names endpoint w `worker-{w}` (the real ring hashes endpoint URLs, so which endpoint owns a session depends
    on the URLs; the spread is the same in kind). The ring is rebuilt when the endpoint set changes; kvsim's is fixed.
    """

    name = "vllm-router-session"
    summary = "vLLM production-stack session: uhashring consistent hash of the session key, else lowest QPS"
    Options = SessionOptions

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._build_ring()

    def _build_ring(self) -> None:
        """The ring of the routable endpoints, each named by its instance id (`worker-{instance}`: a fixed fleet's
        instance ids are its worker indices). uhashring's ring is a function of its node set, so rebuilding it equals
        `_update_hash_ring`'s remove/add."""
        ring: dict[int, int] = {}
        for w, instance in zip(self.workers, self.instances):
            for i in range(self.options.vnodes):
                ring[_md5_int(f"worker-{instance}-{i}")] = w  # a colliding point is the later node's, as a dict keeps it
        self._points = sorted(ring)
        self._owners = [ring[p] for p in self._points]

    def after_set_workers(self, left, joined, renewed) -> None:
        super().after_set_workers(left, joined, renewed)
        self._build_ring()

    def ring_node(self, session_id: object) -> int:
        pos = bisect.bisect_right(self._points, _md5_int(str(session_id)))
        return self._owners[0 if pos == len(self._points) else pos]

    def choose(self, request: Request, view: ClusterView) -> int:
        key = session_key(request)
        if key is None:
            return self.qps_routing(self._now_s)
        return self.ring_node(key)


class PrefixAwareOptions(ProductionStackOptions):
    prefix_min_match_length: int = Field(0, ge=0, description="--prefix-min-match-length (characters): a longest match shorter than this falls back to _qps_routing (0: never).")
    chunk_chars: int = Field(128, ge=4, multiple_of=4, description="HashTrie chunk_size in characters (128, hard-coded upstream = 32 tokens at 4 characters a token); the tokens must be a multiple of the request block size.")


class VllmRouterPrefixAware(_ProductionStackRouter):
    """production-stack `prefixaware` (PrefixAwareRouter over HashTrie): the prompt is cut into `chunk_chars`
    character chunks; the trie walks them from the root while the endpoints recorded at the next node still
    intersect the endpoints selected so far (initially all available ones), narrowing the selection at each step:

        match_length = matched chunks x chunk_chars (characters)
        selected     = the endpoints that hold every matched chunk (all endpoints if none matched)

    If match_length < `prefix_min_match_length` -> `_qps_routing`; else a uniformly random endpoint of `selected`
    (so a miss is uniformly random). Either way the prompt is then inserted for the chosen endpoint. The trie never
    forgets (no TTL, no size limit, blind to engine evictions) and reads no load.

    kvsim: chunks are `chunk_chars / 4`-token keys of the routing history (`RoutingHistory` with no TTL and no
    capacity); `selected` = the workers at the deepest depth. Upstream also hashes the prompt's last partial chunk
    (it can match only an identical prompt tail); kvsim keys whole chunks only.
    """

    name = "vllm-router-prefix-aware"
    summary = "vLLM production-stack prefixaware: 128-char chunk trie, random among longest-match holders"
    Options = PrefixAwareOptions
    # Characters; 0 = always follow the longest match (the reference prompt is ~9,500 characters).
    search_space = (IntKnob("prefix_min_match_length", 0, 8192),)
    needs_cache_state = True

    def prefix_state_spec(self) -> PrefixStateSpec:
        return PrefixStateSpec(mode="approximate", ttl_s=None, capacity_keys=None,
                               key_block_tokens=self.options.chunk_chars // CHARS_PER_TOKEN)

    def longest_match(self, request: Request) -> tuple[int, list[int]]:
        """(match length in characters, the selected endpoints)."""
        matched = self.prefix_tokens(request)
        workers = self.workers
        deepest = max(matched[w] for w in workers)
        if deepest == 0:
            return 0, list(workers)
        return deepest * CHARS_PER_TOKEN, [w for w in workers if matched[w] == deepest]

    def choose(self, request: Request, view: ClusterView) -> int:
        match_chars, selected = self.longest_match(request)
        if match_chars < self.options.prefix_min_match_length:
            return self.qps_routing(self._now_s)
        return self.pick_one(selected)


class LoadAwareOptions(ProductionStackOptions, PrefixStateOptions):
    loadaware_beta: float = Field(1.0, description="--loadaware-beta / LOADAWARE_BETA: weight of the relative-load penalty (1.0: 100 % above the fleet mean costs one full cache hit).")
    session_key: bool = Field(False, description="--session-key set: the no-holder fallback hashes the request's session (its prefix_id in a workload without sessions) on the session ring, as `session`; False: it is _qps_routing.")


class VllmRouterLoadAware(_ProductionStackRouter):
    """production-stack `loadaware` (LoadAwareRouter, PR #1035). Every endpoint i is scored

        benefit(i)       = min(matched_tokens(i), prompt_tokens) / max(prompt_tokens, 1)
        load(i)          = in_prefill_requests(i) + in_decoding_requests(i)   (the router's own in-flight count)
        relative_load(i) = (load(i) - mean(load)) / max(1, mean(load))
        score(i)         = benefit(i) - loadaware_beta * relative_load(i)

    and the argmax wins; endpoints are scanned in sorted-URL order with a strict `>`, so the first of equals wins
    (kvsim: the lowest worker index). `matched_tokens(i)` is what the LMCache controller's lookup reports for
    instance i (exact state: LMCache reports admissions and evictions). If no instance holds any of the prompt
    (empty `layout_info`), the request takes `kvaware`'s fallback: the session ring when `--session-key` is set and
    the request carries one, else `_qps_routing`. `kv_aware_threshold` is not applied.

    Example, 2 endpoints, loads [3, 1] (mean 2), endpoint 0 holds 1,600 of 2,000 tokens: score(0) = 0.8 - 0.5 = 0.3,
    score(1) = 0 + 0.5 = 0.5 -> endpoint 1.

    kvsim: matched tokens are the engines' prefix caches (there is no LMCache tier) at the engine's block
    granularity; LMCache's 256-token chunk rounding is not modelled.
    """

    name = "vllm-router-loadaware"
    summary = "vLLM production-stack loadaware: cached fraction - beta x relative in-flight load, argmax"
    Options = LoadAwareOptions
    search_space = (FloatKnob("loadaware_beta", 0, 4),)
    needs_cache_state = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._ring = VllmRouterSession(num_workers=self.num_workers, block_size=self.block_size, rng=self.rng,
                                       options={}) if self.options.session_key else None

    def after_set_workers(self, left, joined, renewed) -> None:
        super().after_set_workers(left, joined, renewed)
        if self._ring is not None:
            self._ring.set_workers(self.workers, self.instances)

    def scores(self, request: Request) -> tuple[list[float], list[int]]:
        """Per worker (slot) the score and the matched tokens; the mean load is over the routable workers."""
        matched = self.prefix_tokens(request)
        load = self.in_flight
        mean = sum(load[w] for w in self.workers) / len(self.workers)
        isl = request.prompt_tokens
        beta = self.options.loadaware_beta
        scores = [min(m, isl) / max(isl, 1) - beta * (load[w] - mean) / max(1.0, mean)
                  for w, m in enumerate(matched)]
        return scores, matched

    def choose(self, request: Request, view: ClusterView) -> int:
        scores, matched = self.scores(request)
        workers = self.workers
        if max(matched[w] for w in workers) == 0:  # the controller names no holder
            key = session_key(request)
            if self._ring is not None and key is not None:
                return self._ring.ring_node(key)
            return self.qps_routing(self._now_s)
        best = workers[0]
        for w in workers[1:]:
            if scores[w] > scores[best]:
                best = w
        return best
