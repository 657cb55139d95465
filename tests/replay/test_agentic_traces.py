"""Agentic Mooncake v2 traces (Dynamo 1.6.1's `agentic_mooncake`): header detection, FILE:LINE errors, dependency
timing (completion and dispatch edges, not_before floors, a join) and exact reuse on one unbounded worker (full
prompts, no parent output ever hit, as the mocker). The fixture, tests/fixtures/traces/agentic_mooncake.jsonl, is
the mocker cross-check's agent workload (its README says how it was made)."""

from __future__ import annotations

import csv
import json

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.replay import replay_sessions
from sim.scenario import load_scenario
from sim.workloads.agentic_traces import AgenticTrace
from sim.workloads.session_traces import trace_format
from sim.workloads.traces import TraceError
from tests.support.paths import SCENARIOS, TRACES

AGENT = TRACES / "agentic_mooncake.jsonl"
HEADER = {"schema": "dynamo.agentic_mooncake", "version": 2, "block_size": 16, "hash_id_scope": "local",
          "source": {"format": "test", "digest": "d"}}


def scenario(*, block_size: int = 16, engine: str = "vllm"):
    base = load_scenario(SCENARIOS / "trace-replay.yaml")[0]
    if engine != base.engine.kind:
        base = base.with_engine(engine)
    sc = base.with_overrides(**{"engine.block_size": block_size, "cluster.workers": 1})
    return sc.with_overrides(**sc.engine.capacity_overrides(tokens=10_000_000, blocks=None, kv_bytes=None))


def row(rid: str, ids: list[int], n_in: int, n_out: int = 20, *, play: str = "p", nb: float = 0.0,
        deps: list | None = None) -> dict:
    out = {"request_id": rid, "play_id": play, "session_id": play, "model": "m", "input_length": n_in,
           "output_length": n_out, "hash_ids": ids, "not_before_ms": nb}
    if deps:
        out["dependencies"] = [{"request_id": d, "trigger": t, "delay_ms": ms, "relation": rel}
                               for d, t, ms, rel in deps]
    return out


def write(path, rows: list[dict], header: dict = HEADER):
    path.write_text("".join(json.dumps(r) + "\n" for r in [header, *rows]))
    return path


def records_of(path, sc=None) -> dict:
    trace = AgenticTrace(path, block_size=16 if sc is None else sc.engine.block_size)
    result = replay_sessions(sc or scenario(), trace.sessions(), keep_records=True)
    return {r.request_id: r for r in result.records}


# -- reading --------------------------------------------------------------------------------------------------


def test_the_header_names_the_format():
    assert trace_format(AGENT) == "agentic-mooncake"
    assert len(AgenticTrace(AGENT, block_size=64)) == 23


@pytest.mark.parametrize("change, message", [
    ({"version": 1}, "field 'version' must be 2, got 1"),
    ({"block_size": 0}, "field 'block_size' must be >= 1, got 0"),
    ({"hash_id_scope": "global"}, "field 'hash_id_scope' must be 'local', got 'global'"),
    ({"source": {"format": "x"}}, "field 'source' must be an object with non-empty strings"),
])
def test_a_bad_header_names_file_line_and_field(tmp_path, change, message):
    path = write(tmp_path / "a.jsonl", [row("r0", [1], 10)], {**HEADER, **change})
    with pytest.raises(TraceError) as err:
        AgenticTrace(path, block_size=16)
    assert str(err.value).startswith(f"{path}:1: ") and message in str(err.value)


def test_rows_without_a_header_are_refused_as_the_mocker_refuses_them(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(row("r0", [1], 10)) + "\n")
    with pytest.raises(TraceError, match=rf"^{path}:1: field 'schema' must be 'dynamo.agentic_mooncake'"):
        AgenticTrace(path, block_size=16)


