"""Request streams: the shared-prefix workload of the reference experiment, as `Request` values.

Prompts are described by block identity, not token ids: block i of a request with prefix p is shared with every
other request of prefix p exactly when all its tokens lie inside the prefix ((i + 1) * block_size <= prefix
tokens); any block that reaches into the unique tail is the request's own. This is what vLLM's chained hashes
give for token-identical prefixes and random tails.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sim.block_pool import BlockHash
from sim.request import Request
from sim.scenario import WorkloadSpec


@dataclass(frozen=True, slots=True)
class RequestStream:
    """Warm-ups (sent one at a time, excluded from statistics) then the measured requests, in send order."""

    warmups: tuple[Request, ...]
    requests: tuple[Request, ...]


def rng_for(seed: int, stream: str) -> random.Random:
    """An independent random stream derived from the scenario seed by name (never the module-level `random`)."""
    return random.Random(f"kvsim:{seed}:{stream}")


def prefix_block_hashes(prefix_id: int, num_blocks: int) -> tuple[BlockHash, ...]:
    return tuple(("p", prefix_id, i) for i in range(num_blocks))


def shared_prefix_stream(spec: WorkloadSpec, *, block_size: int, seed: int) -> RequestStream:
    """The reference workload: N prefixes, unique tails, warm-ups per prefix, prefixes drawn uniformly."""
    prompt_tokens = spec.prompt_tokens
    num_prompt_blocks = prompt_tokens // block_size
    num_shared_blocks = min(spec.prefix_tokens // block_size, num_prompt_blocks)
    # NOTE: a full hit stops at num_tokens - 1, so a prefix that covers the whole prompt shares one block less.
    num_shareable_tokens = min(num_shared_blocks, (prompt_tokens - 1) // block_size) * block_size
    prefix_hashes = [prefix_block_hashes(p, num_shared_blocks) for p in range(spec.prefixes)]
    next_id = 0

    def make(prefix_id: int, warmup: bool) -> Request:
        nonlocal next_id
        rid = next_id
        next_id += 1
        own = tuple(("u", rid, i) for i in range(num_shared_blocks, num_prompt_blocks))
        return Request(
            request_id=rid,
            prompt_tokens=prompt_tokens,
            output_tokens=spec.output_tokens,
            block_hashes=prefix_hashes[prefix_id] + own,
            num_shareable_tokens=num_shareable_tokens,
            prefix_id=prefix_id,
            warmup=warmup,
        )

    warmups = tuple(make(p, True) for p in range(spec.prefixes) for _ in range(spec.warmup_per_prefix))
    draw = rng_for(seed, "prefixes")
    requests = tuple(make(draw.randrange(spec.prefixes), False) for _ in range(spec.num_requests))
    return RequestStream(warmups, requests)
