"""A worker's active blocks (Dynamo's active-sequence tracking) against a naive count of every in-flight request's
hashes: the binary searches over the chain (held run, dropped suffix) must keep exactly the same counts."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.active_blocks import ActiveBlocks

# A request: a prefix group, how many of its blocks it shares with the group, and how many of its own follow.
requests = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 12), st.integers(0, 6)), min_size=1, max_size=30)


@settings(max_examples=200, deadline=None)
@given(requests=requests, order=st.randoms(use_true_random=False))
def test_active_blocks_count_every_in_flight_requests_hashes(requests, order):
    active, naive, live = ActiveBlocks(), Counter(), []
    for i, (group, shared, own) in enumerate(requests):
        hashes = tuple(("p", group, j) for j in range(shared)) + tuple(("u", i, j) for j in range(own))
        active.add(hashes)
        naive.update(hashes)
        live.append(hashes)
        if order.random() < 0.4:
            done = live.pop(order.randrange(len(live)))
            active.remove(done)
            naive.subtract(done)
            naive = +naive
        assert active._counts == dict(naive)
        assert len(active) == len(naive)
        probe = tuple(("p", group, j) for j in range(12))
        assert active.held(probe) == next((j for j, h in enumerate(probe) if h not in naive), len(probe))
    for hashes in live:
        active.remove(hashes)
    assert len(active) == 0
