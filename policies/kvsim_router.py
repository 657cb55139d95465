"""kvsim's own policy: cache affinity under a load bound, with new prefixes placed where cache room is.

Every production KV-aware router scores workers by one cost that mixes cache overlap with load (Dynamo: prefill
blocks after credit + active blocks). At moderate load such a cost moves a request off its prefix's worker whenever
that worker is a little busier, the moved request writes its prefix into a second cache and evicts someone else's
there, and the cluster's caches converge to copies of the same prefixes (built-in workload, 6 workers, N = 24,
C = 8: Dynamo's defaults hit 0.44 of requests where partitioning the 24 prefixes over 6 caches of ~3.95 prompts
would hit ~0.99). kvsim's policy keeps the two questions apart:

1. **Affinity, bounded.** A worker is eligible while three bounds hold, each from what the router itself counts:

       load:    in_flight[w] + 1 <= ceil(load_factor * (in flight over all workers + 1) / workers)
                (consistent hashing with bounded loads, Mirrokni, Thorup, Zadimoghaddam, SODA'18; never empty)
       memory:  (active_blocks_w + this request's blocks not among them + 1) * B <= kv_fit * KV tokens of w
                (KV tokens: `cache_num_blocks` x `cache_block_size`, what the engine's metrics report)
                (it is admitted at once instead of waiting for KV; skipped if no load-eligible worker passes it)
       prefill: pending_w + new_w <= min over those still eligible of (pending + new) + prefill_slack_tokens
                (pending_w: uncached prompt tokens dispatched to w and not yet at their first token; new_w: this
                request's prompt tokens w does not hold: the TTFT a hit would pay in waiting is bounded)

   Among the eligible, the longest believed cached prefix wins (its prefix state: exact, KV events or its own
   routing history, the same modes the other routers have). Ties go to the prefix's home worker, then to the
   fewest in-flight, then at random.
2. **Placement by room.** A request no eligible worker holds anything of (a new prefix, or one whose copies are
   all on overloaded workers) goes to its home if the home is eligible; otherwise, if it has no home, its prefix
   gets one — the eligible worker whose live homes claim the fewest prompt tokens per token of cache
   (`cache_num_blocks`, what vLLM's and SGLang's metrics report), ties by in-flight, then at random. A request
   that spills off an overloaded home goes to the least loaded eligible worker and does not move the home.

Sessions (`session_affinity`, off by default). A request whose session was last dispatched to a worker still eligible
under all three bounds goes there, before the longest-match rule: the session's context, its outputs included, is on
that worker even where the router's view does not show it (its own routing history records prompts, KV events arrive
late). The session's worker is forgotten `home_ttl_s` after its last request. Why off: hand-made closed-loop sessions
(`tests/support/session_stream.py`: system prompts of 1,024 tokens in G groups, each turn adding 256 user and 128
output tokens, exponential think times), 4 workers of the built-in scenario, 3 seeds; prefix reuse / TTFT p99 /
workers a session used, off against on:
* 64 sessions x 8 turns, think 3 s, 30,000 KV tokens a worker, G = 3: 0.697 / 170 ms / 1.20 against 0.697 / 170 ms / 1.19.
* 48 x 8, think 6 s, 15,000 tokens, G = 2: 0.581 / 151 ms / 1.42 against 0.588 / 156 ms / 1.38 (KV events lagged
  0.5 s: 0.575 / 166 ms against 0.583 / 171 ms; its own routing history: 0.583 / 184 ms both).
* 96 x 6, think 1 s, 40,000 tokens, G = 3: identical.
The longest-match rule already keeps a session where its context is; the moves left are the bounds' spills, which
affinity does not override. It gains at most 0.008 of reuse for 5 ms of p99. (The engines of these runs cache prompt
blocks only; cached outputs lengthen the session worker's lead, which the longest match sees too.)

Membership (kvsim's own rule; no product to follow): the bounds and the choice range over the routable workers (the
load bound's total and worker count are theirs); the homes on a worker that leaves are released (their claims with
them), so each of its prefixes is placed again by room at its next request, and a new worker is where room is. A
session whose last worker left goes by the longest-match rule.

A prefix's *class* is the chained hash of its first `class_blocks` blocks (it names the whole leading prefix, as
lmetric's class does); the router keeps class -> (home, tokens claimed, last seen) for `home_ttl_s` after a class was
last routed. Everything it reads is what a real router has: its own dispatch/complete counts, its prefix state, and
the engines' reported cache size.

Why these bounds, measured (mean of 5 repeats unless said; commands in docs/studies/router-study.md):
* Built-in workload, vLLM, 6 workers, N = 24, C = 8: request hit rate 0.906 (0.92 of the bound 0.99), TTFT p99
  177 ms, against Dynamo's defaults 0.435 / 185 ms and `overlap_score_weight=4` 0.78 / 181 ms. The warm-ups
  place the 24 prefixes 4 to a worker and affinity serves each from its home. With the load bound alone
  (`prefill_slack_tokens=null`) it is 0.904 / 181 ms; without the prefill bound, load_factor 2 gave 0.78 / 195 ms and 3 gave 0.87 / 187 ms
  (the bound spills a request whenever its home has 2 of 8 in flight), so the default is 4.
* Mooncake conversation trace, 8 workers x 3.0M tokens: prefix reuse 0.333 and TTFT p99 1,541 ms against
  Dynamo's defaults 0.288 / 1,620 ms. There the load bound alone gives reuse 0.303 but p99 2,664 ms: its 100k-token
  prompts are what the p99 is made of, and a request count says nothing about them; the prefill bound keeps their
  queueing at what the least loaded worker would give them (a relative slack, 25 % of the best work, let a 100k
  prompt wait behind 25k tokens: p99 1,702 ms).
* State modes: with KV events lagged 0.1 s, 0.898 / 175 ms; with its own routing history, 0.900 / 181 ms.
* SGLang workers (whole prefixes evicted at once, no partial hits): 0.767 / 191 ms against Dynamo's 0.396 / 193 ms.
  The memory bound counts tokens: SGLang reports its pool in pages of one token, and a bound that compared those
  pages with the router's 16-token blocks never bound (0.763 / 216 ms).
"""

