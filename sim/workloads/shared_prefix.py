"""Request streams: the shared-prefix workload of the reference experiment, as `Request` values.

Prompts are described by block identity, not token ids: block i of a request with prefix p is shared with every
other request of prefix p exactly when all its tokens lie inside the prefix ((i + 1) * block_size <= prefix
tokens); any block that reaches into the unique tail is the request's own. This is what vLLM's chained hashes
give for token-identical prefixes and random tails.
"""

from __future__ import annotations

import random
from bisect import bisect_right
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import accumulate, islice, repeat
from operator import mul

from sim.workloads.request import BlockHash, Request, shareable_tokens
from sim.workloads.spec import Length, SharedPrefixSpec, sample_length
from sim.workloads.traces import TraceRequest


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
        own = tuple([("u", request_id, i) for i in range(num_shared, num_prompt_blocks)])
        prefix_in_prompt = min(prefix_tokens, prompt_tokens)
        runs = (((("p", prefix_id), prefix_in_prompt),) if prefix_in_prompt else ()) + (
            ((("u", request_id), prompt_tokens - prefix_in_prompt),) if prompt_tokens > prefix_in_prompt else ())
        return Request(request_id=request_id, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                       block_hashes=shared[:num_shared] + own, num_shareable_tokens=shareable_tokens(
                           prefix_tokens=prefix_tokens, prompt_tokens=prompt_tokens, block_size=B),
                       prefix_id=prefix_id, prefix_tokens=prefix_tokens, warmup=warmup, token_runs=runs)


def length_sampler(length: Length, rng: random.Random) -> Callable[[], int]:
    """`sample_length(length, rng)` as a function of no argument: the same draws from `rng`, in the same order, at
    less cost per call (a fixed length draws nothing; a uniform one is `rng.randint`, already within its bounds)."""
    if isinstance(length, int):
        return repeat(length).__next__
    if length.kind == "uniform":
        return partial(rng.randint, length.low, length.high)
    return partial(sample_length, length, rng)


def iter_shared_prefix_requests(spec: SharedPrefixSpec, *, block_size: int, seed: int,
                                num_requests: int | None = None) -> Iterator[Request]:
    """The requests of `spec`, lazily: warm-ups (one per prefix, in prefix order, flagged), then `num_requests`
    (default: the spec's) with prefixes drawn by popularity and lengths drawn per prefix (prefix) and per
    request (tail, output).

    Every draw has its own named random stream, so changing one distribution leaves the others' draws alone, and
    drawing lazily gives the same requests as drawing all at once.
    """
    maker = SharedPrefixRequests(block_size=block_size)
    prefix_len_rng = rng_for(seed, "prefix-lengths")
    prefix_tokens = [sample_length(spec.prefix_tokens, prefix_len_rng) for _ in range(spec.prefixes)]
    tail = length_sampler(spec.tail_tokens, rng_for(seed, "tail-lengths"))
    output = length_sampler(spec.output_tokens, rng_for(seed, "output-lengths"))
    make = maker.make
    rid = 0
    for p in range(spec.prefixes):
        for _ in range(spec.warmup_per_prefix):
            # NOTE: the tail is drawn before the output (their streams are separate, but keep the order anyway).
            prompt = prefix_tokens[p] + tail()
            yield make(rid, p, prefix_tokens=prefix_tokens[p], prompt_tokens=prompt, output_tokens=output(),
                       warmup=True)
            rid += 1
    draw = rng_for(seed, "prefixes")
    n = spec.num_requests if num_requests is None else num_requests
    if spec.popularity == "uniform":
        prefixes = map(draw.randrange, repeat(spec.prefixes, n))
    else:
        # NOTE: `draw.choices(range(prefixes), cum_weights=cum_weights)[0]` spelled out (the same draw, faster):
        # bisect_right(cum_weights, draw.random() * total, 0, prefixes - 1) for each request, the loop in C.
        cum_weights = list(accumulate(spec.popularity_weights()))
        total = cum_weights[-1]
        draws = map(mul, islice(iter(draw.random, None), n), repeat(total))
        prefixes = map(bisect_right, repeat(cum_weights), draws, repeat(0), repeat(spec.prefixes - 1))
    for p in prefixes:
        prefix = prefix_tokens[p]
        prompt = prefix + tail()
        yield make(rid, p, prefix_tokens=prefix, prompt_tokens=prompt, output_tokens=output())
        rid += 1


