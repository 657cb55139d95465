"""sticky: a keep-alive client's connection pool through a Kubernetes Service; each connection pinned to a pod."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from policies.random_router import RandomRouter
from policies.sticky import StickyRouter
from tests.support.router_fakes import FakeView, build, prompt, send


def pods_of(seed, n, k):
    """The pods the first k connections are pinned to: the router's k draws of U{0..n-1}."""
    rng = random.Random(seed)
    return [rng.randrange(n) for _ in range(k)]


def test_connections_open_on_demand_each_pinned_to_a_random_pod():
    # Three requests in flight at once, pool of 8: three connections open, pinned to the seed's first three draws.
    view = FakeView(6)
    r = build(StickyRouter, seed=7, connections=8)
    picks = [send(r, prompt(i, 0), view) for i in range(3)]
    assert picks == pods_of(7, 6, 3) == r.pods() and r.connections_opened == 3


def test_a_released_connection_is_reused_oldest_idle_first():
    # Connections A, B, C are opened by requests 0, 1, 2. Requests 2 then 0 complete: A and C are idle, and the
    # next request takes A (the oldest-opened idle one, httpcore's available_connections[0]), the one after C.
    view = FakeView(6)
    r = build(StickyRouter, seed=7, connections=8)
    reqs = [prompt(i, 0) for i in range(3)]
    a, b, c = (send(r, q, view) for q in reqs)
    r.on_complete(reqs[2], c)
    r.on_complete(reqs[0], a)
    assert send(r, prompt(3, 0), view) == a
    assert send(r, prompt(4, 0), view) == c
    assert r.connections_opened == 3


def test_a_sequential_client_stays_on_one_pod():
    # One request at a time: every request reuses the first connection, so a single pod serves them all.
    view = FakeView(6)
    r = build(StickyRouter, seed=1)
    picks = []
    for i in range(20):
        q = prompt(i, i % 5)
        picks.append(send(r, q, view))
        r.on_complete(q, picks[-1])
    assert set(picks) == {pods_of(1, 6, 1)[0]} and r.connections_opened == 1


def test_a_full_pool_sends_to_the_least_busy_connection():
    # Pool of 2, both connections busy (A carries 2 requests, B 1): the next request goes on B (fewest outstanding;
    # httpcore would queue it until one is released). With A and B at 2 each, the first in pool order (A) wins.
    view = FakeView(6)
    r = build(StickyRouter, seed=3, connections=2)
    pa, pb = pods_of(3, 6, 2)
    assert [send(r, prompt(i, 0), view) for i in range(2)] == [pa, pb]
    assert send(r, prompt(2, 0), view) == pa  # tie 1-1: first in pool order
    assert send(r, prompt(3, 0), view) == pb  # A has 2, B 1
    assert send(r, prompt(4, 0), view) == pa  # tie 2-2
    assert [c.active_requests for c in r.pool] == [3, 2] and r.connections_opened == 2


def test_max_requests_per_connection_reopens_on_a_new_random_pod():
    # A limit of 3 requests: a sequential client's connection closes after its third response and the fourth request
    # opens a second connection on the next random draw.
    view = FakeView(6)
    r = build(StickyRouter, seed=11, max_requests_per_connection=3)
    picks = []
    for i in range(7):
        q = prompt(i, 0)
        picks.append(send(r, q, view))
        r.on_complete(q, picks[-1])
    first, second, third = pods_of(11, 6, 3)
    assert picks == [first] * 3 + [second] * 3 + [third] and r.connections_opened == 3


def test_an_idle_connection_expires_after_keepalive_expiry():
    # keepalive_expiry_s=5: the connection idle since t=0 is reused at t=4.9; idle again from t=4.9, it is closed
    # at t=9.9 (idle for 5 s), so that request opens a new connection on a new random pod.
    view = FakeView(6)
    r = build(StickyRouter, seed=2, view=view, keepalive_expiry_s=5.0)
    first, second = pods_of(2, 6, 2)
    q = prompt(0, 0)
    assert send(r, q, view) == first
    r.on_complete(q, first)
    view.now_s = 4.9
    q = prompt(1, 0)
    assert send(r, q, view) == first
    r.on_complete(q, first)
    view.now_s = 4.9 + 5.0
    assert send(r, prompt(2, 0), view) == second and r.connections_opened == 2