@pytest.mark.parametrize("bad, line, message", [
    (row("r1", [1], 20), 3, "field 'hash_ids' has 1 ids; input_length 20 needs ceil(20/16) = 2"),
    (row("r1", [1], 10, nb=-1), 3, "field 'not_before_ms' must be a finite number of milliseconds >= 0"),
    ({**row("r1", [1], 10), "play_id": 3}, 3, "field 'play_id' must be a string"),
    (row("r1", [1], 10, deps=[("r0", "start", 0, "sequence")]), 3,
     "dependencies[0]: field 'trigger' must be one of completion, dispatch, got 'start'"),
    (row("r1", [1], 10, deps=[("r0", "dispatch", 0, "join")]), 3, "relation 'join' needs trigger 'completion'"),
    (row("r1", [1], 10, deps=[("r0", "completion", -5, "sequence")]), 3, "field 'delay_ms' must be a finite"),
    (row("r1", [1], 10, deps=[("zz", "completion", 0, "sequence")]), 3, "dependency 'zz' is not a request"),
    (row("r1", [1], 10, play="q", deps=[("r0", "completion", 0, "sequence")]), 3, "in another play (line 2)"),
    (row("r0", [1], 10), 3, "request_id 'r0' repeats line 2's"),
])
def test_a_bad_row_names_file_line_and_field(tmp_path, bad, line, message):
    path = write(tmp_path / "a.jsonl", [row("r0", [1], 10), bad])
    with pytest.raises(TraceError) as err:
        AgenticTrace(path, block_size=16)
    assert str(err.value).startswith(f"{path}:{line}: ") and message in str(err.value)


def test_a_dependency_cycle_is_refused(tmp_path):
    path = write(tmp_path / "a.jsonl", [row("r0", [1], 10),
                                        row("r1", [1], 10, deps=[("r0", "completion", 0, "sequence"),
                                                                 ("r2", "completion", 0, "join")]),
                                        row("r2", [1], 10, deps=[("r1", "completion", 0, "sequence")])])
    with pytest.raises(TraceError, match="dependencies form a cycle"):
        AgenticTrace(path, block_size=16)


def test_the_cli_reports_a_bad_row_in_one_line_and_refuses_recorded_timing(tmp_path):
    path = write(tmp_path / "a.jsonl", [row("r0", [1], 10), {**row("r1", [1], 10), "hash_ids": "x"}])
    result = CliRunner().invoke(main, ["replay", str(path), "--workers", "1"])
    assert result.exit_code == 1
    assert result.output.strip().splitlines()[-1] == f"Error: {path}:3: field 'hash_ids' must be a list, got str"
    assert "Traceback" not in result.output
    result = CliRunner().invoke(main, ["replay", str(AGENT), "--workers", "1", "--sessions", "recorded"])
    assert result.exit_code == 1 and "replay it closed loop" in result.output


# -- timing ---------------------------------------------------------------------------------------------------


def test_each_request_waits_for_its_edges_and_its_not_before_time(tmp_path):
    # The probe of benchmarks/oracles/dynamo-mocker/session-formats.md: r1 500 ms after r0's completion; r2's
    # not_before (3000 ms) is later than its edge (100 ms after r1's completion). r3 is spawned 50 ms after r0's
    # dispatch (before r0 finishes); r4 joins r1 and r3.
    path = write(tmp_path / "a.jsonl", [
        row("r0", [1, 2, 3], 40, 200),
        row("r1", [1, 2, 3, 4, 5], 80, deps=[("r0", "completion", 500, "sequence")]),
        row("r2", [1, 2, 3, 4, 5, 6], 90, nb=3000, deps=[("r1", "completion", 100, "sequence")]),
        row("r3", [7], 10, 300, deps=[("r0", "dispatch", 50, "spawn")]),
        row("r4", [1, 2, 3, 4, 5, 8], 90, deps=[("r1", "completion", 10, "join"), ("r3", "completion", 20, "join")]),
    ])
    r = records_of(path)
    assert r[0].sent_s == 0.0
    assert r[1].sent_s == pytest.approx(r[0].finished_s + 0.5, rel=1e-12)
    assert r[1].finished_s + 0.1 < 3.0 and r[2].sent_s == 3.0
    assert r[3].sent_s == pytest.approx(0.05, rel=1e-12) and r[3].sent_s < r[0].finished_s
    # The join: sent at the later of its two edges; here the second (r3's), so the first alone would be too early.
    assert r[3].finished_s + 0.02 > r[1].finished_s + 0.01
    assert r[4].sent_s == pytest.approx(max(r[1].finished_s + 0.01, r[3].finished_s + 0.02), rel=1e-12)
    assert r[4].sent_s >= r[1].finished_s + 0.01 and r[4].sent_s >= r[3].finished_s + 0.02
    assert {i: r[i].turn for i in r} == {0: 0, 1: 1, 2: 2, 3: 1, 4: 2}
    assert len({x.session_id for x in r.values()}) == 1


