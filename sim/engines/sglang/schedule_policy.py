"""SGLang 0.5.23's waiting-queue order (`SchedulePolicy`) and prefill admission (`PrefillAdder`, `PrefillBudget`).

Mirrors `python/sglang/srt/managers/schedule_policy.py` and `mem_cache/prefill_budget.py` for a plain
(non-hybrid) model; the rules and their source lines are in `docs/engines/sglang-0.5.23-semantics.md`
§4-§5. The admission arithmetic, with P the page size and ceil() rounding up to pages:

    remaining_total   = available + evictable - total_offset       (live: locks taken in this pass count)
    total_offset      = sum over running requests of min(max_new - generated, 4096) x (1 if ignore_eos else ratio)
                        + per admitted request: ceil(extend) + P + min(max_new, 4096)
    a request fits if   extend + min(max_new - generated, 4096) + P  <  remaining_total
                        (its own matched prefix locked meanwhile, so not counted as evictable)

A request longer than what is left of the pass's chunk budget (`chunked_prefill_size`) is chunked, page-aligned;
only one request is chunked at a time, and the loop stops at the first request that does not fit (no skipping).
"""

from __future__ import annotations

from enum import Enum

from sim.engines.sglang.kv_pool import KvPool
from sim.engines.sglang.radix_cache import RadixCache, TreeNode
from sim.engines.sglang.request_state import SglangRequest
from sim.engines.sglang.spec import SCHEDULE_POLICIES

CLIP_MAX_NEW_TOKENS = 4096
"""`SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION`: the most output tokens admission reserves per request."""
WAITING_QUEUE_PREFIX_MATCH_MAX = 128
"""lpm falls back to fcfs above this many waiting requests; the prefix refresh touches at most this many."""
WAITING_PREFIX_REFRESH_INTERVAL = 32
IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD = 32
IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD = 32

class AddReqResult(Enum):
    CONTINUE = 0
    NO_TOKEN = 1
    OTHER = 2


class SchedulePolicy:
    """Orders the waiting queue before each admission pass (`SchedulePolicy.calc_priority`).

    * fcfs: arrival order (retracted requests re-enter at the end); every 32nd pass the first 128 waiting requests'
      prefixes are touched (head last, so the head's is the most recent), with the lru eviction policy only
      (`SGLANG_ENABLE_WAITING_PREFIX_REFRESH`).
    * lpm: match every waiting request (no cap; splits nodes, refreshes recency, queue order), sort by matched
      length, longest first; a request with <= 32 matched tokens whose prompt shares >= 32 tokens with an earlier
      such request in the queue (an in-batch dedup tree) goes last. Above 128 waiting it is fcfs.
    * dfs-weight: the same matching, then a depth-first walk of the tree, heaviest subtree (most waiting
      requests ending in it) first, each node's requests after its subtree.
    """

    def __init__(self, policy: str, tree: RadixCache) -> None:
        if policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {', '.join(SCHEDULE_POLICIES)}, got {policy!r}")
        self.policy = policy
        self.tree = tree
        self._waiting_prefix_refresh_calls = 0
        self._dedup_tree = RadixCache(page_size=1)

    def active_policy(self, waiting: list[SglangRequest]) -> str:
        if self.policy == "lpm" and len(waiting) > WAITING_QUEUE_PREFIX_MATCH_MAX:
            return "fcfs"
        return self.policy

    def calc_priority(self, waiting: list[SglangRequest]) -> None:
        policy = self.active_policy(waiting)
        if policy != "fcfs":
            deprioritized = self._compute_prefix_matches(waiting)
            if policy == "lpm":
                waiting.sort(key=lambda r: float("inf") if id(r) in deprioritized else -r.num_matched_prefix_tokens)
            else:
                order = self._dfs_weight_order([r.last_node for r in waiting])
                waiting[:] = [waiting[i] for i in order]
            return
        if not waiting or self.tree.eviction_policy != "lru":
            return
        refresh = self._waiting_prefix_refresh_calls % WAITING_PREFIX_REFRESH_INTERVAL == 0
        self._waiting_prefix_refresh_calls += 1
        if refresh:
            for r in reversed(waiting[:WAITING_QUEUE_PREFIX_MATCH_MAX]):
                self.tree.touch_prefix(r.fill_tokens())

    def _compute_prefix_matches(self, waiting: list[SglangRequest]) -> set[int]:
        deprioritized: set[int] = set()
        self._dedup_tree.reset()
        for r in waiting:
            fill = r.fill_tokens()
            match_kv_cache(r, self.tree, fill)
            if r.prefix_len <= IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD:
                if self._dedup_tree.match_prefix(fill)[0] >= IN_BATCH_PREFIX_CACHING_DEPRIORITIZE_THRESHOLD:
                    deprioritized.add(id(r))
                else:
                    self._dedup_tree.insert(fill)
        return deprioritized

    def _dfs_weight_order(self, nodes: list[TreeNode | None]) -> list[int]:
        """`_dfs_weight_order` (`mem_cache/base_prefix_cache.py`)."""
        by_node: dict[int, list[int]] = {}
        for index, node in enumerate(nodes):
            by_node.setdefault(id(node), []).append(index)
        weight = {k: len(v) for k, v in by_node.items()}
        root = self.tree.root_node
        stack: list[tuple[TreeNode, bool]] = [(root, False)]
        while stack:
            node, visited = stack.pop()
            if visited:
                w = weight.get(id(node), 0)
                for child in node.children.values():
                    w += weight.get(id(child), 0)
                weight[id(node)] = w
                continue
            stack.append((node, True))
            for child in reversed(list(node.children.values())):
                stack.append((child, False))
        order: list[int] = []
        stack = [(root, False)]
        while stack:
            node, visited = stack.pop()
            if visited:
                order.extend(by_node.get(id(node), ()))
                continue
            children = sorted(node.children.values(), key=lambda c: -weight.get(id(c), 0))
            stack.append((node, True))
            for child in reversed(children):
                stack.append((child, False))
        return order


