"""Sessions inferred from a Mooncake trace's hash ids (sim/workloads/session_inference.py): the parent rule on a
hand-made trace (common prefix, siblings, a longer candidate), its properties on the head of Mooncake's conversation
trace, and session routing on the inferred sessions."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.replay import replay_sessions
from sim.workloads.session_traces import SessionTrace
from sim.workloads.traces import TraceError
from tests.replay.test_session_traces import scenario
from tests.support.paths import TRACES

HEAD = TRACES / "conversation_head400.jsonl"

ROWS = [  # 16-token ids; every request starts with block 0, as in Mooncake's conversation trace
    (0, 40, [0, 1, 2]),               # r0
    (1000, 40, [0, 3, 4]),            # r1 shares only block 0 with r0: a new session
    (2000, 70, [0, 1, 7, 8, 9]),      # r2 continues r0 (r0's full blocks 0, 1 lead it)
    (3000, 50, [0, 1, 10, 11]),       # r3 would continue r0 too, already continued: a new session
    (4000, 100, [0, 1, 7, 8, 12, 13, 14]),  # r4 continues r2 (its full blocks 0, 1, 7, 8)
    (5000, 35, [0, 3, 15]),           # r5 leads with r1's full blocks but is shorter than r1: a new session
    (6000, 20, [0, 16]),              # r6: one full block, block 0
    (7000, 40, [0, 17, 18]),          # r7 shares block 0 with r6 only: linked only if block 0 is not common
]


def write_rows(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text("".join(json.dumps({"timestamp": ts, "input_length": n, "output_length": 5, "hash_ids": ids}) + "\n"
                            for ts, n, ids in ROWS))
    return path


def infer(path, common_requests, **kw):
    return SessionTrace(path, block_size=16, fmt="mooncake", trace_block_tokens=16,
                        infer_common_requests=common_requests, **kw)


def test_the_parent_rule_on_a_hand_made_trace(tmp_path):
    path = write_rows(tmp_path)
    # K = 4: block 0 (8 requests) is common, block 1 (4 requests) is not.
    trace = infer(path, 4)
    assert [trace.parent_of(i) for i in range(8)] == [None, None, 0, None, 2, None, None, None]
    c = trace.inference.counts
    assert (c.common_ids, c.linked, c.siblings, c.longer_parent) == (1, 2, 1, 1)
    assert [trace.gap_s(i) for i in (2, 4)] == [2.0, 2.0]
    shape = trace.shape()
    assert (shape.sessions, shape.sizes) == (6, {1: 5, 3: 1})
    # K = 8: nothing is common, so r7 continues r6 through the system prompt block alone: what the threshold is for.
    loose = infer(path, 8)
    assert [loose.parent_of(i) for i in range(8)] == [None, None, 0, None, 2, None, None, 6]


def test_inferred_turns_are_linked_and_hit_their_parents_output(tmp_path):
    trace = infer(write_rows(tmp_path), 4)
    records = {r.request_id: r for r in replay_sessions(scenario(), trace.sessions(), keep_records=True).records}
    assert trace.unlinked == 0
    # r2 resends r0's 40 tokens and the 5 it generated: r0 computed 44 tokens = 2 blocks (its partial third block is
    # named by r2's id 7, its output block too), so r2 hits 32, capped at (70 - 1) // 16 = 4 blocks anyway.
    assert records[2].cached_tokens == 32
    # r4 hits r2's 4 full prompt blocks (64 tokens; r2 computed 74 tokens = 4 blocks).
    assert records[4].cached_tokens == 64
    assert records[2].sent_s == pytest.approx(records[0].finished_s + 2.0, rel=1e-12)
    assert records[4].sent_s == pytest.approx(records[2].finished_s + 2.0, rel=1e-12)
    assert records[7].cached_tokens == 16 and records[3].cached_tokens == 32  # block 0; r0's two full blocks


def test_on_the_conversation_head_every_link_obeys_the_rule():
    trace = SessionTrace(HEAD, block_size=64, infer_common_requests=100)
    lines = [json.loads(line) for line in HEAD.read_text().splitlines()]
    children = defaultdict(int)
    for i, line in enumerate(lines):
        p = trace.parent_of(i)
        if p is None:
            continue
        parent = lines[p]
        full = parent["input_length"] // 512
        assert line["hash_ids"][:full] == parent["hash_ids"][:full] and full >= 2  # beyond the common block 0
        assert line["input_length"] >= parent["input_length"] and line["timestamp"] >= parent["timestamp"]
        children[p] += 1
    assert set(children.values()) == {1}
    assert trace.inference.counts.common_ids == 1  # block 0 only
    assert trace.inference.counts.linked == len(children) == 37  # the head is 2 minutes; gaps are ~100 s
    # K = 300 marks only block 0 common in these 400 lines too: the same sessions.
    other = SessionTrace(HEAD, block_size=64, infer_common_requests=300)
    assert [other.parent_of(i) for i in range(len(lines))] == [trace.parent_of(i) for i in range(len(lines))]


def test_vllm_router_session_keeps_each_inferred_session_on_one_worker():
    trace = SessionTrace(HEAD, block_size=64, infer_common_requests=100)
    sc = scenario(workers=4, block_size=64).with_overrides(**{"router.name": "vllm-router-session"})
    records = replay_sessions(sc, trace.sessions(), keep_records=True).records
    workers = defaultdict(set)
    for r in records:
        workers[r.session_id].add(r.worker)
    assert all(len(w) == 1 for w in workers.values())
    assert len({r.worker for r in records}) == 4  # sessions, not one prefix, are what it hashes now


def test_the_cli_infers_sessions_and_says_what_it_inferred(tmp_path):
    result = CliRunner().invoke(main, ["replay", str(HEAD), "--infer-sessions", "--workers", "2", "--out",
                                       str(tmp_path), "--requests"])
    assert result.exit_code == 0, result.output
    assert "sessions inferred from hash ids:" in result.output and "closed loop" in result.output
    for args, message in (
        (["--common-prefix-requests", "5"], "--common-prefix-requests is for --infer-sessions"),
        (["--sessions", "recorded"], "--sessions is for session traces"),
    ):
        result = CliRunner().invoke(main, ["replay", str(HEAD), "--workers", "1", *args])
        assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output
    result = CliRunner().invoke(main, ["replay", str(TRACES / "bailian_synthetic.jsonl"), "--infer-sessions",
                                       "--workers", "1"])
    assert result.exit_code != 0 and "--infer-sessions is for Mooncake traces" in result.output


def test_inference_is_only_for_traces_without_sessions():
    with pytest.raises(TraceError, match="sessions are inferred for Mooncake traces without session ids"):
        SessionTrace(TRACES / "bailian_synthetic.jsonl", block_size=16, infer_common_requests=10)
