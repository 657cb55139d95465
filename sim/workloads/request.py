"""A request as the workload describes it: immutable, with the identity of its prompt's blocks and tokens."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from itertools import takewhile
from operator import eq

BlockHash = Hashable
"""Identity of a whole prompt prefix up to the end of one block (a chained hash, as vLLM's)."""


def shareable_tokens(*, prefix_tokens: int, prompt_tokens: int, block_size: int) -> int:
    """The leading prompt tokens a full hit caches: the shared prefix's full blocks, short of the block that holds
    the prompt's last token. A request's `num_shareable_tokens`, for simulated and measured requests alike.

    NOTE: a hit stops at prompt_tokens - 1 (the last token is computed, to sample from), so a prefix that covers the
    whole prompt shares one block less.
    """
    return min(prefix_tokens // block_size, (prompt_tokens - 1) // block_size) * block_size


def computed_block_hashes(request: Request, block_size: int) -> tuple[BlockHash, ...]:
    """The full blocks `request` leaves cached for later prompts: its prompt's and, when its session resends its
    outputs, the output blocks it computes (`input + output - 1` tokens: the last sampled token's KV is never
    computed)."""
    hashes = request.block_hashes
    out = request.output_block_hashes
    if not out:
        return hashes
    return hashes + out[: (request.prompt_tokens + request.output_tokens - 1) // block_size - len(hashes)]


def context_tokens(block_hashes: Sequence[BlockHash], prompt_tokens: int, computed: Sequence[BlockHash],
                   block_size: int) -> int:
    """A prompt's `num_context_tokens`: its leading blocks equal to `computed` (what an earlier request of its
    session left cached, `computed_block_hashes`), in tokens, capped as a hit is at `prompt_tokens - 1`."""
    # NOTE: counted in C (takewhile stops at the first block that differs): a 64k-token context compares 4,000.
    shared = len(list(takewhile(bool, map(eq, block_hashes, computed))))
    return min(shared, (prompt_tokens - 1) // block_size) * block_size


def is_full_hit(num_cached_tokens: int, num_shareable_tokens: int) -> bool:
    """Whether a request found all of its shareable tokens cached (never, when it has none)."""
    return num_shareable_tokens > 0 and num_cached_tokens >= num_shareable_tokens


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request, described by the identity of its prompt rather than by token ids.

    Two descriptions of the same prompt, for the two kinds of cache:
    * `block_hashes[i]` identifies the whole prompt prefix up to the end of full block i (a chained hash, as
      vLLM's), so two requests share block i exactly when they share every token up to it. Only full blocks have
      hashes: `len(block_hashes) == prompt_tokens // block_size`, at the block size of the stream.
    * `token_runs` describes the tokens themselves, for token-granular caches (SGLang's radix tree): a run
      `(key, n)` is the n tokens `(key, 0) .. (key, n - 1)`, so two prompts share their first t tokens exactly when
      their runs agree token by token up to t. Empty: derived from `block_hashes` (each block a run of its own key,
      the partial last block unique to the request; see `sim.engines.sglang.tokens`).
    Output tokens are sampled, hence unique to the request, unless the request belongs to a session whose later
    prompts resend them: then `output_block_hashes` and `output_key` name them (see those fields).
    """

    request_id: int
    prompt_tokens: int
    output_tokens: int
    block_hashes: tuple[BlockHash, ...]
    num_shareable_tokens: int = 0
    """Leading prompt tokens another request may share (`shareable_tokens`); a full hit caches all of them
    (`is_full_hit`)."""
    prefix_id: int | None = None
    prefix_tokens: int = 0
    """Tokens of the shared prefix the prompt starts with (the rest of the prompt is the request's own)."""
    warmup: bool = False
    """Excluded from statistics (a warm-up, or a request of the discarded start of a steady-state run)."""
    token_runs: tuple[tuple[Hashable, int], ...] = ()
    """The prompt's tokens as runs `(key, count)` (see the class docstring); counts sum to `prompt_tokens`."""
    session_id: int | None = None
    """The session (a chat, an agent run; a subagent is a session of its own) the request belongs to; None: none."""
    turn: int = 0
    """The request's index in its session (0: the first)."""
    output_block_hashes: tuple[BlockHash, ...] = ()
    """Hashes of the full blocks that hold output tokens, block indices `len(block_hashes)` to
    `(prompt_tokens + output_tokens) // block_size - 1` (the first also holds the prompt's partial last block), so
    that a later prompt continuing this sequence shares them. Empty: the outputs are the request's own."""
    output_key: Hashable | None = None
    """Token identity of the outputs for token-granular caches: output token j is `(output_key, j)`, and a later
    prompt that contains the n outputs has the run `(output_key, n)`. None: the outputs are the request's own."""
    num_context_tokens: int = 0
    """Leading prompt tokens that earlier requests of its session left cacheable (whole blocks of what the engine
    computed of them): what a cache that kept the session's context would hit."""

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1:
            raise ValueError(f"request {self.request_id}: prompt_tokens must be >= 1, got {self.prompt_tokens}")
        if self.output_tokens < 1:
            raise ValueError(f"request {self.request_id}: output_tokens must be >= 1, got {self.output_tokens}")
        if self.num_context_tokens > self.prompt_tokens:
            raise ValueError(f"request {self.request_id}: num_context_tokens {self.num_context_tokens} exceeds "
                             f"prompt_tokens {self.prompt_tokens}")
        runs = self.token_runs
        if runs and sum([n for _, n in runs]) != self.prompt_tokens:
            raise ValueError(f"request {self.request_id}: token_runs cover {sum(n for _, n in runs)} "
                             f"tokens, prompt_tokens is {self.prompt_tokens}")
