"""Narrated: the sessions workload end to end (`SessionWorkload` driven by `arrivals.sessions` in `run`).

Tiny chats (`session_scenarios.CHAT`): blocks of 16 tokens, a 32-token system prompt, 16-token messages and
outputs, so turn t's prompt is 32 + 32 t + 16 tokens and what turn t - 1 computed is its prompt + output - 1 tokens,
of which vLLM keeps the full blocks:

    turn 0: | sys 32 | u0 16 |                                  48 tokens, nothing cached
    turn 1: | sys 32 | u0 16 | o0 16 | u1 16 |                    80 tokens, 48 cached (turn 0's 63 computed, 3 blocks)
    turn 2: | sys 32 | u0 | o0 | u1 | o1 | u2 |                  112 tokens, 80 cached
"""

from __future__ import annotations

import gc
import weakref

import pytest
import simpy

from sim.cluster.arrivals import sessions
from sim.cluster.cluster import Cluster
from sim.results.summary import SessionFigures
from sim.runner import build_router, run
from sim.workloads.session_spec import SessionsSpec
from sim.workloads.session_workload import SessionWorkload
from sim.workloads.shared_prefix import rng_for
from tests.workloads.session_scenarios import CHAT, sessions_scenario


def _by_session(records):
    sessions: dict[int, list] = {}
    for r in sorted(records, key=lambda r: (r.session_id, r.turn)):
        sessions.setdefault(r.session_id, []).append(r)
    return sessions


def drain(source) -> list:
    """Every request of `source`, each session served alone and at once (completion at time 0, in order)."""
    requests = []
    for session in source:
        due = [r for r, _ in session.first()]
        while due:
            request = due.pop(0)
            requests.append(request)
            due.extend(r for r, _ in session.after(request, 0.0))
    return requests


AGENT = {"style": "agent", "sessions": 30, "concurrent_sessions": 3, "groups": 3, "popularity": "zipf",
         "system_tokens": {"kind": "uniform", "low": 16, "high": 200},
         "turns": {"kind": "uniform", "low": 2, "high": 9},
         "user_tokens": {"kind": "lognormal", "mean": 60, "sd": 40, "low": 1, "high": 300},
         "output_tokens": {"kind": "uniform", "low": 1, "high": 80},
         "tool_latency_s": {"kind": "exponential", "mean": 1.0},
         "context_limit_tokens": 800, "on_context_limit": "compact", "compact_summary_tokens": 40,
         "subagent_probability": 0.3, "subagent_turns": 2, "subagent_result_tokens": 30}


def _source(seed: int = 0, **changes) -> SessionWorkload:
    spec = SessionsSpec.model_validate({"kind": "sessions", **{**AGENT, **changes}})
    return SessionWorkload(spec, block_size=16, seed=seed)


def _shape(requests) -> list[tuple]:
    return [(r.request_id, r.session_id, r.turn, r.prompt_tokens, r.output_tokens, r.block_hashes,
             r.output_block_hashes, r.num_context_tokens) for r in requests]


def test_the_same_seed_gives_the_same_sessions_and_another_seed_others():
    assert _shape(drain(_source(0))) == _shape(drain(_source(0)))
    assert _shape(drain(_source(0))) != _shape(drain(_source(1)))


def test_changing_one_distribution_leaves_the_other_draws_alone():
    # Outputs drawn from another distribution: messages, groups and turn counts are the same draws.
    before = drain(_source(0, subagent_probability=0.0, subagent_turns=None, subagent_result_tokens=None,
                           context_limit_tokens=None, on_context_limit="truncate", compact_summary_tokens=None))
    after = drain(_source(0, subagent_probability=0.0, subagent_turns=None, subagent_result_tokens=None,
                          context_limit_tokens=None, on_context_limit="truncate", compact_summary_tokens=None,
                          output_tokens=7))
    assert [r.output_tokens for r in after] == [7] * len(after)
    assert [r.output_tokens for r in before] != [7] * len(before)
    assert [(r.session_id, r.turn, r.prefix_id, r.token_runs[-1]) for r in before] == \
        [(r.session_id, r.turn, r.prefix_id, r.token_runs[-1]) for r in after]  # the newest message, drawn alike


