"""Session-structured traces: format detection, FILE:LINE errors, linking a turn to its parent (output blocks and
tokens), closed-loop and recorded timing, and exact reuse on one unbounded worker against a naive model of vLLM's
rules. The fixture, tests/fixtures/traces/bailian_synthetic.jsonl, is synthetic (its README says how it was made)."""

from __future__ import annotations

import csv
import json
import math

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.engines.sglang.tokens import output_tokens, prompt_tokens
from sim.replay import replay, replay_sessions
from sim.scenario import load_scenario
from sim.workloads.session_traces import SessionTrace, trace_format
from sim.workloads.traces import TraceError
from tests.support.paths import SCENARIOS, TRACES

BAILIAN = TRACES / "bailian_synthetic.jsonl"
LINES = [json.loads(line) for line in BAILIAN.read_text().splitlines()]
N = len(LINES)
ROOTS = sum(line["parent_chat_id"] not in {other["chat_id"] for other in LINES} for line in LINES)
"""First turns: parent -1, or a parent before the file's window (one orphan is planted)."""


def scenario(engine: str = "vllm", *, workers: int = 1, block_size: int = 16, kv_tokens: int = 1_000_000):
    base = load_scenario(SCENARIOS / "trace-replay.yaml")[0]
    if engine != base.engine.kind:
        base = base.with_engine(engine)
    sc = base.with_overrides(**{"engine.block_size": block_size, "cluster.workers": workers})
    return sc.with_overrides(**sc.engine.capacity_overrides(tokens=kv_tokens, blocks=None, kv_bytes=None))


def requests_by_id(trace: SessionTrace) -> dict:
    return {item.request.request_id: item.request for item in trace.recorded()}


# -- formats and errors ---------------------------------------------------------------------------------------


def test_formats_are_detected_from_the_first_line(tmp_path):
    assert trace_format(BAILIAN) == "bailian"
    assert trace_format(TRACES / "conversation_head400.jsonl") == "mooncake"
    mine = tmp_path / "s.jsonl"
    mine.write_text('{"id": 1, "parent": null, "timestamp_s": 0, "input_length": 3, "output_length": 2, '
                    '"hash_ids": [7]}\n')
    assert trace_format(mine) == "kvsim"


BAD_BAILIAN = [
    ({"chat_id": "x"}, "field 'chat_id' must be an integer"),
    ({"parent_chat_id": -4}, "field 'parent_chat_id' must be a chat_id or -1, got -4"),
    ({"timestamp": -1}, "field 'timestamp' must be a finite number of seconds >= 0"),
    ({"type": 3}, "field 'type' must be a string"),
    ({"turn": 0}, "field 'turn' must be >= 1"),
    ({"input_length": 20}, "field 'hash_ids' has 1 ids; input_length 20 needs ceil(20/16) = 2"),
    ({"hash_ids": [True]}, "field 'hash_ids' must hold non-negative integers"),
]


@pytest.mark.parametrize("change, message", BAD_BAILIAN)
def test_a_malformed_bailian_line_names_file_line_and_field(tmp_path, change, message):
    good = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 0.5, "input_length": 10, "output_length": 4,
            "type": "text", "turn": 1, "hash_ids": [11]}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "chat_id": 2, **change}) + "\n")
    with pytest.raises(TraceError) as err:
        SessionTrace(path, block_size=16)
    assert str(err.value).startswith(f"{path}:2: ") and message in str(err.value)


def test_bailian_order_and_ids_are_checked(tmp_path):
    root = {"chat_id": 1, "parent_chat_id": -1, "timestamp": 5.0, "input_length": 10, "output_length": 4,
            "hash_ids": [11]}
    path = tmp_path / "t.jsonl"
    path.write_text(json.dumps(root) + "\n" + json.dumps({**root, "chat_id": 2, "parent_chat_id": 1,
                                                            "timestamp": 4.0}) + "\n")
    with pytest.raises(TraceError, match=r":2: timestamp 4.0 is before its parent's \(5.0, line 1\)"):
        SessionTrace(path, block_size=16)
    path.write_text(json.dumps(root) + "\n" + json.dumps(root) + "\n")
    with pytest.raises(TraceError, match=r":2: id 1 repeats line 1's"):
        SessionTrace(path, block_size=16)