def match_kv_cache(req: SglangRequest, tree: RadixCache, fill=None, *, max_prefix_len: int | None = None) -> None:
    """`match_kv_cache` (`mem_cache/common.py`): match the request's tokens (capped at `max_prefix_len`) and adopt
    the hit as its prefix."""
    fill = req.fill_tokens() if fill is None else fill
    # NOTE: the tree matches the page-aligned key (`page_aligned`): cut to it at once, not to the cap and then again.
    P = tree.page_size
    cap = fill.length if max_prefix_len is None else min(max_prefix_len, fill.length)
    key = fill.slice(0, cap // P * P)
    if tree.has_host_tier:
        # HiCache: the device prefix is the request's; the host-only part after it may be loaded at admission.
        req.prefix_len, req.last_node, req.host_hit_length, req.best_match_node = tree.match_prefix_tiers(key)
        req.num_matched_prefix_tokens = min(req.prefix_len + req.host_hit_length, max(fill.length - 1, 0))
        return
    req.prefix_len, req.last_node = tree.match_prefix(key)
    req.num_matched_prefix_tokens = min(req.prefix_len, max(fill.length - 1, 0))


def init_next_round_input(req: SglangRequest, tree: RadixCache | None) -> None:
    """`Req.init_next_round_input`: re-match the request (prompt + outputs, at most all but the last token).
    Without a tree (a continuing chunk) nothing is matched."""
    if tree is None:
        return
    match_kv_cache(req, tree, max_prefix_len=max(req.fill_len - 1, 0))
    req.cache_protected_len = req.prefix_len


class PrefillAdder:
    """One admission pass (see the module docstring)."""

    def __init__(self, pool: KvPool, running: list[SglangRequest], new_token_ratio: float, *,
                 rem_input_tokens: int, rem_chunk_tokens: int | None) -> None:
        self.pool = pool
        self.tree = pool.tree
        self.page_size = pool.page_size
        self.rem_input_tokens = rem_input_tokens
        self.rem_chunk_tokens = rem_chunk_tokens
        self.can_run_list: list[SglangRequest] = []
        self.new_chunked_req: SglangRequest | None = None
        self.total_offset = 0.0
        self.current_offset = 0
        for r in running:
            ratio = 1.0 if r.ignore_eos else new_token_ratio
            self.total_offset += min(r.max_new_tokens - r.num_output_tokens, CLIP_MAX_NEW_TOKENS) * ratio

    # ------------------------------------------------------------------ budget (PrefillBudget)
    def _available_and_evictable(self) -> int:
        return self.pool.available_size() + self.tree.evictable_size_

    @property
    def remaining_total(self) -> float:
        return self._available_and_evictable() - self.total_offset

    @property
    def remaining_current(self) -> int:
        return self._available_and_evictable() - self.current_offset

    def budget_state(self) -> AddReqResult:
        if not (self.remaining_total > 0 and self.remaining_current > 0):
            return AddReqResult.NO_TOKEN
        if self.rem_input_tokens <= 0:
            return AddReqResult.OTHER
        if self.rem_chunk_tokens is not None and self.rem_chunk_tokens <= 0:
            return AddReqResult.OTHER
        return AddReqResult.CONTINUE

    def _update_prefill_budget(self, extend_len: int, max_new_tokens: int) -> None:
        paged = self.pool.ceil_paged(extend_len)
        self.total_offset += paged + self.page_size + max_new_tokens
        self.current_offset += paged + self.page_size
        self.rem_input_tokens -= paged
        if self.rem_chunk_tokens is not None:
            self.rem_chunk_tokens -= paged

    # ------------------------------------------------------------------ admission
    def add_chunked_req(self, req: SglangRequest) -> SglangRequest | None:
        """The next chunk of the request being chunked; returns it while more chunks remain."""
        rem = min(self.rem_chunk_tokens, int(self.remaining_total))
        if rem <= 0:
            rem = self.rem_chunk_tokens  # a continuation must make progress to release its KV
        candidate = req.fill_len - req.prefix_len
        truncated = candidate > rem
        new_len = min(candidate, rem)
        req.extend_end = req.prefix_len + new_len
        self.can_run_list.append(req)
        self._update_prefill_budget(new_len, 0 if truncated else min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS))
        return req if truncated else None

    def add_one_req(self, req: SglangRequest) -> AddReqResult:
        P = self.page_size
        tree = self.tree
        max_new = min(max(req.max_new_tokens - req.num_output_tokens, 0), CLIP_MAX_NEW_TOKENS)
        # NOTE: host-hit tokens are charged as new device tokens (HiCache, schedule_policy.py:1405-1409).
        total_tokens = req.fill_len - req.prefix_len + max_new + P
        # NOTE: the candidate's own prefix is pinned while it is judged, so it does not count as evictable room.
        pinned = req.last_node
        tree.inc_lock_ref(pinned)
        try:
            if not total_tokens < self.remaining_total:
                return AddReqResult.NO_TOKEN
            admission = self._select_admission(req, req.host_hit_length)
            if isinstance(admission, AddReqResult):
                return admission
            req.host_loaded_length = 0
            if req.host_hit_length > 0:
                loaded = self._load_back(req)
                if loaded:
                    req.host_loaded_length = loaded
                    req.prefix_len += loaded
                    req.last_node = req.best_match_node
                    req.cache_protected_len = req.prefix_len
                else:
                    # NOTE: declined (under the threshold, or no device room): the host part is recomputed.
                    admission = self._select_admission(req, 0)
                    if isinstance(admission, AddReqResult):
                        return admission
            extend_len, max_new_tokens, is_chunked = admission
            req.extend_end = req.prefix_len + extend_len
            tree.inc_lock_ref(req.last_node)
            req.lock = req.last_node
            self.can_run_list.append(req)
            if is_chunked:
                self.new_chunked_req = req
            self._update_prefill_budget(extend_len, max_new_tokens)
        finally:
            tree.dec_lock_ref(pinned)
        return self.budget_state()

    def _select_admission(self, req: SglangRequest, host_hit_length: int) -> tuple[int, int, bool] | AddReqResult:
        """`_select_prefill_admission`: (extend_len, max_new_tokens reserved, chunked) with the prefix counted as
        device + `host_hit_length` tokens (loaded tokens use no chunk budget), or why the request cannot go."""
        P = self.page_size
        prefix_len = req.prefix_len + host_hit_length
        extend_len = req.fill_len - prefix_len
        input_tokens = self.pool.ceil_paged(extend_len)
        if self.rem_chunk_tokens is None and self.can_run_list and input_tokens >= self.rem_input_tokens:
            return AddReqResult.OTHER
        max_new_tokens = min(req.max_new_tokens, CLIP_MAX_NEW_TOKENS)
        if self.rem_chunk_tokens is not None and input_tokens > self.rem_chunk_tokens:
            extend_len = self.rem_chunk_tokens // P * P
            extend_len = (prefix_len + extend_len) // P * P - prefix_len
            if extend_len <= 0:
                return AddReqResult.OTHER
            return extend_len, 0, True
        return extend_len, max_new_tokens, False

    def _load_back(self, req: SglangRequest) -> int:
        """`init_load_back` inside the adder (schedule_policy.py:1467-1523): the host path pinned meanwhile; returns
        the tokens loaded (0: declined)."""
        tree, best = self.tree, req.best_match_node
        tree.inc_host_lock(best)
        try:
            return tree.load_back(best, self._make_room)
        finally:
            tree.dec_host_lock(best)

    def _make_room(self, num_tokens: int) -> bool:
        """`evict_for_alloc` before a load-back: evict the device shortfall; whether `num_tokens` slots are free."""
        self.pool.evict_to_free_tokens(num_tokens)
        return self.pool.available_size() >= num_tokens
