"""The shared-prefix stream draws exactly what a plain loop over its random streams would: every request equal, for
every popularity and length distribution (the fast generator of `iter_shared_prefix_requests` against a naive one)."""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate, islice

import pytest

from sim.workloads.shared_prefix import SharedPrefixRequests, iter_shared_prefix_requests, poisson_requests, rng_for
from sim.workloads.spec import SharedPrefixSpec, sample_length


def naive_requests(spec: SharedPrefixSpec, *, block_size: int, seed: int, num_requests: int):
    """One request at a time, each length through `sample_length` and each prefix through `draw.choices`' rule."""
    maker = SharedPrefixRequests(block_size=block_size)
    prefix_len_rng = rng_for(seed, "prefix-lengths")
    prefix_tokens = [sample_length(spec.prefix_tokens, prefix_len_rng) for _ in range(spec.prefixes)]
    tails, outputs = rng_for(seed, "tail-lengths"), rng_for(seed, "output-lengths")
    out = []

    def make(p: int, warm: bool) -> None:
        prompt = prefix_tokens[p] + sample_length(spec.tail_tokens, tails)
        out.append(maker.make(len(out), p, prefix_tokens=prefix_tokens[p], prompt_tokens=prompt,
                              output_tokens=sample_length(spec.output_tokens, outputs), warmup=warm))

    for p in range(spec.prefixes):
        for _ in range(spec.warmup_per_prefix):
            make(p, True)
    draw = rng_for(seed, "prefixes")
    weights = spec.popularity_weights()
    for _ in range(num_requests):
        if spec.popularity == "uniform":
            make(draw.randrange(spec.prefixes), False)
        else:
            make(draw.choices(range(spec.prefixes), weights=weights)[0], False)
    return out


SPECS = [
    dict(prefixes=5, prefix_tokens=300, tail_tokens=40, output_tokens=8, popularity="uniform", warmup_per_prefix=2),
    dict(prefixes=64, prefix_tokens=2048, tail_tokens={"kind": "uniform", "low": 128, "high": 512}, output_tokens=64,
         popularity="zipf", zipf_exponent=1.0, warmup_per_prefix=0),
    dict(prefixes=7, prefix_tokens={"kind": "normal", "low": 16, "high": 900, "mean": 400, "sd": 200},
         tail_tokens={"kind": "lognormal", "low": 1, "high": 700, "mean": 90, "sd": 120},
         output_tokens={"kind": "uniform", "low": 1, "high": 9}, popularity="weights",
         weights=[5, 1, 1, 0.5, 3, 2, 0.1], warmup_per_prefix=1),
]


@pytest.mark.parametrize("fields", SPECS)
def test_the_stream_is_the_plain_loops_draw_for_draw(fields):
    spec = SharedPrefixSpec(concurrency=4, **fields)
    fast = list(iter_shared_prefix_requests(spec, block_size=16, seed=3, num_requests=300))
    assert fast == naive_requests(spec, block_size=16, seed=3, num_requests=300)
    # Lazily drawn, the first requests are the same as those of a longer stream.
    assert list(islice(iter_shared_prefix_requests(spec, block_size=16, seed=3, num_requests=50), 20)) == fast[:20]


def test_poisson_arrivals_are_their_own_stream():
    spec = SharedPrefixSpec(concurrency=4, **SPECS[1])
    timed = list(poisson_requests(spec, block_size=64, seed=0, rate_rps=40.0, num_requests=200))
    gaps = rng_for(0, "arrivals")
    assert [t.arrival_s for t in timed] == list(accumulate(gaps.expovariate(40.0) for _ in range(200)))
    assert [t.request for t in timed] == naive_requests(spec, block_size=64, seed=0, num_requests=200)
    cum = list(accumulate(spec.popularity_weights()))
    draw = rng_for(0, "prefixes")
    assert [t.request.prefix_id for t in timed] == [bisect_right(cum, draw.random() * cum[-1], 0, 63)
                                                     for _ in range(200)]