@pytest.mark.parametrize("line, message", [
    ({"id": 2, "timestamp_s": 1, "input_length": 3, "output_length": 1, "hash_ids": [1]}, "missing field 'parent'"),
    ({"id": 2, "parent": 1, "input_length": 3, "output_length": 1, "hash_ids": [1]},
     "a turn with a parent needs 'timestamp_s' or 'delay_s'"),
    ({"id": 2, "parent": None, "timestamp_s": 1, "delay_s": 2, "input_length": 3, "output_length": 1,
      "hash_ids": [1]}, "field 'delay_s' is for a turn with a parent"),
    ({"id": 2, "parent": 1, "delay_s": 1, "input_length": 3, "output_length": 1, "hash_ids": [1],
      "block_size": 8}, "field 'block_size' is 8; earlier lines have 16"),
])
def test_a_malformed_kvsim_line_names_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "s.jsonl"
    path.write_text('{"id": 1, "parent": null, "timestamp_s": 0, "input_length": 3, "output_length": 2, '
                    '"hash_ids": [7]}\n' + json.dumps(line) + "\n")
    with pytest.raises(TraceError) as err:
        SessionTrace(path, block_size=16)
    assert str(err.value).startswith(f"{path}:2: ") and message in str(err.value)


def test_the_cli_reports_a_bad_line_in_one_line_without_a_traceback(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_text(BAILIAN.read_text().splitlines()[0] + "\n" + '{"chat_id": 5, "parent_chat_id": -1}\n')
    result = CliRunner().invoke(main, ["replay", str(path), "--workers", "1"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == f"Error: {path}:2: missing field 'timestamp'"
    assert "Traceback" not in result.output


# -- linking --------------------------------------------------------------------------------------------------


def test_a_parents_output_blocks_are_its_first_childs_ids_and_its_tokens_agree():
    trace = SessionTrace(BAILIAN, block_size=16)
    requests = requests_by_id(trace)
    assert (len(requests), trace.orphans, trace.unlinked) == (N, 1, 1)
    linked = 0
    for rid, child in requests.items():
        pid = trace.parent_of(rid)
        if pid is None:
            continue
        parent = requests[pid]
        P, O = parent.prompt_tokens, parent.output_tokens
        line = LINES[rid]
        assert child.block_hashes == tuple(line["hash_ids"][: line["input_length"] // 16])
        if child.prompt_tokens < P or child.block_hashes[: P // 16] != parent.block_hashes:
            continue  # the one child that dropped its history
        assert child.session_id == parent.session_id and child.turn == parent.turn + 1
        m = min(O, child.prompt_tokens - P)
        n_out = min((P + O) // 16, child.prompt_tokens // 16) - P // 16
        if rid == next(trace.children(pid)):
            # The first child names the parent's output blocks: the child's ids after the parent's full prompt blocks.
            assert parent.output_block_hashes == child.block_hashes[P // 16: P // 16 + n_out]
            linked += 1
        # SGLang: the child's prompt starts with the parent's prompt then its m outputs, token for token, when it
        # shares the output blocks.
        shares_output = child.block_hashes[P // 16: P // 16 + n_out] == parent.output_block_hashes[:n_out]
        sequence = prompt_tokens(parent, 16) + output_tokens(parent, O)
        assert prompt_tokens(child, 16).match(sequence) == (P + m if shares_output else P)
    assert linked == N - ROOTS - 1 - 1  # every child but the regenerated one's sibling and the one that dropped history


def test_a_partial_output_resend_links_only_the_blocks_the_child_holds():
    # Session 3's third turn resent half of its parent's output: the child's prompt ends before the parent's output
    # does, so the parent's output blocks stop at the child's last full block.
    trace = SessionTrace(BAILIAN, block_size=16)
    requests = requests_by_id(trace)
    short = [r for rid, r in requests.items() if (p := trace.parent_of(rid)) is not None
             and requests[p].prompt_tokens <= r.prompt_tokens < requests[p].prompt_tokens + requests[p].output_tokens]
    assert len(short) == 1
    child = short[0]
    parent = requests[trace.parent_of(child.request_id)]
    assert 0 < len(parent.output_block_hashes) == child.prompt_tokens // 16 - parent.prompt_tokens // 16


def test_engine_blocks_smaller_than_the_trace_blocks_keep_parent_and_child_linked():
    trace = SessionTrace(BAILIAN, block_size=8)
    requests = requests_by_id(trace)
    for rid, child in requests.items():
        pid = trace.parent_of(rid)
        if pid is not None and rid == next(trace.children(pid)) and requests[pid].output_block_hashes:
            parent = requests[pid]
            k = len(parent.block_hashes)
            assert child.block_hashes[:k] == parent.block_hashes
            assert child.block_hashes[k: k + len(parent.output_block_hashes)] == parent.output_block_hashes
    assert trace.unlinked == 1


def test_a_session_that_repeats_a_trace_id_keeps_its_blocks_distinct_and_linked(tmp_path):
    # ids [7, 8, 7, ...]: the third trace block is another block (`sub_block_hashes` chains the ids past a repeat),
    # in the prompt's own hashes and in the names its chain gives its outputs and partial block alike; keyed by the
    # id alone one prompt held block 7 twice and the KV-aware router's active blocks raised KeyError: 7.
    rows = []
    for s in range(4):
        own = [7, 8, 7] + [1000 * s + 10 + j for j in range(5)]
        rows.append({"id": 10 * s, "parent": None, "timestamp_s": s, "input_length": 16 * 8 - 5, "output_length": 40,
                     "hash_ids": own})
        # the child: the parent's 123 tokens, its 40 outputs and 30 new ones, under the parent's 7 full trace blocks
        new_ids = [1000 * s + 100 + j for j in range(-(-(16 + 40 + 30) // 16))]
        rows.append({"id": 10 * s + 1, "parent": 10 * s, "timestamp_s": s + 0.5, "input_length": 123 + 40 + 30,
                     "output_length": 8, "hash_ids": own[:7] + new_ids})
    path = tmp_path / "repeats.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = SessionTrace(path, block_size=16)
    requests = requests_by_id(trace)
    for rid, r in requests.items():
        blocks = r.block_hashes + r.output_block_hashes
        assert len(set(blocks)) == len(blocks)
        pid = trace.parent_of(rid)
        if pid is not None:
            parent = requests[pid]
            linked = parent.block_hashes + parent.output_block_hashes
            assert r.block_hashes[:len(linked)] == linked
    first, other = requests[0], requests[2]  # request ids are line numbers: sessions 0 and 1 start on lines 0 and 2
    assert first.block_hashes[:3] == other.block_hashes[:3]  # [7, 8, 7]: the same path, the same blocks
    out = tmp_path / "out"
    result = CliRunner().invoke(main, ["replay", str(path), "--trace-format", "kvsim", "--workers", "2",
                                       "--kv-blocks", "200", "--router", "kv-aware", "--out", str(out)])
    assert result.exit_code == 0, result.output


# -- timing ---------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def closed_loop_csv(tmp_path_factory):
    """The done-when command: one worker, unbounded KV, blocks of 16, closed loop by default."""
    out = tmp_path_factory.mktemp("closed")
    result = CliRunner().invoke(main, ["replay", str(BAILIAN), "--workers", "1", "--kv-tokens", "100000000",
                                       "--block-size", "16", "--out", str(out), "--requests"])
    assert result.exit_code == 0, result.output
    assert "1 whose parent is not in the file" in result.output and "1 whose prompt does not extend" in result.output
    with open(out / "requests.csv") as f:
        return list(csv.DictReader(f)), (out / "summary.csv").read_text()


def test_closed_loop_sends_each_turn_its_gap_after_its_parent_finished():
    trace = SessionTrace(BAILIAN, block_size=16)
    records = {r.request_id: r for r in replay_sessions(scenario(), trace.sessions(), keep_records=True).records}
    assert len(records) == N
    children = 0
    for rid, r in records.items():
        line = LINES[rid]
        pid = trace.parent_of(rid)
        if pid is None:
            assert r.sent_s == line["timestamp"]  # a first turn (or an orphan) at its timestamp
            continue
        gap = line["timestamp"] - LINES[pid]["timestamp"]
        assert trace.gap_s(rid) == gap
        assert r.sent_s == pytest.approx(records[pid].finished_s + gap, rel=1e-12)
        assert r.sent_s > records[pid].finished_s
        children += 1
    assert children == N - ROOTS


def test_requests_csv_shows_no_turn_sent_before_its_parent_finished(closed_loop_csv):
    rows, _ = closed_loop_csv
    by_id = {int(r["request_id"]): r for r in rows}
    for rid, row in by_id.items():
        if row["parent_request_id"] == "":
            continue
        parent = by_id[int(row["parent_request_id"])]
        assert float(row["parent_finished_s"]) == float(parent["finished_s"])
        # NOTE: the CSV keeps 6 significant digits.
        assert float(row["sent_s"]) == pytest.approx(float(parent["finished_s"]) + float(row["gap_s"]), rel=1e-5)
        assert float(row["sent_s"]) > float(parent["finished_s"])


def test_recorded_timing_keeps_every_timestamp(tmp_path):
    result = CliRunner().invoke(main, ["replay", str(BAILIAN), "--workers", "2", "--block-size", "16",
                                       "--sessions", "recorded", "--out", str(tmp_path), "--requests"])
    assert result.exit_code == 0, result.output
    with open(tmp_path / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert [float(r["sent_s"]) for r in rows] == [line["timestamp"] for line in LINES]


def test_kvsim_delays_are_the_gap_after_the_parent_finished():
    path = TRACES / "session_kvsim.jsonl"
    trace = SessionTrace(path, block_size=16)
    result = replay_sessions(scenario(), trace.sessions(), keep_records=True)
    by_id = {r.request_id: r for r in result.records}
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for i, line in enumerate(lines):
        if line["parent"] is None:
            assert by_id[i].sent_s == line["timestamp_s"]
        else:
            parent = next(j for j, other in enumerate(lines) if other["id"] == line["parent"])
            expected = line["delay_s"] if "delay_s" in line else line["timestamp_s"] - lines[parent]["timestamp_s"]
            assert by_id[i].sent_s == pytest.approx(by_id[parent].finished_s + expected, abs=1e-9)


def test_closed_loop_refuses_to_split_and_says_so():
    result = CliRunner().invoke(main, ["replay", str(BAILIAN), "--workers", "2", "--block-size", "16",
                                       "--jobs", "2", "--router", "round-robin"])
    assert result.exit_code == 0, result.output
    assert "closed-loop sessions replay in one process" in result.output


# -- reuse ----------------------------------------------------------------------------------------------------


def naive_vllm_hits(order: list[int]) -> dict[int, int]:
    """vLLM's prefix-cache rules on one unbounded worker, from the trace's lines alone: a set of cached block ids;
    a request hits the leading run of its full blocks that are cached, capped at (prompt - 1) // 16 blocks; then
    its prompt blocks and the full blocks of its prompt + output - 1 tokens are cached, output blocks named by the
    first child (in file order) whose prompt extends the request's prompt."""
    ids_of = {line["chat_id"]: i for i, line in enumerate(LINES)}
    first_child = {}
    for i, line in enumerate(LINES):
        p = ids_of.get(line["parent_chat_id"])
        if p is not None and p not in first_child:
            first_child[p] = i
    cached: set = set()
    hits = {}
    for i in order:
        line = LINES[i]
        P, O = line["input_length"], line["output_length"]
        blocks = line["hash_ids"][: P // 16]
        n = 0
        while n < len(blocks) and blocks[n] in cached:
            n += 1
        hits[i] = min(n, (P - 1) // 16) * 16
        computed = list(blocks)
        c = first_child.get(i)
        if c is not None:
            child = LINES[c]
            if child["input_length"] >= P and child["hash_ids"][: P // 16] == blocks:
                computed = child["hash_ids"][: min((P + O - 1) // 16, child["input_length"] // 16)]
        cached.update(computed)
    return hits


def test_one_unbounded_worker_delivers_exactly_what_vllms_rules_give(closed_loop_csv):
    rows, summary = closed_loop_csv
    order = [int(r["request_id"]) for r in sorted(rows, key=lambda r: float(r["arrival_s"]))]
    expected = naive_vllm_hits(order)
    assert {int(r["request_id"]): int(r["cached_tokens"]) for r in rows} == expected
    prompt = sum(line["input_length"] for line in LINES)
    reuse = float(next(csv.DictReader(summary.splitlines()))["prefix_reuse"])
    assert reuse == pytest.approx(sum(expected.values()) / prompt, rel=1e-5)  # the CSV keeps 6 digits
    # Output blocks count: without them the same stream would hit less.
    assert sum(expected.values()) > sum(naive_without_outputs(order).values())


def naive_without_outputs(order: list[int]) -> dict[int, int]:
    cached: set = set()
    hits = {}
    for i in order:
        line = LINES[i]
        blocks = line["hash_ids"][: line["input_length"] // 16]
        n = 0
        while n < len(blocks) and blocks[n] in cached:
            n += 1
        hits[i] = min(n, (line["input_length"] - 1) // 16) * 16
        cached.update(blocks)
    return hits


def test_both_engines_replay_the_bailian_fixture():
    trace = SessionTrace(BAILIAN, block_size=16)
    vllm = replay_sessions(scenario("vllm"), trace.sessions(), keep_records=True)
    # NOTE: pages of 1 token (the scenario's 64-token pages would round SGLang's hits down).
    paged16 = scenario("sglang").with_overrides(**{"engine.page_size": 1})
    sglang = replay_sessions(paged16, SessionTrace(BAILIAN, block_size=16).sessions(), keep_records=True)
    assert vllm.stats.requests == sglang.stats.requests == N
    v = {r.request_id: r.cached_tokens for r in vllm.records}
    s = {r.request_id: r.cached_tokens for r in sglang.records}
    # A token-granular radix tree hits at least the whole blocks vLLM hits, and more where a turn extends its
    # parent's partial last block or output.
    assert all(s[i] >= v[i] for i in v)
    assert sum(s.values()) > sum(v.values())
    figures = sglang.stats.session_figures()
    assert figures is not None and figures.num_sessions == ROOTS
    # On the scenario's own pages too, every turn after the first hits.
    default = replay_sessions(scenario("sglang"), SessionTrace(BAILIAN, block_size=16).sessions())
    turn1 = sum(1 for rid in range(N) if trace.parent_of(rid) is not None and trace.parent_of(trace.parent_of(rid)) is None)
    assert default.stats.requests == N and default.stats.session_figures().turns[1].hit_requests == turn1


def test_recorded_sessions_split_over_processes_like_one(tmp_path):
    trace = SessionTrace(BAILIAN, block_size=16)
    sc = scenario(workers=2).with_overrides(**{"router.name": "round-robin"})
    one = replay(sc, trace.recorded, jobs=1)
    two = replay(sc, trace.recorded, jobs=2)
    assert one.row()["prefix_reuse"] == two.row()["prefix_reuse"]
    assert math.isclose(one.stats.ttft_ms.percentile(50), two.stats.ttft_ms.percentile(50))


# -- mooncake-delta (Dynamo's mocker format) ------------------------------------------------------------------


def test_mooncake_delta_turns_resend_the_history_and_hit_what_dynamos_mocker_hits(tmp_path):
    # The probe of benchmarks/oracles/dynamo-mocker/session-formats.md on ai-dynamo-runtime 1.6.1 (one worker, vLLM, blocks
    # of 16): turn 0 sends 40 tokens and generates 20; turn 1 adds a 20-token delta: 80 tokens, 48 reused (the full
    # blocks of 40 + 20 - 1 computed tokens); turn 2 adds 16 after an output of 10: 106 tokens, 80 reused.
    path = tmp_path / "delta.jsonl"
    path.write_text(
        '{"session_id": "a", "timestamp": 0, "input_length": 40, "output_length": 20, "hash_ids": [1, 2, 3]}\n'
        '{"session_id": "a", "delay": 500, "input_length": 20, "output_length": 10, "hash_ids": [4, 5]}\n'
        '{"session_id": "a", "delay": 500, "input_length": 16, "output_length": 4, "hash_ids": [6]}\n')
    trace = SessionTrace(path, block_size=16, fmt="mooncake-delta", trace_block_tokens=16)
    for engine in ("vllm", "sglang"):
        sc = scenario(engine) if engine == "vllm" else scenario(engine).with_overrides(**{"engine.page_size": 16})
        records = sorted(replay_sessions(sc, trace.sessions(), keep_records=True).records, key=lambda r: r.request_id)
        assert [(r.prompt_tokens, r.cached_tokens) for r in records] == [(40, 0), (80, 48), (106, 80)], engine
        # Closed loop: each turn 500 ms (the delay, in ms) after its predecessor's last token.
        assert records[1].sent_s == pytest.approx(records[0].finished_s + 0.5, rel=1e-12)
        assert records[2].sent_s == pytest.approx(records[1].finished_s + 0.5, rel=1e-12)


def test_mooncake_delta_sessions_share_a_first_delta_across_sessions_and_derive_gaps_from_timestamps(tmp_path):
    path = tmp_path / "delta.jsonl"
    path.write_text(
        '{"session_id": "a", "timestamp": 0, "input_length": 32, "output_length": 3, "hash_ids": [1, 2]}\n'
        '{"session_id": "b", "timestamp": 100, "input_length": 40, "output_length": 3, "hash_ids": [1, 2, 9]}\n'
        '{"session_id": "a", "timestamp": 2000, "input_tokens": 5, "output_tokens": 3, "hash_ids": [7]}\n')
    trace = SessionTrace(path, block_size=16, fmt="mooncake-delta", trace_block_tokens=16)
    assert [trace.parent_of(i) for i in range(3)] == [None, None, 0]
    assert trace.gap_s(2) == 2.0  # 2000 ms after the predecessor's 0, counted from its completion
    records = sorted(replay_sessions(scenario(), trace.sessions(), keep_records=True).records,
                     key=lambda r: r.request_id)
    assert [r.cached_tokens for r in records] == [0, 32, 32]  # b shares a's two blocks; a's turn 1 hits 32 + 3 - 1
    with pytest.raises(TraceError, match=r":1: field 'delay' must be 0 on a session's first turn, got 5 ms"):
        path.write_text('{"session_id": "a", "delay": 5, "input_length": 3, "output_length": 1, "hash_ids": [1]}\n')
        SessionTrace(path, block_size=16, fmt="mooncake-delta", trace_block_tokens=16)


def _tokens(runs) -> list:
    return [(key, j) for key, n in runs for j in range(n)]


def _common(a: list, b: list) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@pytest.mark.parametrize("seed", range(6))
def test_mooncake_delta_runs_are_few_and_share_exactly_what_the_hash_ids_share(tmp_path, seed):
    # Against the reader's first way (a run per hash id, the parent's runs resent): every two prompts share the
    # same number of leading tokens, and the block hashes are the same values. First turns draw their ids from a
    # few shared prefixes (some ending inside a trace block), so the trie joins, splits and departs mid-edge.
    import random
    from sim.workloads.session_traces import content_block_hashes, own_runs
    rng = random.Random(seed)
    tb, B = 4, rng.choice([2, 4])
    stems = [[rng.randrange(6) for _ in range(rng.randrange(1, 6))] for _ in range(3)]
    rows, next_id = [], 100
    for s in range(8):
        turns = rng.randrange(1, 4)
        for k in range(turns):
            if k == 0:
                ids = list(rng.choice(stems))[: rng.randrange(1, 6)]
                ids += [next_id + j for j in range(rng.randrange(0, 3))]
                next_id += 3
                n = rng.randrange((len(ids) - 1) * tb + 1, len(ids) * tb + 1)
                timing = {"timestamp": s * 10}
            else:
                n = rng.randrange(1, 10)
                ids = [next_id + j for j in range(-(-n // tb))]
                next_id += len(ids)
                timing = {"delay": 5}
            rows.append({"session_id": f"s{s}", **timing, "input_length": n, "output_length": rng.randrange(1, 7),
                         "hash_ids": ids})
    path = tmp_path / "delta.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trace = SessionTrace(path, block_size=B, fmt="mooncake-delta", trace_block_tokens=tb)
    built, old_runs = {}, {}
    for session in trace.sessions():
        todo = session.first()
        while todo:
            request = todo.pop()[0]
            i, row, parent = request.request_id, rows[request.request_id], trace.parent_of(request.request_id)
            built[i] = request
            own = own_runs(row["hash_ids"], 0, row["input_length"], tb)
            old = own if parent is None else [*old_runs[parent], ((-1, parent), built[parent].output_tokens), *own]
            old_runs[i] = old
            n_in, n_out = request.prompt_tokens, request.output_tokens
            hashes = content_block_hashes([*old, ((-1, i), n_out)], B, (n_in + n_out) // B)
            assert request.block_hashes == hashes[: n_in // B]
            assert request.output_block_hashes == (hashes[n_in // B:] if trace.first_child[i] >= 0 else ())
            if parent is not None:  # the parent's runs, its output, the delta
                assert len(request.token_runs) == len(built[parent].token_runs) + 2
            todo += session.after(request, 0.0)
    built = list(built.values())
    tokens = {r.request_id: _tokens(r.token_runs) for r in built}
    for a in built:
        for b in built:
            assert _common(tokens[a.request_id], tokens[b.request_id]) == _common(
                _tokens(old_runs[a.request_id]), _tokens(old_runs[b.request_id])), (a.request_id, b.request_id)


# -- mooncake-sessions (Mooncake rows with session_id, as Dynamo's mocker reads them) ----------------------------

MOONCAKE_SESSIONS = TRACES / "mooncake_sessions.jsonl"
"""Hand-written: sessions a (3 turns, each resending the history) and b (a turn that ends in its parent's last
512-token block, one that drops the history, one after a row without timestamp), 512-token ids."""


def test_mooncake_rows_with_session_id_are_detected_as_sessions_and_timed_as_the_mocker_times_them():
    assert trace_format(MOONCAKE_SESSIONS) == "mooncake-sessions"
    trace = SessionTrace(MOONCAKE_SESSIONS, block_size=64)
    assert trace.trace_block_tokens == 512
    # Rows of one session_id are its turns in file order: a = lines 1, 4, 6; b = lines 2, 3, 5, 7.
    assert [trace.parent_of(i) for i in range(7)] == [None, None, 1, 0, 2, 3, 4]
    # Gaps: the timestamp difference (30 s, 10 s), the delay (2000 ms), 0 without either, and from the session's
    # last row that had a timestamp when the previous one has none (60 s - 20 s), as the mocker's probe showed.
    assert [trace.gap_s(i) for i in (3, 2, 5, 4, 6)] == [30.0, 10.0, 2.0, 0.0, 40.0]
    records = {r.request_id: r for r in replay_sessions(scenario(block_size=64), trace.sessions(),
                                                        keep_records=True).records}
    assert records[3].sent_s == pytest.approx(records[0].finished_s + 30.0, rel=1e-12)
    assert records[5].sent_s == pytest.approx(records[3].finished_s + 2.0, rel=1e-12)
    assert records[4].sent_s == pytest.approx(records[2].finished_s, rel=1e-12)
    assert records[6].sent_s == pytest.approx(records[4].finished_s + 40.0, rel=1e-12)


def test_mooncake_session_turns_link_as_bailian_turns_and_hit_exactly():
    # One unbounded worker, blocks of 64 in 512-token ids (8 engine blocks an id).
    # a0 (1000 tokens, out 300): nothing cached yet -> 0. Its blocks inside its partial id 2 and its output blocks are
    #   named by the first descendant whose full ids cover them (a1's id 3, a2's id 5).
    # b0 (600): block 1 of a0 -> 512.  b1 (700) ends inside b0's last id: linked on b0's full ids, it takes b0's
    #   names for b0's whole prompt -> 9 blocks = 576 (b0's output sits in b1's partial id, which no descendant
    #   has in full, so it is not named: one block short of the 640 a real resend would hit).
    # a1 (1400): a0's prompt and the 5 output blocks it computed (1299 tokens = 20 blocks) -> 1280.
    # b2 (600, ids 10, 11) drops the history: not linked, 0.  a2 (1700): a1's 21 + 3 output blocks -> 1536.
    # b3 (800) extends b1, not b2 (its predecessor): not linked; block 1 -> 512.
    trace = SessionTrace(MOONCAKE_SESSIONS, block_size=64)
    result = replay_sessions(scenario(block_size=64), trace.sessions(), keep_records=True)
    hits = {r.request_id: r.cached_tokens for r in result.records}
    assert [hits[i] for i in range(7)] == [0, 512, 576, 1280, 0, 1536, 512]
    assert trace.unlinked == 2
    # With engine blocks as large as the ids, the names are the ids; a1 then hits a0's 2 full blocks of computed
    # tokens (1299 // 512) and a2 a1's 3 (1599 // 512).
    big = SessionTrace(MOONCAKE_SESSIONS, block_size=512)
    hits = {r.request_id: r.cached_tokens for r in replay_sessions(scenario(block_size=512), big.sessions(),
                                                                    keep_records=True).records}
    assert [hits[i] for i in range(7)] == [0, 512, 512, 1024, 0, 1536, 512]
    paged = scenario("sglang", block_size=64).with_overrides(**{"engine.page_size": 1})
    sglang = {r.request_id: r.cached_tokens
              for r in replay_sessions(paged, SessionTrace(MOONCAKE_SESSIONS, block_size=64).sessions(),
                                       keep_records=True).records}
    # SGLang's radix tree (pages of 1 token) hits b0's whole prompt in b1 (600: the ids name no output there) and
    # all that a0 and a1 committed (prompt + output - 1) in a1 and a2.
    assert [sglang[i] for i in range(7)] == [0, 512, 600, 1299, 0, 1599, 512]


def test_mooncake_sessions_replay_from_the_cli_closed_loop_by_default_and_refuse_recorded_without_timestamps(tmp_path):
    result = CliRunner().invoke(main, ["replay", str(MOONCAKE_SESSIONS), "--workers", "2", "--out", str(tmp_path),
                                       "--requests"])
    assert result.exit_code == 0, result.output
    assert "7 turns: 0 whose parent is not in the file" in result.output and "2 whose prompt does not extend" in result.output
    assert "closed loop" in result.output
    with open(tmp_path / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["parent_request_id"] for r in rows] == ["", "", "1", "0", "2", "3", "4"]
    result = CliRunner().invoke(main, ["replay", str(MOONCAKE_SESSIONS), "--workers", "2", "--sessions", "recorded"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == (f"Error: {MOONCAKE_SESSIONS}:5: --sessions recorded needs every "
                                                      "turn's timestamp (timestamp; this one has none)")
    assert "Traceback" not in result.output


def test_a_mooncake_session_timestamp_before_its_sessions_previous_one_is_refused(tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_text('{"session_id": "a", "timestamp": 5000, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                    '{"session_id": "a", "input_length": 10, "output_length": 1, "hash_ids": [1]}\n'
                    '{"session_id": "a", "timestamp": 4000, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n')
    with pytest.raises(TraceError, match=r":3: field 'timestamp' \(4000 ms\) is before its session's previous one "
                                         r"\(5000 ms\)"):
        SessionTrace(path, block_size=16, trace_block_tokens=16)
