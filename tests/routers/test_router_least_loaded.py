"""least-loaded: the fewest of the router's own in-flight requests (Dynamo least-loaded, KubeAI LeastLoad)."""

from __future__ import annotations

from collections import Counter

import pytest

from policies.least_loaded import LeastLoadedRouter
from sim.workloads.request import Request
from tests.support.router_fakes import FakeView, build, prompt, send


def test_the_worker_with_fewest_in_flight_requests_wins():
    # Workers 0..3 carry 3, 1, 2, 4 of this router's requests: worker 1 (1 in flight) takes the next one.
    r = build(LeastLoadedRouter, n=4)
    r.in_flight[:] = [3, 1, 2, 4]
    assert r.route(prompt(1, 0), FakeView(4)) == 1


def test_dispatch_and_completion_move_the_counts():
    # Two idle workers: the first request goes to one of them, the second to the other; once the first completes,
    # its worker is idle again and takes the third.
    view = FakeView(2)
    r = build(LeastLoadedRouter, n=2, seed=5)
    a = prompt(1, 0)
    wa = send(r, a, view)
    wb = send(r, prompt(2, 0), view)
    assert {wa, wb} == {0, 1} and r.in_flight == [1, 1]
    r.on_complete(a, wa)
    assert r.in_flight[wa] == 0 and r.route(prompt(3, 0), view) == wa


def test_it_ignores_the_caches_and_the_engines():
    # Worker 0 holds the whole prompt and its engine reports a long queue; neither matters: worker 0 has 1 request
    # in flight, worker 1 none.
    view = FakeView(2, cached={0: {("p", 7, i) for i in range(127)}, 1: set()})
    r = build(LeastLoadedRouter, n=2, view=view)
    r.in_flight[:] = [1, 0]
    assert r.route(prompt(1, 7), view) == 1 and view.peeks == 0


def test_ties_are_uniform_among_the_least_loaded_only():
    # Workers 1 and 3 tie at 0 in flight; 0 and 2 carry 1: only 1 and 3 are ever chosen, about half each.
    view = FakeView(4)
    r = build(LeastLoadedRouter, n=4, seed=2)
    r.in_flight[:] = [1, 0, 1, 0]
    picks = Counter(r.route(prompt(i, 0), view) for i in range(2000))
    assert set(picks) == {1, 3} and 900 < picks[1] < 1100


def test_tokens_mode_counts_prompt_tokens_in_flight():
    # Worker 0 has one 4,000-token request in flight, worker 1 two 100-token requests: by requests worker 0 is the
    # lighter, by tokens worker 1 (200 < 4000).
    view = FakeView(2)
    by_requests, by_tokens = build(LeastLoadedRouter, n=2), build(LeastLoadedRouter, n=2, load="tokens")
    for r in (by_requests, by_tokens):
        r.on_dispatch(Request(1, 4000, 1, ()), 0)
        r.on_dispatch(Request(2, 100, 1, ()), 1)
        r.on_dispatch(Request(3, 100, 1, ()), 1)
    assert by_tokens.in_flight_tokens == [4000, 200]
    assert by_requests.route(prompt(9, 0), view) == 0
    assert by_tokens.route(prompt(9, 0), view) == 1


def test_defaults_and_bad_options():
    r = build(LeastLoadedRouter)
    assert r.options.load == "requests" and r.processing_s == 0.0 and not r.ignores_cluster_state
    with pytest.raises(ValueError, match="load"):
        build(LeastLoadedRouter, load="kv")


def test_same_seed_same_choices():
    def choices(seed):
        view = FakeView(6)
        r = build(LeastLoadedRouter, seed=seed)
        out = []
        for i in range(30):
            req = prompt(i, 0)
            out.append(send(r, req, view))
            if i % 3 == 2:
                r.on_complete(req, out[-1])
        return out

    assert choices(4) == choices(4)
    assert choices(4) != choices(5)
