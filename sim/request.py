"""A request as the workload describes it (`Request`, immutable) and as an engine serves it (`RequestState`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.block_pool import BlockHash


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request, described by the identity of its prompt blocks rather than by token ids.

    `block_hashes[i]` identifies the whole prompt prefix up to the end of full block i (a chained hash, as vLLM's),
    so two requests share block i exactly when they share every token up to it. Only full blocks have hashes:
    `len(block_hashes) == prompt_tokens // block_size`. Output tokens are sampled, hence unique to the request.
    """

    request_id: int
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[BlockHash, ...]
    num_shareable_tokens: int = 0
    """Leading prompt tokens another request may share (the shared prefix); a full hit caches all of them."""
    prefix_id: int | None = None
    prefix_tokens: int = 0
    """Tokens of the shared prefix the prompt starts with (the rest of the prompt is the request's own)."""
    warmup: bool = False
    """Excluded from statistics (a warm-up, or a request of the discarded start of a steady-state run)."""

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"request {self.request_id}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"request {self.request_id}: output_tokens must be >= 1, got {self.output_tokens}")


@dataclass(slots=True, eq=False)
class RequestState:
    """A request inside one engine: progress, held blocks and the timestamps the records are built from.

    `num_tokens` = prompt + sampled output tokens; the engine computes KV for all but the newest sampled token.
    `block_ids` is the request's block table in position order; `num_cached_blocks` of them carry hashes.
    """

    request: Request
    block_size: int
    worker: int
    arrival_s: float
    num_computed_tokens: int = 0
    num_output_tokens: int = 0
    block_ids: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0
    num_preemptions: int = 0
    num_cached_tokens: int | None = None
    """Prefix-cache hit at first admission (vLLM's `cached_tokens`); None until admitted."""
    admitted_s: float | None = None
    first_token_s: float | None = None
    finished_s: float | None = None

    @property
    def num_tokens(self) -> int:
        return self.request.prompt_tokens + self.num_output_tokens

    @property
    def is_finished(self) -> bool:
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
