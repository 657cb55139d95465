"""A request inside one vLLM engine: progress and its block table (vLLM's `Request` as the scheduler sees it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.engines.interface import RemoteKvSource, ServedRequest
from sim.workloads.request import BlockHash


@dataclass(slots=True, eq=False, kw_only=True)
class RequestState(ServedRequest):
    """`num_computed_tokens` of `num_tokens` (prompt + sampled outputs) have KV; the engine computes KV for all but
    the newest sampled token. `block_ids` is the request's block table in position order; `num_cached_blocks` of
    them carry hashes."""

    block_size: int
    num_computed_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0
    loading: bool = False
    """vLLM's WAITING_FOR_REMOTE_KVS: blocks allocated for a CPU hit (or a P/D transfer) whose async load is not yet
    promoted."""
    hold_kv: bool = False
    """P/D prefill side (vLLM's `do_remote_decode`): at its finish the request keeps its blocks (`delay_free_blocks`)
    until the engine is told the decode side has read them."""
    remote_kv: RemoteKvSource | None = None
    """P/D decode side: where the prompt's KV comes from (vLLM `kv_transfer_params.do_remote_prefill`); cleared
    once the request asked for it (a preempted request recomputes, as vLLM clears do_remote_prefill)."""
    load_admitted_s: float | None = None
    """When the first admission's tier load was created (for `tier_load_s`); None: no tier hit yet."""

    @property
    def is_finished(self) -> bool:
        """vLLM stops at the request's output length (its workloads send ignore_eos and max_tokens)."""
        return self.num_output_tokens >= self.request.output_tokens

    def block_hash(self, index: int) -> BlockHash:
        """Hash of full block `index`: the prompt's, then the outputs' (`Request.output_block_hashes`, when a later
        turn of the session resends them), else a key of this request's own."""
        request = self.request
        hashes = request.block_hashes
        if index < len(hashes):
            return hashes[index]
        out = request.output_block_hashes
        if index - len(hashes) < len(out):
            return out[index - len(hashes)]
        # NOTE: sampled tokens are random, so a block touching them is never shared with another request (unless
        # its session resends them: output_block_hashes); a preempted request that recomputes itself still finds
        # these blocks under the same keys.
        return ("out", request.request_id, index)

    def block_hashes(self, start: int, stop: int) -> list[BlockHash]:
        """Hashes of full blocks start..stop-1 (see `block_hash`)."""
        request = self.request
        prompt = request.block_hashes
        num_prompt = len(prompt)
        if stop <= num_prompt:
            return list(prompt[start:stop])
        if start >= stop:
            return []
        # NOTE: sliced from the prompt's and the outputs' tuples apart: a long context's decode caches a block every
        # block_size steps, and joining the tuples first copied the whole context each time.
        out = request.output_block_hashes
        hashes = list(prompt[start:]) if start < num_prompt else []
        known = num_prompt + len(out)
        if start < known:
            hashes += out[max(start - num_prompt, 0):stop - num_prompt]
        if stop > known:
            rid = request.request_id
            hashes += [("out", rid, i) for i in range(max(start, known), stop)]
        return hashes
