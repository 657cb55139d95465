"""A request inside one SGLang engine: SGLang's `Req` and its `ReqKvInfo`, as far as scheduling and the cache see them.

Mirrors `python/sglang/srt/managers/schedule_batch.py` (`Req`): the prompt (`origin`), the sampled outputs, the
matched prefix and the tree node it ends in, the lock the request holds, and the KV row's bookkeeping:

    row:   | tree-owned [0, cache_protected_len) | private [cache_protected_len, kv_allocated_len) |
    fill:  origin + outputs (`full_untruncated_fill_ids`); a chunk computes [prefix_len, extend_end)

`kv_committed_len` is the KV the request has (prefill: `extend_end`; +1 per decode step scheduled). Private slots
are counted in pages (`private_pages`), as the allocator hands them out.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.engines.interface import ServedRequest
from sim.engines.sglang.radix_cache import TreeNode
from sim.engines.sglang.tokens import Tokens, output_tokens


@dataclass(slots=True, eq=False, kw_only=True)
class SglangRequest(ServedRequest):
    origin: Tokens
    max_new_tokens: int
    ignore_eos: bool = True
    eos_at: int | None = None
    """Output position (0-based) of the EOS token the model samples; None: it never does (stops at max_new_tokens)."""
    prefix_len: int = 0
    extend_end: int | None = None
    num_matched_prefix_tokens: int = 0
    last_node: TreeNode | None = None
    lock: TreeNode | None = None
    """The node whose path this request holds locked (SGLang `req.lock`), or None."""
    host_hit_length: int = 0
    """HiCache: matched tokens held only on the host after the device prefix (`req.host_hit_length`)."""
    best_match_node: TreeNode | None = None
    """HiCache: the deepest matched node, device or host (`req.best_match_node`), the load-back's anchor."""
    host_loaded_length: int = 0
    """HiCache: tokens the last admission loaded back from the host (`req.host_loaded_length`)."""
    cache_protected_len: int = 0
    cache_inserted_len: int = 0
    kv_committed_len: int = 0
    kv_allocated_len: int = 0
    holds_kv: bool = False
    """Holds a row of the request-to-token pool (from its prefill's allocation to its release)."""
    private_pages: int = 0
    already_computed: int = 0
    retracted_stain: bool = False
    is_retracted: bool = False
    inflight_middle_chunks: int = 0
    finished_reason: str | None = None
    """None while running; "length" (max_new_tokens reached) or "eos"."""
    hold_kv: bool = False
    """P/D prefill side: at its finish the request's KV goes into the tree locked, and is released (unlocked) only
    when the decode side has it (SGLang's `disagg_prefill_inflight_queue`)."""
    cache_on_finish: bool = True
    """False on a P/D decode worker: its radix cache is off by default (`--disaggregation-decode-enable-radix-cache`
    unset), so a finished request's KV is freed, not cached."""

    @property
    def input_len(self) -> int:
        return self.origin.length

    @property
    def fill_len(self) -> int:
        """len(origin_input_ids + output_ids)."""
        return self.origin.length + self.num_output_tokens

    def fill_tokens(self, stop: int | None = None) -> Tokens:
        """`full_untruncated_fill_ids[:stop]`: the prompt, then the sampled outputs."""
        n = self.num_output_tokens
        if stop is not None and stop <= self.origin.length:
            return self.origin.slice(0, stop)
        if stop is not None:
            n = min(n, stop - self.origin.length)
        return self.origin + output_tokens(self.request, n) if n else self.origin

    def finished(self) -> bool:
        return self.finished_reason is not None

    @property
    def extend_len(self) -> int:
        return self.extend_end - self.prefix_len

    def next_output_finishes_by_length(self) -> bool:
        return self.num_output_tokens + 1 >= self.max_new_tokens

    def update_finish_state(self) -> None:
        """After a token was appended (`Req.update_finish_state`): EOS beats the length cap."""
        if self.finished_reason is not None:
            return
        if not self.ignore_eos and self.eos_at is not None and self.num_output_tokens == self.eos_at + 1:
            self.finished_reason = "eos"
        elif self.num_output_tokens >= self.max_new_tokens:
            self.finished_reason = "length"

    def owned_kv_len(self) -> int:
        """KV positions the request owns (`Req.owned_kv_len`): its committed KV, at most prompt + outputs."""
        if self.finished_reason is None:
            return self.kv_committed_len
        return min(self.kv_committed_len, self.origin.length + self.num_output_tokens)