def test_zero_connections_is_the_random_router_draw_for_draw():
    view = FakeView(6)
    sticky, rand = build(StickyRouter, seed=9, connections=0), build(RandomRouter, seed=9)
    assert sticky.ignores_cluster_state
    assert [send(sticky, prompt(i, 0), view) for i in range(50)] == [rand.route(prompt(i, 0), view) for i in range(50)]


def test_defaults_and_bad_options():
    r = build(StickyRouter)
    assert (r.options.connections, r.options.max_requests_per_connection, r.options.keepalive_expiry_s) == (1000, None, None)
    assert not r.ignores_cluster_state
    with pytest.raises(ValueError, match="connections"):
        build(StickyRouter, connections=-1)
    with pytest.raises(ValueError, match="max_requests_per_connection"):
        build(StickyRouter, max_requests_per_connection=0)


def test_same_seed_same_choices():
    def choices(seed):
        view = FakeView(6)
        r = build(StickyRouter, seed=seed, connections=4)
        out, open_ = [], []
        for i in range(30):
            q = prompt(i, 0)
            out.append(send(r, q, view))
            open_.append((q, out[-1]))
            if len(open_) == 3:
                done, w = open_.pop(0)
                r.on_complete(done, w)
        return out

    assert choices(5) == choices(5) and choices(5) != choices(6)


# ---------------------------------------------------------------------------------------------- sessions
def of_session(rid, session):
    return replace(prompt(rid, 0), session_id=session)


def test_each_session_is_its_own_client_and_keeps_its_connection_between_turns():
    # Sessions 1 and 2 alternate turns, one in flight each: each opens one connection (draws 1 and 2 of the seed)
    # and every later turn reuses it (gaps under 5 s). A request without a session takes the shared pool (draw 3).
    view = FakeView(6)
    r = build(StickyRouter, seed=7, view=view)
    one, two, shared = pods_of(7, 6, 3)
    picks = {1: [], 2: []}
    for turn in range(4):
        for session in (1, 2):
            view.now_s = turn * 4.0 + session * 0.1
            q = of_session(10 * turn + session, session)
            picks[session].append(send(r, q, view))
            r.on_complete(q, picks[session][-1])
    assert picks == {1: [one] * 4, 2: [two] * 4}
    assert send(r, prompt(99, 0), view) == shared and r.pods() == [shared]
    assert r.connections_opened == 3


def test_a_session_idle_for_5_s_moves_to_a_new_random_pod():
    # httpx's keepalive_expiry and vLLM's server keep-alive are 5 s: a turn 4.9 s after the last response reuses the
    # connection, one 5 s after it opens a new one on the seed's next draw.
    view = FakeView(6)
    r = build(StickyRouter, seed=2, view=view)
    first, second = pods_of(2, 6, 2)
    for i, (at_s, pod) in enumerate(((0.0, first), (4.9, first), (9.9, second))):
        view.now_s = at_s
        q = of_session(i, 5)
        assert send(r, q, view) == pod, at_s
        r.on_complete(q, pod)
    assert r.connections_opened == 2


def test_session_options_default_and_switch_off():
    r = build(StickyRouter)
    assert (r.options.session_clients, r.options.session_keepalive_expiry_s) == (True, 5.0)
    # session_clients=false: sessions share the one pool, as requests without a session do.
    view = FakeView(6)
    shared = build(StickyRouter, seed=7, view=view, session_clients=False)
    plain = build(StickyRouter, seed=7, view=view)
    a, b = of_session(0, 1), of_session(1, 2)
    assert [send(shared, a, view), send(shared, b, view)] == [send(plain, prompt(0, 0), view),
                                                            send(plain, prompt(1, 0), view)]
    assert not shared.session_pools and shared.connections_opened == 2
    never = build(StickyRouter, seed=2, view=view, session_keepalive_expiry_s=None)
    q = of_session(0, 5)
    w = send(never, q, view)
    never.on_complete(q, w)
    view.now_s = 1e6
    assert send(never, of_session(1, 5), view) == w