def shared_prefix_stream(spec: SharedPrefixSpec, *, block_size: int, seed: int,
                         num_requests: int | None = None) -> RequestStream:
    """`iter_shared_prefix_requests` materialised: warm-ups (sent one at a time) and `num_requests` measured
    requests (default: the spec's), of which the first `discard_first` are flagged as warm-ups (excluded from
    statistics) but sent like the rest."""
    n = spec.num_requests if num_requests is None else num_requests
    made = list(iter_shared_prefix_requests(spec, block_size=block_size, seed=seed, num_requests=n))
    warmups = tuple(made[: len(made) - n])
    main = made[len(warmups):]
    main[: spec.discard_first] = [replace(r, warmup=True) for r in main[: spec.discard_first]]
    return RequestStream(warmups, tuple(main))


def poisson_requests(spec: SharedPrefixSpec, *, block_size: int, seed: int, rate_rps: float,
                     num_requests: int) -> Iterator[TraceRequest]:
    """A synthetic timed stream for `replay`: the spec's requests (no warm-ups) at Poisson arrivals, lazily."""
    gaps = rng_for(seed, "arrivals")
    t = 0.0
    requests = iter_shared_prefix_requests(spec.model_copy(update={"warmup_per_prefix": 0}), block_size=block_size,
                                           seed=seed, num_requests=num_requests)
    for request in requests:
        t += gaps.expovariate(rate_rps)
        yield TraceRequest(t, request)


def prompt_token_ids(request: Request, *, seed: int, min_token_id: int = 3,
                     max_token_id: int = 8191) -> list[int]:
    """Token ids for a request of `shared_prefix_stream`: its prefix's tokens, then its own random tail.

    Deterministic in (seed, prefix id) and (seed, request id), so `kvsim measure` sends real servers exactly the
    stream the simulator models: same prefixes, same order, a random tail per request. (Random ids may coincide:
    two tails, or two prefixes, can start with the same id; see `with_token_identity`.)
    """
    prefix = rng_for(seed, f"prefix-tokens:{request.prefix_id}")
    tail = rng_for(seed, f"tail-tokens:{request.request_id}")
    return ([prefix.randint(min_token_id, max_token_id) for _ in range(request.prefix_tokens)]
            + [tail.randint(min_token_id, max_token_id) for _ in range(request.prompt_tokens - request.prefix_tokens)])


def token_runs_of_ids(prompts: Sequence[Sequence[int]]) -> list[tuple[tuple[Hashable, int], ...]]:
    """`token_runs` (see `Request`) that make the prompts share exactly the tokens their ids share.

    Two prompts' tokens at position i are equal, for a token-matching cache, exactly when the prompts agree on
    every id up to i. That is the path of position i in the compressed trie of all the prompts, so each trie
    edge becomes a run with a key of its own and a prompt is the runs of its path:

        ids   a: 5 9 9 2 7      b: 5 9 9 4      c: 8 1
        trie  root -e0(5 9 9)-> * -e1(2 7)   root -e3(8 1)
                                  \\-e2(4)
        runs  a: (e0, 3) (e1, 2)   b: (e0, 3) (e2, 1)   c: (e3, 2)

    Identical prompts get identical runs. Keys are `("ids", n)` with n unique in one call.
    """
    seqs = [tuple(p) for p in prompts]
    paths: list[list[tuple[Hashable, int]]] = [[] for _ in seqs]
    next_key = 0
    stack: list[tuple[list[int], int]] = [(list(range(len(seqs))), 0)]  # (prompts sharing ids [0, depth), depth)
    while stack:
        group, depth = stack.pop()
        end = depth
        while all(len(seqs[i]) > end for i in group) and len({seqs[i][end] for i in group}) == 1:
            end += 1
        if end > depth:
            for i in group:
                paths[i].append((("ids", next_key), end - depth))
            next_key += 1
        children: dict[int, list[int]] = {}
        for i in group:
            if len(seqs[i]) > end:
                children.setdefault(seqs[i][end], []).append(i)
        stack.extend((child, end) for child in children.values())
    return [tuple(p) for p in paths]


def with_token_identity(requests: Sequence[Request], *, seed: int, min_token_id: int = 3,
                        max_token_id: int = 8191) -> list[Request]:
    """`requests` of `shared_prefix_stream` with `token_runs` from their real token ids (`prompt_token_ids`).

    The stream's own runs say that distinct prefixes, and the tails of one prefix, share no token. Their random
    ids sometimes do: two tails of a prefix may begin with the same id, and so may two prefixes, and a cache that
    matches token by token (SGLang's radix tree) hits those tokens too (a 513-token hit on a 512-token prefix; a
    1-token hit between prefixes). Block hashes are unchanged (a whole block never coincides in practice).
    """
    ids = [prompt_token_ids(r, seed=seed, min_token_id=min_token_id, max_token_id=max_token_id) for r in requests]
    return [replace(r, token_runs=runs) for r, runs in zip(requests, token_runs_of_ids(ids))]