def test_no_request_of_the_fixture_is_sent_before_its_predecessors_finished_plus_delay():
    trace = AgenticTrace(AGENT, block_size=64)
    r = records_of(AGENT, scenario(block_size=64))
    assert len(r) == len(trace)
    lines = [json.loads(x) for x in AGENT.read_text().splitlines()[1:]]
    by_rid = {line["request_id"]: i for i, line in enumerate(lines)}
    for i, line in enumerate(lines):
        floor = line["not_before_ms"] / 1000
        edges = [r[by_rid[d["request_id"]]].finished_s + d["delay_ms"] / 1000 for d in line.get("dependencies", [])]
        assert r[i].sent_s == pytest.approx(max([floor, *edges]), rel=1e-12, abs=1e-12)


# -- reuse ----------------------------------------------------------------------------------------------------


def test_a_child_hits_its_parents_prompt_never_its_output(tmp_path):
    # The mocker's probe (one worker, blocks of 16): r1 ([1..5], 80 tokens) after r0 ([1, 2, 3], 40 tokens, output
    # 20) reused 32 (r0's two full prompt blocks), not 48: the block holding r0's prompt/output boundary misses.
    path = write(tmp_path / "a.jsonl", [row("r0", [1, 2, 3], 40), row("r1", [1, 2, 3, 4, 5], 80,
                                                                      deps=[("r0", "completion", 500, "sequence")])])
    for engine in ("vllm", "sglang"):
        sc = scenario(engine=engine)
        if engine == "sglang":
            sc = sc.with_overrides(**{"engine.page_size": 16})
        r = records_of(path, sc)
        assert [(r[i].prompt_tokens, r[i].cached_tokens) for i in (0, 1)] == [(40, 0), (80, 32)], engine
        assert r[1].context_tokens == 32


def naive_hits(order: list[int], lines: list[dict], B: int = 64) -> dict[int, int]:
    """vLLM's rules on one unbounded worker from the lines alone (engine block = trace block): a request hits the
    leading run of its full blocks whose id prefix an earlier request cached, capped at (prompt - 1) // B blocks;
    then its full prompt blocks are cached (outputs are never hit)."""
    cached: set = set()
    hits = {}
    for i in order:
        ids, P = lines[i]["hash_ids"], lines[i]["input_length"]
        prefixes = [tuple(ids[: k + 1]) for k in range(P // B)]
        n = 0
        while n < len(prefixes) and prefixes[n] in cached:
            n += 1
        hits[i] = min(n, (P - 1) // B) * B
        cached.update(prefixes)
    return hits


def test_one_unbounded_worker_replays_the_fixture_with_exactly_vllms_hits(tmp_path):
    result = CliRunner().invoke(main, ["replay", str(AGENT), "--workers", "1", "--kv-blocks", "100000",
                                       "--block-size", "64", "--out", str(tmp_path), "--requests"])
    assert result.exit_code == 0, result.output
    with open(tmp_path / "requests.csv") as f:
        rows = list(csv.DictReader(f))
    lines = [json.loads(x) for x in AGENT.read_text().splitlines()[1:]]
    order = [int(r["request_id"]) for r in sorted(rows, key=lambda r: float(r["arrival_s"]))]
    expected = naive_hits(order, lines)
    assert {int(r["request_id"]): int(r["cached_tokens"]) for r in rows} == expected
    # Every later call of an agent hits at least its predecessor's full prompt blocks, and the 4 plays' system
    # prompts (1024 tokens of 4 groups) are shared where the groups repeat.
    assert all(expected[i] >= (lines[i - 1]["input_length"] // 64) * 64 for i in range(len(lines))
               if lines[i].get("dependencies"))
    reuse = float(next(csv.DictReader((tmp_path / "summary.csv").read_text().splitlines()))["prefix_reuse"])
    assert reuse == pytest.approx(sum(expected.values()) / sum(x["input_length"] for x in lines), rel=1e-5)