from __future__ import annotations

import math
from collections import OrderedDict

from pydantic import Field

from policies.active_blocks import ActiveBlocks
from policies.base import PrefixStateOptions, RouterBase
from sim.routing.interface import ClusterView
from sim.routing.knobs import FloatKnob, IntKnob
from sim.workloads.request import Request


class KvsimOptions(PrefixStateOptions):
    load_factor: float = Field(4.0, gt=1.0, description="Bounded-load factor c > 1: a worker takes a request only while its in-flight + 1 <= ceil(c x (total in flight + 1) / workers).")
    class_blocks: int = Field(1, ge=1, description="Leading prompt blocks whose chained hash names a request's prefix class (its home).")
    home_ttl_s: float = Field(600.0, gt=0, description="A class keeps its home this long after it was last routed.")
    prefill_slack_tokens: int | None = Field(2048, ge=0, description="A worker is eligible only while its pending prefill tokens plus this request's uncached ones exceed the lowest such sum by at most this many tokens; null = no prefill bound.")
    kv_fit: float = Field(1.0, gt=0, description="A worker is eligible only while its in-flight requests' distinct blocks plus this request's new ones fit in this fraction of its reported KV blocks (so that it is admitted at once).")
    min_match_blocks: int = Field(1, ge=1, description="Believed cached blocks below which a worker counts as holding nothing of the request.")
    session_affinity: bool = Field(False, description="A request goes to the worker its session's last request went to while that worker is within the bounds, before the longest-match rule.")


