"""Request streams: the shared-prefix workload of the reference experiment, as `Request` values.

Prompts are described by block identity, not token ids: block i of a request with prefix p is shared with every
other request of prefix p exactly when all its tokens lie inside the prefix ((i + 1) * block_size <= prefix
tokens); any block that reaches into the unique tail is the request's own. This is what vLLM's chained hashes
give for token-identical prefixes and random tails.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

from sim.block_pool import BlockHash
from sim.request import Request
from sim.scenario import WorkloadSpec, sample_length


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


class SharedPrefixRequests:
    """Builds requests of a shared-prefix workload: block i of a request is its prefix's block i when all its
    tokens lie in the prefix, else the request's own."""

    def __init__(self, *, block_size: int) -> None:
        self.block_size = block_size
        self._prefix_hashes: dict[int, tuple[BlockHash, ...]] = {}

    def make(self, request_id: int, prefix_id: int, *, prefix_tokens: int, prompt_tokens: int, output_tokens: int,
             warmup: bool = False) -> Request:
        B = self.block_size
        num_prompt_blocks = prompt_tokens // B
        num_shared = min(prefix_tokens // B, num_prompt_blocks)
        shared = self._prefix_hashes.get(prefix_id)
        if shared is None or len(shared) < num_shared:
            shared = self._prefix_hashes[prefix_id] = prefix_block_hashes(prefix_id, num_shared)
        own = tuple(("u", request_id, i) for i in range(num_shared, num_prompt_blocks))
        # NOTE: a full hit stops at num_tokens - 1, so a prefix that covers the whole prompt shares one block less.
        shareable = min(num_shared, (prompt_tokens - 1) // B) * B
        return Request(request_id=request_id, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                       block_hashes=shared[:num_shared] + own, num_shareable_tokens=shareable,
                       prefix_id=prefix_id, prefix_tokens=prefix_tokens, warmup=warmup)


def shared_prefix_stream(spec: WorkloadSpec, *, block_size: int, seed: int) -> RequestStream:
    """The workload of `spec`: warm-ups (one per prefix, in prefix order), then the measured requests with
    prefixes drawn by popularity, lengths drawn per prefix (prefix) and per request (tail, output); the first
    `discard_first` of them are flagged as warm-ups (excluded from statistics) but sent like the rest.

    Every draw has its own named random stream, so changing one distribution leaves the others' draws alone.
    """
    maker = SharedPrefixRequests(block_size=block_size)
    prefix_len_rng = rng_for(seed, "prefix-lengths")
    prefix_tokens = [sample_length(spec.prefix_tokens, prefix_len_rng) for _ in range(spec.prefixes)]
    tails, outputs = rng_for(seed, "tail-lengths"), rng_for(seed, "output-lengths")
    order = [(p, True) for p in range(spec.prefixes) for _ in range(spec.warmup_per_prefix)]
    draw = rng_for(seed, "prefixes")
    if spec.popularity == "uniform":
        order += [(draw.randrange(spec.prefixes), False) for _ in range(spec.num_requests)]
    else:
        weights = spec.popularity_weights()
        order += [(p, False) for p in draw.choices(range(spec.prefixes), weights=weights, k=spec.num_requests)]
    made = []
    for rid, (p, warm) in enumerate(order):
        prompt = prefix_tokens[p] + sample_length(spec.tail_tokens, tails)
        made.append(maker.make(rid, p, prefix_tokens=prefix_tokens[p], prompt_tokens=prompt,
                               output_tokens=sample_length(spec.output_tokens, outputs), warmup=warm))
    warmups = tuple(made[: len(made) - spec.num_requests])
    main = made[len(warmups):]
    main[: spec.discard_first] = [replace(r, warmup=True) for r in main[: spec.discard_first]]
    return RequestStream(warmups, tuple(main))


def prompt_token_ids(request: Request, *, seed: int, min_token_id: int = 3,
                     max_token_id: int = 8191) -> list[int]:
    """Token ids for a request of `shared_prefix_stream`: its prefix's tokens, then its own random tail.

    Deterministic in (seed, prefix id) and (seed, request id), so `kvsim measure` sends real servers exactly the
    stream the simulator models: same prefixes, same order, tails unique to each request.
    """
    prefix = rng_for(seed, f"prefix-tokens:{request.prefix_id}")
    tail = rng_for(seed, f"tail-tokens:{request.request_id}")
    return ([prefix.randint(min_token_id, max_token_id) for _ in range(request.prefix_tokens)]
            + [tail.randint(min_token_id, max_token_id) for _ in range(request.prompt_tokens - request.prefix_tokens)])
