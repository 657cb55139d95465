"""One SGLang worker's KV memory: the token pool and request rows, and how requests' KV moves in and out of the tree.

Mirrors SGLang 0.5.23's allocator (`mem_cache/allocator/token.py`, `paged.py`: free slots counted in pages of
`page_size`), `alloc_for_extend` / `alloc_for_decode` (`mem_cache/allocation.py`), `evict_to_free_tokens`
(`allocator/base.py`: evict only the shortfall), `checkpoint_kv_cache` / `RadixCache.checkpoint` and
`release_kv_cache` (`mem_cache/common.py`, `radix_cache.py`). Which slot holds a token is not modelled, only how
many are free, so the count is derived rather than kept:

    available = max_total_tokens - tokens in the tree - page_size x (pages held privately by requests)

Pages move between three owners: free, a request's row (private), the tree. A checkpoint hands a request's
private pages over to the tree (the part the tree already had is a duplicate and goes back to free); a release
frees what is still private; eviction frees tree pages.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from operator import attrgetter

from sim.engines.sglang.radix_cache import RadixCache
from sim.engines.sglang.request_state import SglangRequest


_committed_len = attrgetter("kv_committed_len")


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def decode_pages(committed: int, num_steps: int, page_size: int) -> int:
    """Pages a request whose KV holds `committed` tokens takes over its next `num_steps` decode allocations (a new
    page whenever its committed length is a multiple of the page size)."""
    if num_steps <= 0:
        return 0
    return (committed + num_steps - 1) // page_size - (committed - 1) // page_size


class KvPool:
    """`max_total_tokens` KV slots (a multiple of `page_size`) and `max_running_requests` request rows."""

    def __init__(self, tree: RadixCache, *, max_total_tokens: int, max_running_requests: int) -> None:
        P = tree.page_size
        if max_total_tokens < P or max_total_tokens % P:
            raise ValueError(f"max_total_tokens ({max_total_tokens}) must be a positive multiple of page_size {P}")
        self.tree = tree
        self.page_size = P
        self.max_total_tokens = max_total_tokens
        self.num_rows = max_running_requests
        self.rows_in_use = 0
        self.private_pages = 0

    # ------------------------------------------------------------------ counts
    def available_size(self) -> int:
        """Free slots (`allocator.available_size()`), whole pages."""
        tree = self.tree
        return self.max_total_tokens - tree.evictable_size_ - tree.protected_size_ - self.page_size * self.private_pages

    def token_usage(self, num_pages_taken: int = 0) -> float:
        """`sglang:token_usage` = (slots - available - evictable) / slots: cached, unlocked tokens count as free;
        with `num_pages_taken`, as it will be once requests have taken that many more pages."""
        n = self.max_total_tokens
        return (n - (self.available_size() - self.page_size * num_pages_taken) - self.tree.evictable_size_) / n

    def available_rows(self) -> int:
        return self.num_rows - self.rows_in_use

    def ceil_paged(self, tokens: int) -> int:
        return ceil_div(tokens, self.page_size) * self.page_size

    # ------------------------------------------------------------------ allocation
    def evict_to_free_tokens(self, num_tokens: int) -> None:
        """Evict from the tree only the shortfall (whole nodes, so possibly more)."""
        shortfall = num_tokens - self.available_size()
        if shortfall > 0:
            self.tree.evict(shortfall)

    def _take(self, req: SglangRequest, num_pages: int) -> None:
        if num_pages * self.page_size > self.available_size():
            raise RuntimeError(f"out of KV memory: request {req.request.request_id} needs {num_pages} pages, "
                               f"{self.available_size() // self.page_size} free")
        req.private_pages += num_pages
        self.private_pages += num_pages

    def alloc_for_extend(self, reqs: list[SglangRequest]) -> None:
        """A prefill batch's slots, at schedule time: [prefix_len, extend_end) of each request."""
        P = self.page_size
        extend_num_tokens = sum(r.extend_len for r in reqs)
        for r in reqs:
            if not r.holds_kv:
                r.holds_kv = True
                self.rows_in_use += 1
        # NOTE: the paged allocator evicts for a conservative demand (one spare page per request).
        self.evict_to_free_tokens(extend_num_tokens if P == 1 else extend_num_tokens + len(reqs) * P)
        for r in reqs:
            self._take(r, ceil_div(r.extend_end, P) - ceil_div(r.prefix_len, P))
            r.kv_allocated_len = r.kv_committed_len = r.extend_end

    def new_tokens_required_next_decode(self, reqs: list[SglangRequest]) -> int:
        P = self.page_size
        return P * sum(1 for r in reqs if r.kv_committed_len % P == 0)

    def check_decode_mem(self, reqs: list[SglangRequest]) -> bool:
        """Whether the next decode step of `reqs` fits after evicting the shortfall."""
        num_tokens = self.new_tokens_required_next_decode(reqs)
        self.evict_to_free_tokens(num_tokens)
        return self.available_size() >= num_tokens

    def alloc_for_decode(self, reqs: list[SglangRequest]) -> None:
        """One slot per request (a new page where the last one is full)."""
        P = self.page_size
        self.evict_to_free_tokens(len(reqs) * P)
        for r in reqs:
            if r.kv_committed_len % P == 0:
                self._take(r, 1)
            r.kv_allocated_len += 1
            r.kv_committed_len += 1

    # ------------------------------------------------------------------ many decode steps at once (decode stretches)
    def pages_for_decode_steps(self, reqs: Iterable[SglangRequest], num_steps: int) -> int:
        """Pages `reqs` take over their next `num_steps` decode allocations, together."""
        if num_steps <= 0:
            return 0
        P, m = self.page_size, num_steps - 1
        return sum([(c + m) // P - (c - 1) // P for c in map(_committed_len, reqs)])  # decode_pages, inlined

    def decode_batch_fits(self, reqs: Sequence[SglangRequest], num_batches: int) -> bool:
        """Whether the `num_batches`-th decode batch of `reqs` formed from now still finds `len(reqs)` pages free
        after the pages the batches before it took, so that its `alloc_for_decode` evicts nothing (it evicts
        below that)."""
        taken = self.pages_for_decode_steps(reqs, num_batches - 1)
        return self.available_size() - self.page_size * taken >= len(reqs) * self.page_size

    def alloc_for_decode_steps(self, req: SglangRequest, num_steps: int) -> None:
        """`num_steps` decode allocations of `req` at once (`alloc_for_decode` repeated, with room checked by
        `decode_batch_fits`: nothing is evicted): its committed and allocated lengths grow by `num_steps` and it
        takes the pages those slots start."""
        self._take(req, decode_pages(req.kv_committed_len, num_steps, self.page_size))
        req.kv_committed_len += num_steps
        req.kv_allocated_len += num_steps

    # ------------------------------------------------------------------ the tree takes KV over
    def checkpoint(self, req: SglangRequest, up_to: int) -> None:
        """`RadixCache.checkpoint`: insert the request's KV up to `up_to` (page-aligned), free the duplicate part,
        split the leaf at the prompt's end, and move the request's lock to the end of what it inserted."""
        tree, P = self.tree, self.page_size
        # NOTE: `tree.page_aligned(req.fill_tokens(up_to))`, cut once: the aligned prefix of the fill.
        key = req.fill_tokens(min(up_to, req.fill_len) // P * P)
        key_len = key.length
        protected = req.cache_protected_len
        # NOTE: the request's lock holds the path of its first `protected` tokens (SGLang's `last_node`), so the
        # inserts walk down from there; the tree also splits the leaf at the prompt's end, stamps the path (SGLang's
        # match_prefix(key)) and moves the lock to the node the insert ended in.
        node = tree.checkpoint_insert(req.lock, protected, key, prompt_len=req.origin.length // P * P,
                                      inserted_len=req.cache_inserted_len)
        req.cache_inserted_len = max(req.cache_inserted_len, key_len)
        moved = max(0, key_len - protected) // P
        req.private_pages -= moved
        self.private_pages -= moved  # duplicates go back to free, the rest now belongs to the tree
        req.cache_protected_len = key_len
        req.lock = req.last_node = node

    def checkpoint_kv_cache(self, req: SglangRequest) -> None:
        """Publish what a running request has computed so far (`checkpoint_kv_cache`)."""
        self.checkpoint(req, req.extend_end)
        req.prefix_len = req.extend_end

    def release_kv_cache(self, req: SglangRequest, *, checkpoint: bool) -> None:
        """Give the request's row back; with `checkpoint` the tree first keeps what it can key."""
        if checkpoint:
            self.checkpoint(req, req.owned_kv_len())
        self.private_pages -= req.private_pages
        req.private_pages = 0
        if req.lock is not None:
            self.tree.dec_lock_ref(req.lock)
            req.lock = None
        if req.holds_kv:
            req.holds_kv = False
            self.rows_in_use -= 1