def test_request_ids_are_unique_and_segment_keys_name_session_turn_and_role():
    requests = drain(_source(0))
    assert sorted(r.request_id for r in requests) == list(range(len(requests)))
    for r in requests:
        for key, _ in r.token_runs:
            assert key[0] == "system" or (key[0] == "s" and key[3] in ("task", "tool", "result", "out", "summary"))
        assert r.output_key == ("s", r.session_id, r.turn, "out")
    subagents = {r.session_id for r in requests if r.session_id >= 30}
    assert subagents and min(subagents) == 30  # subagents numbered after the 30 sessions


def test_a_source_of_10000_sessions_holds_none_it_has_handed_out():
    source = _source(0, sessions=10_000, subagent_probability=0.0, subagent_turns=None,
                     subagent_result_tokens=None, turns=1)
    alive = weakref.WeakSet()
    count = 0
    for session in source:
        alive.add(session)
        session.after(session.first()[0][0], 0.0)
        count += 1
        del session
        if count % 1000 == 0:
            gc.collect()
            assert len(alive) <= 1
    assert count == 10_000


def test_the_driver_holds_only_the_running_sessions():
    scenario = sessions_scenario(**{**CHAT, "sessions": 40, "concurrent_sessions": 3, "turns": 2,
                                    "think_time_s": 0.5})
    env = simpy.Environment()
    cluster = Cluster(env, scenario, build_router(scenario))
    alive = weakref.WeakSet()
    peak = []

    def tracked():
        for session in SessionWorkload(scenario.workload, block_size=16, seed=scenario.seed):
            alive.add(session)
            yield session

    def on_record(_record) -> None:
        gc.collect()
        peak.append(len(alive))

    env.process(sessions(env, cluster, tracked(), on_record, concurrency=3))
    env.run()
    assert len(peak) == 80 and max(peak) == 3


def test_a_closed_loop_runs_at_most_c_sessions_at_once():
    scenario = sessions_scenario(**{**CHAT, "sessions": 12, "concurrent_sessions": 3,
                                    "turns": {"kind": "uniform", "low": 1, "high": 5},
                                    "think_time_s": {"kind": "exponential", "mean": 1.0}})
    result = run(scenario)
    spans = sorted((rs[0].sent_s, rs[-1].finished_s) for rs in _by_session(result.records).values())
    assert len(spans) == 12
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans], key=lambda e: (e[0], e[1]))
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak == 3


def test_poisson_session_starts_follow_the_session_starts_stream():
    scenario = sessions_scenario(**{**CHAT, "sessions": 6, "concurrent_sessions": None, "session_rate_per_s": 0.5})
    result = run(scenario)
    starts = [rs[0].sent_s for rs in _by_session(result.records).values()]
    draws = rng_for(scenario.seed, "session-starts")
    expected, t = [], 0.0
    for _ in range(6):
        t += draws.expovariate(0.5)
        expected.append(t)
    assert starts == pytest.approx(expected)


def test_no_turn_is_sent_before_its_predecessor_finished_plus_its_think_time():
    result = run(sessions_scenario(**{**CHAT, "think_time_s": 2.0}))
    for turns in _by_session(result.records).values():
        for before, after in zip(turns, turns[1:]):
            assert after.sent_s == pytest.approx(before.finished_s + 2.0)


