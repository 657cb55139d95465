"""Session routers end to end: a hand-made stream of sessions whose turns extend each other's prompts, sent closed loop
(each turn a think time after the previous response) through the built-in scenario's cluster on 4 workers."""

from __future__ import annotations

from collections import defaultdict

import pytest

from sim.scenario import load_scenario
from tests.support.session_stream import SessionShape, drive_sessions, session_stream, think_times

SHAPE = SessionShape(sessions=12, turns=4, groups=2, think_s=2.0, think_seed=0)
"""12 sessions of 4 turns; 2 system prompts of 512 tokens; turn t is 512 + 192 t + 128 tokens; think ~ Exp(2 s)."""


def workers_per_session(router, options):
    scenario, _ = load_scenario()
    scenario = scenario.with_overrides(**{"cluster.deployments": [], "cluster.workers": 4, "router.name": router,
                                          "router.options": options})
    records = drive_sessions(scenario, SHAPE)
    assert len(records) == SHAPE.sessions * SHAPE.turns
    used = defaultdict(set)
    for r in records:
        used[r.request_id // SHAPE.turns].add(r.worker)
    return {s: sorted(w) for s, w in used.items()}, records


def test_the_stream_extends_each_turns_prompt_with_the_last_turns_output():
    first, = session_stream(SessionShape(sessions=1, turns=2, system_tokens=32, user_tokens=16, output_tokens=16),
                            block_size=16)
    assert [(q.prompt_tokens, q.turn, q.session_id, q.num_context_tokens) for q in first] == [(48, 0, 0, 0), (80, 1, 0, 48)]
    assert first[0].block_hashes == (("sys", 0, 0), ("sys", 0, 1), ("session", 0, 2))
    assert first[0].output_block_hashes == (("session", 0, 3),)
    assert first[1].block_hashes == first[0].block_hashes + first[0].output_block_hashes + (("session", 0, 4),)


@pytest.mark.parametrize("router, options", [("vllm-router-session", {}),
                                             ("kv-aware", {"session_affinity_ttl_s": 300}),
                                             ("kv-aware", {"session_affinity_ttl_s": 300, "session_affinity_mode": "soft"}),
                                             ("sticky", {"session_keepalive_expiry_s": None})])
def test_session_routers_keep_each_session_on_one_worker(router, options):
    used, records = workers_per_session(router, options)
    assert all(len(w) == 1 for w in used.values()), used
    assert len({w[0] for w in used.values()}) > 1  # sessions spread over the workers
    # Every later turn finds its whole context cached on its worker: the previous turn's prompt and output.
    by_id = {r.request_id: r for r in records}
    for r in records:
        if r.request_id % SHAPE.turns:
            assert r.cached_tokens >= r.context_tokens > by_id[r.request_id - 1].prompt_tokens


@pytest.mark.parametrize("router, moved", [("random", 10), ("kv-aware", 5)])
def test_without_session_affinity_sessions_move(router, moved):
    # Random scatters 10 of the 12 sessions; Dynamo's cost alone moves 5 of the 12 when a session's worker is busier
    # (7 before the engines cached output blocks: the previous turn's output now adds to the overlap at home).
    used, _ = workers_per_session(router, {})
    assert sum(len(w) > 1 for w in used.values()) == moved


def test_sticky_sessions_move_only_after_a_pause_of_5_s():
    # A session's client keeps its connection (one pod) until a think time of 5 s or more lets it close.
    used, _ = workers_per_session("sticky", {})
    paused = {s for s, thinks in enumerate(think_times(SHAPE)) if max(thinks[1:]) >= 5.0}
    moved = {s for s, w in used.items() if len(w) > 1}
    assert moved and moved <= paused


@pytest.mark.parametrize("state, sees_outputs", [("events", True), ("approximate", False)])
def test_what_a_router_believes_of_a_session_context_depends_on_its_view(state, sees_outputs):
    # One session's turns on a 4-worker kv-aware router. KV events report every block the engine cached, output
    # blocks included, so the router believes the next turn's whole context is on its worker; Dynamo's approximate
    # index records only what it routed (the prompts), so it believes the previous prompt's blocks and no more.
    scenario, _ = load_scenario()
    scenario = scenario.with_overrides(**{"cluster.deployments": [], "cluster.workers": 4, "router.name": "kv-aware",
                                          "router.options": {"state": state}})
    shape = SessionShape(sessions=1, turns=3, groups=1)
    records = sorted(drive_sessions(scenario, shape), key=lambda r: r.request_id)
    B = scenario.engine.block_size
    for previous, r in zip(records, records[1:]):
        assert r.worker == previous.worker and r.held_tokens == r.context_tokens
        expected = r.context_tokens if sees_outputs else previous.prompt_tokens // B * B
        assert r.believed_tokens == expected
        # The reuse available counts the previous turn's computed outputs as history, as the engines cache them.
        assert r.available_tokens == r.captured_tokens == r.context_tokens
