"""A request inside one vLLM engine: progress and its block table (vLLM's `Request` as the scheduler sees it)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.engines.interface import ServedRequest
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
    """vLLM's WAITING_FOR_REMOTE_KVS: blocks allocated for a CPU hit whose async load is not yet promoted."""

    @property
    def is_finished(self) -> bool:
        """vLLM stops at the request's output length (its workloads send ignore_eos and max_tokens)."""
        return self.num_output_tokens >= self.request.output_tokens

    def block_hash(self, index: int) -> BlockHash:
        """Hash of full block `index`; blocks that hold sampled tokens are unique to this request."""
        hashes = self.request.block_hashes
        if index < len(hashes):
            return hashes[index]
        # NOTE: sampled tokens are random, so a block touching them is never shared with another request; a
        # preempted request that recomputes itself still finds these blocks under the same keys.
        return ("out", self.request.request_id, index)

    def block_hashes(self, start: int, stop: int) -> list[BlockHash]:
        """Hashes of full blocks start..stop-1 (see `block_hash`)."""
        prompt = self.request.block_hashes
        if stop <= len(prompt):
            return list(prompt[start:stop])
        rid = self.request.request_id
        return list(prompt[start:]) + [("out", rid, i) for i in range(max(start, len(prompt)), stop)]