def test_think_times_drawn_delay_each_turn_by_at_least_their_low():
    result = run(sessions_scenario(**{**CHAT, "sessions": 5, "think_time_s": {"kind": "uniform", "low": 1.5,
                                                                               "high": 3.0}}))
    gaps = [after.sent_s - before.finished_s for turns in _by_session(result.records).values()
            for before, after in zip(turns, turns[1:])]
    assert len(gaps) == 15 and min(gaps) >= 1.5 - 1e-9 and max(gaps) <= 3.0 + 1e-9 and len(set(gaps)) == 15


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_a_subagent_starts_when_its_turn_finishes_and_the_agent_waits_for_its_result(engine):
    # One agent of 3 turns; turn 0 and turn 1 each fork a 2-turn subagent (probability 1); tools take 5 s.
    scenario = sessions_scenario(engine, style="agent", sessions=1, concurrent_sessions=1, system_tokens=32,
                                 turns=3, user_tokens=16, output_tokens=16, tool_latency_s=5.0,
                                 subagent_probability=1.0, subagent_turns=2, subagent_result_tokens=48)
    sessions = _by_session(run(scenario).records)
    agent, first, second = sessions[0], sessions[1], sessions[2]
    assert [len(agent), len(first), len(second)] == [3, 2, 2]
    for parent_turn, child in ((agent[0], first), (agent[1], second)):
        assert child[0].sent_s == pytest.approx(parent_turn.finished_s)  # forked at once
        assert child[1].sent_s == pytest.approx(child[0].finished_s + 5.0)  # its own tool's latency
        assert child[-1].output_tokens == 48  # its result
    for parent_turn, child, next_turn in ((agent[0], first, agent[1]), (agent[1], second, agent[2])):
        # The next call waits for the tool (5 s) and the subagent; the subagent's 2 turns take longer.
        assert next_turn.sent_s == pytest.approx(max(parent_turn.finished_s + 5.0, child[-1].finished_s))
        assert next_turn.sent_s > parent_turn.finished_s + 5.0
        # Its prompt: the agent's context + its output + a tool result (16) + the subagent's result (48).
        assert next_turn.prompt_tokens == parent_turn.prompt_tokens + 16 + 16 + 48
    # The subagent's first prompt is the agent's turn 0 (48 tokens) + its output (16) + its task (16): it finds
    # what turn 0 computed (63 tokens; vLLM: 3 full blocks) cached on the one worker.
    assert first[0].prompt_tokens == 80 and first[0].context_tokens == 48
    assert first[0].cached_tokens == (48 if engine == "vllm" else 63)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_truncation_breaks_the_prefix_back_to_the_system_prompt(engine):
    # A 112-token limit: turn 2 would be 112 + 16 output > 112, so turn 0 (u0, o0) is dropped: | sys | u1 | o1 | u2 |,
    # 80 tokens, under a new lineage; the same again every turn after (a sliding window).
    scenario = sessions_scenario(engine, **{**CHAT, "sessions": 1, "turns": 5, "context_limit_tokens": 112})
    records = run(scenario).records
    assert [r.prompt_tokens for r in records] == [48, 80, 80, 80, 80]
    # Turn 1 finds turn 0's computed tokens (vLLM: 3 full blocks; SGLang at page size 1: all 63); every turn
    # after a truncation finds the system prompt only (32 tokens), on both engines.
    assert [r.cached_tokens for r in records] == [0, 48 if engine == "vllm" else 63, 32, 32, 32]
    assert [r.context_tokens for r in records] == [0, 48, 32, 32, 32]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_compaction_keeps_the_system_prompt_and_a_summary(engine):
    scenario = sessions_scenario(engine, **{**CHAT, "sessions": 1, "turns": 4, "context_limit_tokens": 112,
                                            "on_context_limit": "compact", "compact_summary_tokens": 16})
    records = run(scenario).records
    # Turn 2: | sys 32 | summary 16 | u2 16 | = 64 tokens; turn 3 extends it: + o2 16 + u3 16 = 96.
    assert [r.prompt_tokens for r in records] == [48, 80, 64, 96]
    assert [r.cached_tokens for r in records] == [0, 48 if engine == "vllm" else 63, 32, 64 if engine == "vllm" else 79]


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_per_turn_hits_grow_with_the_context(engine):
    # Two chats one after the other on one worker with room for both: every turn t >= 1 finds all that turn t - 1
    # computed, 32 t + 31 tokens (vLLM: its full blocks, 32 t + 16; SGLang at page size 1: all of them).
    result = run(sessions_scenario(engine, **CHAT))
    figures = SessionFigures.of(result.records)
    rows = figures.turn_rows()
    assert [row["turn"] for row in rows] == [0, 1, 2, 3]
    assert [row["requests"] for row in rows] == [2, 2, 2, 2]
    per_turn = {t: sorted(r.cached_tokens for r in result.records if r.turn == t) for t in range(4)}
    if engine == "vllm":
        # turn 0: the second chat finds the first's system prompt (2 blocks) in the one worker's cache.
        assert per_turn == {0: [0, 32], 1: [48, 48], 2: [80, 80], 3: [112, 112]}
    else:
        assert per_turn == {0: [0, 32], 1: [63, 63], 2: [95, 95], 3: [127, 127]}
    assert [row["gap_survival"] for row in rows[1:]] == [1.0, 1.0, 1.0]