class KvsimRouter(RouterBase):
    """Cache affinity under a bounded load, new prefixes placed by cache room (module docstring: the rules).

    Invariants: `_homes` holds every live class in order of last routing (oldest first); `_claimed[w]` is the sum of
    the prompt tokens claimed by the live classes whose home is w.
    """

    name = "kvsim"
    summary = ("kvsim's own policy, not a product one can deploy: longest cached prefix within a bounded load, new "
               "prefixes placed by cache room")
    own_policy = True
    Options = KvsimOptions
    search_space = (FloatKnob("load_factor", 1.25, 8), IntKnob("prefill_slack_tokens", 0, 16384),
                    FloatKnob("kv_fit", 0.6, 1.2))
    needs_cache_state = True

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._homes: OrderedDict[object, tuple[int, int, float]] = OrderedDict()
        self._claimed = [0] * self.num_workers
        self._active = [ActiveBlocks() for _ in range(self.num_workers)]
        self._prefill_tokens = [0] * self.num_workers
        self._pending: dict[int, tuple[int, int]] = {}
        self._chosen_new: dict[int, int] = {}
        self._session_worker: OrderedDict[int, tuple[int, float]] = OrderedDict()  # oldest dispatch first

    def _expire(self, now_s: float) -> None:
        ttl = self.options.home_ttl_s
        homes = self._homes
        while homes:
            key, (worker, tokens, seen_s) = next(iter(homes.items()))
            if now_s - seen_s < ttl:
                return
            del homes[key]
            self._claimed[worker] -= tokens

    def _session_target(self, request: Request, now_s: float) -> int | None:
        """The worker the request's session last went to (None: none, or affinity off)."""
        if not self.options.session_affinity or request.session_id is None:
            return None
        sessions = self._session_worker
        while sessions and now_s - next(iter(sessions.values()))[1] >= self.options.home_ttl_s:
            sessions.popitem(last=False)
        last = sessions.get(request.session_id)
        return None if last is None else last[0]

    def _class_key(self, request: Request) -> object | None:
        hashes = request.block_hashes
        return hashes[min(self.options.class_blocks, len(hashes)) - 1] if hashes else None

    def _room_order(self, view: ClusterView) -> list[float]:
        """Per worker the prompt tokens its homes claim per token of cache (lower has more room)."""
        sizes = [view.cache_num_blocks(w) * view.cache_block_size() for w in range(self.num_workers)]
        return [c / s if s else float(c) for c, s in zip(self._claimed, sizes)]

    def route(self, request: Request, view: ClusterView) -> int:
        now_s = view.now_s
        self._expire(now_s)
        load = self.in_flight
        workers = self.workers
        capacity = math.ceil(self.options.load_factor * (sum(load[w] for w in workers) + 1) / len(workers))
        eligible = [w for w in workers if load[w] + 1 <= capacity]
        fits = [w for w in eligible if self._fits(request, w, view)]
        eligible = fits or eligible
        matched = self.prefix_tokens(request)
        isl = request.prompt_tokens
        new_tokens = [isl - min(m, isl) for m in matched]
        slack = self.options.prefill_slack_tokens
        if slack is not None:
            work = [self._prefill_tokens[w] + new_tokens[w] for w in range(self.num_workers)]
            bound = min(work[w] for w in eligible) + slack
            eligible = [w for w in eligible if work[w] <= bound]
        key = self._class_key(request)
        entry = self._homes.get(key)
        home = entry[0] if entry is not None else None
        floor = self.options.min_match_blocks * self.block_size
        best = max(matched[w] for w in eligible)
        session_worker = self._session_target(request, now_s)
        if session_worker in eligible:
            worker = session_worker
        elif best >= floor:
            holders = [w for w in eligible if matched[w] == best]
            worker = home if home in holders else self._least_loaded(holders)
        elif home is not None and home in eligible:
            worker = home
        elif home is not None:
            worker = self._least_loaded(eligible)  # a spill: the home stays where it is
        else:
            room = self._room_order(view)
            lowest = min(room[w] for w in eligible)
            worker = self._least_loaded([w for w in eligible if room[w] == lowest])
            home = worker
        self._touch(key, home if home is not None else worker, request.prompt_tokens, now_s)
        self._chosen_new[request.request_id] = new_tokens[worker]
        return worker

    def _fits(self, request: Request, worker: int, view: ClusterView) -> bool:
        # NOTE: in tokens, because the engine reports its cache in its own blocks (SGLang: pages, often of one
        # token) while the router counts the requests' blocks.
        kv_tokens = view.cache_num_blocks(worker) * view.cache_block_size()
        if not kv_tokens:
            return True
        active = self._active[worker]
        hashes = request.block_hashes
        need_blocks = len(active) + len(hashes) - active.held(hashes) + 1  # + 1: the partial last block
        return need_blocks * self.block_size <= self.options.kv_fit * kv_tokens

    def after_set_workers(self, left, joined, renewed) -> None:
        gone = set(left)
        if not gone:
            return
        for key in [k for k, (home, _, _) in self._homes.items() if home in gone]:
            home, tokens, _ = self._homes.pop(key)
            self._claimed[home] -= tokens

    def after_dispatch(self, request: Request, worker: int) -> None:
        if self.options.session_affinity and request.session_id is not None:
            self._session_worker.pop(request.session_id, None)
            self._session_worker[request.session_id] = (worker, self.view.now_s)
        self._active[worker].add(request.block_hashes)
        tokens = self._chosen_new.pop(request.request_id, request.prompt_tokens)
        self._pending[request.request_id] = (worker, tokens)
        self._prefill_tokens[worker] += tokens

    def after_first_token(self, request: Request, worker: int) -> None:
        pending = self._pending.pop(request.request_id, None)
        if pending is not None:
            self._prefill_tokens[pending[0]] -= pending[1]

    def after_complete(self, request: Request, worker: int) -> None:
        self.after_first_token(request, worker)
        self._active[worker].remove(request.block_hashes)

    def _least_loaded(self, candidates: list[int]) -> int:
        return self.random_argmin(self.in_flight, candidates)

    def _touch(self, key: object, home: int, tokens: int, now_s: float) -> None:
        if key is None:
            return
        old = self._homes.pop(key, None)
        if old is not None:
            self._claimed[old[0]] -= old[1]
        self._homes[key] = (home, tokens, now_s)
        self._claimed[home] += tokens
