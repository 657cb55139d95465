"""Metrics per session and per turn: a tiny hand-built run with exact figures for every one, the same figures from a
replay's streaming statistics (and from a simulated run and a replay of the same session requests), bounded memory
for long replays, and outputs that do not change for runs without sessions."""

from __future__ import annotations

import csv
import math
from dataclasses import replace

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.replay import replay
from sim.results.records import RequestRecord, RunResult
from sim.results.report import (
    REQUEST_SESSION_COLUMNS, SESSION_COLUMNS, SUMMARY_COLUMNS, TURN_COLUMNS, request_rows, summary_columns,
)
from sim.results.streaming_stats import LogHistogram, StreamingStats
from sim.results.summary import MAX_TURN, SessionCounts, SessionFigures, summarize, turn_bucket
from sim.scenario import load_scenario
from sim.workloads.request import Request
from sim.workloads.shared_prefix import RequestStream
from sim.workloads.traces import TraceRequest
from tests.support.paths import SCENARIOS


def rec(request_id: int, session_id: int | None, turn: int, *, prompt: int, cached: int, cpu: int = 0,
        context: int = 0, sent: float, first: float, finished: float, warmup: bool = False) -> RequestRecord:
    return RequestRecord(
        request_id=request_id, prefix_id=None, warmup=warmup, worker=request_id % 2, prompt_tokens=prompt,
        output_tokens=8, cached_tokens=cached, shareable_tokens=0, sent_s=sent, arrival_s=sent, admitted_s=sent,
        engine_first_token_s=first, first_token_s=first, finished_s=finished, num_preemptions=0,
        cpu_cached_tokens=cpu, session_id=session_id, turn=turn, context_tokens=context,
    )


# Three sessions (blocks of 16 tokens), a request of no session and a warm-up that no figure may count. Times are
# binary fractions, so every sum is exact.
#   id  session turn  prompt  context  cached (of it CPU)  GPU part  sent   TTFT ms  finished
#   0   7       0     100     0        32                  32        0      125      1.0
#   1   7       1     200     112      112                 112       2.0    62.5     3.0     survived on the GPU
#   2   7       2     300     208      208 (64)            144       5.0    250      6.0     survived thanks to the CPU
#   3   8       0     100     0        0                   0         0.5    250      1.5
#   4   8       1     180     96       32                  32        3.0    500      4.0     64 context tokens lost
#   5   8       2     260     176      192                 192       4.5    125      5.0     a longer hit: survived
#   6   9       64    450     350      350 (350)           0         0.25   125      0.875   survived, all from the CPU
#   7   9       70    500     400      16                  16        1.0    500      2.0     pooled into turn 64
#   8   -       0     100     0        50                  50        0      125      0.5     no session
#   9   7       3     400     300      0                   0         -9     1000     -8      a warm-up
RECORDS = (
    rec(0, 7, 0, prompt=100, cached=32, sent=0.0, first=0.125, finished=1.0),
    rec(1, 7, 1, prompt=200, cached=112, context=112, sent=2.0, first=2.0625, finished=3.0),
    rec(2, 7, 2, prompt=300, cached=208, cpu=64, context=208, sent=5.0, first=5.25, finished=6.0),
    rec(3, 8, 0, prompt=100, cached=0, sent=0.5, first=0.75, finished=1.5),
    rec(4, 8, 1, prompt=180, cached=32, context=96, sent=3.0, first=3.5, finished=4.0),
    rec(5, 8, 2, prompt=260, cached=192, context=176, sent=4.5, first=4.625, finished=5.0),
    rec(6, 9, 64, prompt=450, cached=350, cpu=350, context=350, sent=0.25, first=0.375, finished=0.875),
    rec(7, 9, 70, prompt=500, cached=16, context=400, sent=1.0, first=1.5, finished=2.0),
    rec(8, None, 0, prompt=100, cached=50, sent=0.0, first=0.125, finished=0.5),
    rec(9, 7, 3, prompt=400, cached=0, context=300, sent=-9.0, first=-8.0, finished=-8.0, warmup=True),
)

# Per turn, from the table above:
#   turn  requests  hits  prompt  cached  TTFT ms     context req  context  found (GPU)   re-prefilled (GPU)  survived (GPU)
#   0     2         1     200     32      125, 250    0            0        0 (0)         0 (0)               0 (0)
#   1     2         2     380     144     62.5, 500   2            208      144 (144)     64 (64)             1 (1)
#   2     2         2     560     400     250, 125    2            384      384 (320)     0 (64)              2 (1)
#   64    2         2     950     366     125, 500    2            750      366 (16)      384 (734)           1 (0)
# TTFT p50 is the mean of the two, p99 the lower + 0.99 x (higher - lower).
EXPECTED_TURNS = [
    {"turn": 0, "requests": 2, "hit_requests": 1, "request_hit_rate": 0.5, "prompt_tokens": 200, "cached_tokens": 32,
     "token_hit_rate": 0.16, "ttft_p50_ms": 187.5, "ttft_p99_ms": 248.75, "context_requests": 0, "context_tokens": 0,
     "reprefill_tokens": 0, "gpu_reprefill_tokens": 0, "gap_survival": math.nan, "gpu_gap_survival": math.nan},
    {"turn": 1, "requests": 2, "hit_requests": 2, "request_hit_rate": 1.0, "prompt_tokens": 380, "cached_tokens": 144,
     "token_hit_rate": 144 / 380, "ttft_p50_ms": 281.25, "ttft_p99_ms": 495.625, "context_requests": 2,
     "context_tokens": 208, "reprefill_tokens": 64, "gpu_reprefill_tokens": 64, "gap_survival": 0.5,
     "gpu_gap_survival": 0.5},
    {"turn": 2, "requests": 2, "hit_requests": 2, "request_hit_rate": 1.0, "prompt_tokens": 560, "cached_tokens": 400,
     "token_hit_rate": 400 / 560, "ttft_p50_ms": 187.5, "ttft_p99_ms": 248.75, "context_requests": 2,
     "context_tokens": 384, "reprefill_tokens": 0, "gpu_reprefill_tokens": 64, "gap_survival": 1.0,
     "gpu_gap_survival": 0.5},
    {"turn": 64, "requests": 2, "hit_requests": 2, "request_hit_rate": 1.0, "prompt_tokens": 950,
     "cached_tokens": 366, "token_hit_rate": 366 / 950, "ttft_p50_ms": 312.5, "ttft_p99_ms": 496.25,
     "context_requests": 2, "context_tokens": 750, "reprefill_tokens": 384, "gpu_reprefill_tokens": 734,
     "gap_survival": 0.5, "gpu_gap_survival": 0.0},
]

# Over the run: sessions 7, 8, 9 last 6.0 s (0 to 6.0), 4.5 s (0.5 to 5.0) and 1.75 s (0.25 to 2.0); sorted
# [1.75, 4.5, 6.0], p50 4.5 and p99 4.5 + 0.98 x 1.5. Context: 6 requests, 1342 tokens, 894 found (480 on the GPU),
# 4 survived (2 on the GPU).
EXPECTED_ROW = {
    "sessions": 3, "session_requests": 8, "session_time_p50_s": 4.5, "session_time_p99_s": 5.97,
    "context_requests": 6, "context_tokens": 1342, "context_hit_rate": 894 / 1342, "reprefill_tokens": 448,
    "gpu_reprefill_tokens": 862, "survived_requests": 4, "gpu_survived_requests": 2, "gap_survival": 4 / 6,
    "gpu_gap_survival": 2 / 6,
}


def hand_built(records=RECORDS) -> RunResult:
    return RunResult(scenario_name="sessions", num_workers=2, records=records, workers=(), measured_start_s=0.0,
                     measured_end_s=6.0)


def assert_rows(actual: dict, expected: dict, rel: float = 1e-12) -> None:
    assert list(actual) == list(expected)
    for key, value in expected.items():
        if isinstance(value, float) and math.isnan(value):
            assert math.isnan(actual[key]), key
        else:
            assert actual[key] == pytest.approx(value, rel=rel), key


def test_a_record_splits_its_context_into_found_on_the_gpu_loaded_from_the_host_and_re_prefilled():
    r = RECORDS
    assert [(x.context_hit_tokens, x.gpu_context_hit_tokens, x.reprefill_tokens) for x in r[:8]] == [
        (0, 0, 0), (112, 112, 0), (208, 144, 0), (0, 0, 0), (32, 32, 64), (176, 176, 0), (350, 0, 0), (16, 16, 384)]
    assert [x.context_survived for x in r[:8]] == [False, True, True, False, False, True, True, False]
    assert [x.gpu_context_survived for x in r[:8]] == [False, True, False, False, False, True, False, False]


def test_per_turn_figures_of_a_hand_built_run():
    figures = summarize(hand_built()).session_figures
    rows = figures.turn_rows()
    assert [list(row) for row in rows] == [list(TURN_COLUMNS)] * 4
    for row, expected in zip(rows, EXPECTED_TURNS, strict=True):
        assert_rows(row, expected)


def test_session_columns_of_a_hand_built_run_are_appended_to_the_summary():
    row = summarize(hand_built()).row()
    assert list(row)[-len(SESSION_COLUMNS):] == list(SESSION_COLUMNS)
    assert_rows({c: row[c] for c in SESSION_COLUMNS}, EXPECTED_ROW)
    # The request of no session counts in the run's figures, not in the sessions'.
    assert (row["requests"], row["hit_requests"], row["session_requests"]) == (9, 8, 8)
    assert summary_columns([row]) == SUMMARY_COLUMNS + SESSION_COLUMNS


def test_turns_from_a_index_on_share_one_row():
    assert [turn_bucket(t) for t in (0, 1, MAX_TURN - 1, MAX_TURN, MAX_TURN + 1, 10_000)] == [
        0, 1, MAX_TURN - 1, MAX_TURN, MAX_TURN, MAX_TURN]


def test_streaming_statistics_give_the_same_session_figures():
    stats = StreamingStats(num_workers=2)
    for r in RECORDS:
        if not r.warmup:
            stats.add(r)
    figures = stats.session_figures()
    # Percentiles by the histogram's rank rule (`LogHistogram.percentile`, within a 1 % bin): the first bin whose
    # running count passes q x (n - 1). Of a turn's two requests p50 and p99 are both the faster one (ranks 0.5 and
    # 0.99); of the three sessions, p99 is the second (rank 1.98), 4.5 s.
    for row, expected in zip(figures.turn_rows(), EXPECTED_TURNS, strict=True):
        fastest_ms = min(r.ttft_s * 1000 for r in RECORDS[:8] if turn_bucket(r.turn) == expected["turn"])
        assert_rows(row, expected | {"ttft_p50_ms": fastest_ms, "ttft_p99_ms": fastest_ms}, rel=0.01)
    assert_rows(figures.row(), EXPECTED_ROW | {"session_time_p99_s": 4.5}, rel=0.01)
    assert figures.counts == summarize(hand_built()).session_figures.counts  # every counter exactly


def test_without_sessions_there_are_no_session_figures_and_the_columns_are_todays():
    plain = tuple(replace(r, session_id=None, turn=0, context_tokens=0) for r in RECORDS)
    summary = summarize(hand_built(plain))
    assert summary.session_figures is None
    assert not set(summary.row()) - set(SUMMARY_COLUMNS)  # no session key, nor any other
    assert summary_columns([summary.row()]) == SUMMARY_COLUMNS
    stats = StreamingStats(num_workers=2)
    for r in plain:
        stats.add(r)
    assert stats.session_figures() is None and stats.turns == {} and stats.sessions.num_sessions == 0


def test_requests_csv_gains_the_session_fields_only_with_sessions():
    rows, columns = request_rows(RECORDS)
    assert columns[-3:] == list(REQUEST_SESSION_COLUMNS)
    assert columns[-6:-3] == ["ttft_ms", "e2e_ms", "tpot_ms"]
    assert (rows[7]["session_id"], rows[7]["turn"], rows[7]["context_tokens"]) == (9, 70, 400)
    _, plain = request_rows([replace(r, session_id=None) for r in RECORDS])
    assert plain == columns[:-3] and not set(REQUEST_SESSION_COLUMNS) & set(plain)


# --- bounded memory in a long replay --------------------------------------------------------------------------------

def test_per_turn_counters_are_capped_whatever_the_session_length():
    stats = StreamingStats(num_workers=2)
    for turn in range(500):
        stats.add(rec(turn, 1, turn, prompt=100, cached=0, sent=turn, first=turn + 0.5, finished=turn + 1.0))
    assert list(stats.turns) == list(range(MAX_TURN + 1))
    assert stats.turns[MAX_TURN].requests == 500 - MAX_TURN


def test_an_ended_session_drops_its_span_and_keeps_its_time():
    stats = StreamingStats(num_workers=2)
    for r in RECORDS[:3]:
        stats.add(r)
    assert stats.sessions.open == {7: (0.0, 6.0)}
    stats.end_session(7)
    stats.end_session(12345)  # not open: nothing happens
    assert stats.sessions.open == {} and stats.sessions.ended == 1
    assert stats.sessions.num_sessions == 1 and stats.sessions.time_s(50) == pytest.approx(6.0, rel=0.01)


def test_too_many_open_sessions_end_the_one_idle_longest():
    # At most 3 open. Sessions 0, 1, 2 send, then 0 again (now the latest active), then 3: session 1, idle longest,
    # is cut; then 4: session 2 is cut; then 1 again: session 0 is cut, and 1 counts as a new session.
    stats = StreamingStats(num_workers=2, max_open_sessions=3)
    for i, sid in enumerate((0, 1, 2, 0, 3, 4, 1)):
        stats.add(rec(i, sid, 0, prompt=100, cached=0, sent=float(i), first=i + 0.5, finished=i + 1.0))
        assert len(stats.sessions.open) <= 3
    assert list(stats.sessions.open) == [3, 4, 1]
    assert (stats.sessions.cut, stats.sessions.ended, stats.sessions.num_sessions) == (3, 3, 6)
    # Ended: session 1 and 2 after one request each (1 s), session 0 after two (sent at 0, its second finished at 4).
    assert stats.sessions.times_ms.counts == {LogHistogram.bin_of(1000): 2, LogHistogram.bin_of(4000): 1}


def test_merging_split_statistics_joins_open_sessions_exactly():
    # Session 7's three requests served by two processes: its span is joined, as one process would see it.
    a, b, whole = (StreamingStats(num_workers=2) for _ in range(3))
    for i, r in enumerate(RECORDS[:8]):
        (a if i % 2 else b).add(r)
        whole.add(r)
    a.merge(b)
    assert a.sessions.open == whole.sessions.open
    assert a.session_figures() == whole.session_figures()


def test_merging_after_a_session_ended_in_a_part_leaves_the_sessions_unknown():
    a, b = StreamingStats(num_workers=2), StreamingStats(num_workers=2)
    a.add(RECORDS[0])
    a.end_session(7)
    b.add(RECORDS[1])  # session 7 too, in the other process: its time cannot be joined
    a.merge(b)
    figures = a.session_figures()
    assert figures.num_sessions == -1 and math.isnan(figures.session_time_s[0])
    assert figures.row()["sessions"] == -1 and figures.counts.requests == 2  # the counters stay exact


# --- a simulated run and a replay of the same session requests -----------------------------------------------------

BLOCK = 64


def session_requests() -> list[Request]:
    """Three sessions of three turns, interleaved (turn t of every session, then turn t + 1): each turn resends its
    session's previous prompt (whole blocks: its context) and adds 4 blocks and 10 tokens; outputs are the request's
    own. On one worker of 20 blocks, the later turns of a session find their context evicted or not."""
    out = []
    for turn in range(3):
        for session in range(3):
            blocks = tuple(("s", session, i) for i in range(4 * (turn + 1)))
            out.append(Request(request_id=10 * turn + session, prompt_tokens=len(blocks) * BLOCK + 10,
                               output_tokens=4, block_hashes=blocks, session_id=session, turn=turn,
                               num_context_tokens=4 * turn * BLOCK))
    return out


def one_worker():
    scenario, _ = load_scenario(SCENARIOS / "trace-replay.yaml")
    overrides = scenario.engine.capacity_overrides(tokens=20 * BLOCK)
    return scenario.with_overrides(**overrides, **{"cluster.workers": 1, "workload.concurrency": 1})


def test_a_run_and_a_replay_of_the_same_session_requests_give_the_same_per_turn_figures():
    from sim.runner import run

    scenario = one_worker()
    requests = session_requests()
    result = run(scenario, RequestStream(warmups=(), requests=tuple(requests)))
    records = result.records
    ran = summarize(result).session_figures
    # The replay sends each request 10 s after the previous one: long after it finished, as the run's closed loop of
    # one sends it when it finished; the worker sees the same requests in the same order.
    replayed = replay(scenario, [TraceRequest(10.0 * i, r) for i, r in enumerate(requests)]).stats.session_figures()
    assert replayed.counts == ran.counts and replayed.turns == ran.turns
    # TTFT percentiles: the run's are exact, the replay's from its histogram, of the same TTFTs.
    ttft_ms = {t: LogHistogram() for t in ran.turns}
    for r in records:
        ttft_ms[r.turn].add(r.ttft_s * 1000)
    assert replayed.turn_ttft_ms == {t: (h.percentile(50), h.percentile(99)) for t, h in ttft_ms.items()}
    # Turns 1 and 2 find some contexts and lose others: gap survival is neither 0 nor 1.
    assert ran.counts.context_requests == 6 and 0 < ran.counts.gap_survival < 1
    assert ran.counts.reprefill_tokens > 0 and ran.num_sessions == 3


# --- the commands -------------------------------------------------------------------------------------------------

def test_run_prints_and_writes_the_per_turn_table_with_sessions(tmp_path, monkeypatch):
    import sim.runner

    requests = tuple(session_requests())
    monkeypatch.setattr(sim.runner, "shared_prefix_stream", lambda *a, **k: RequestStream((), requests))
    res = CliRunner().invoke(main, ["run", "--scenario", str(SCENARIOS / "trace-replay.yaml"), "--workers", "1",
                                    "--concurrency", "1", "--out", str(tmp_path)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "per turn (3 sessions, 9 requests" in res.output and "gap survival" in res.output
    turns = list(csv.DictReader((tmp_path / "turns.csv").open()))
    assert [t["turn"] for t in turns] == ["0", "1", "2"] and list(turns[0]) == list(TURN_COLUMNS)
    [summary] = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert list(summary) == list(SUMMARY_COLUMNS + SESSION_COLUMNS) and summary["sessions"] == "3"
    header = (tmp_path / "requests.csv").read_text().splitlines()[0].split(",")
    assert header[-3:] == list(REQUEST_SESSION_COLUMNS)


def test_replay_prints_and_writes_the_per_turn_table_with_sessions(tmp_path, monkeypatch):
    import sim.workloads.traces

    requests = session_requests()
    monkeypatch.setattr(sim.workloads.traces, "read_mooncake",
                        lambda *a, **k: iter([TraceRequest(10.0 * i, r) for i, r in enumerate(requests)]))
    trace = tmp_path / "t.jsonl"
    trace.write_text("{}\n")
    res = CliRunner().invoke(main, ["replay", str(trace), "--workers", "1", "--kv-tokens", str(20 * BLOCK),
                                    "--jobs", "1", "--out", str(tmp_path / "out")], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert "per turn (3 sessions, 9 requests" in res.output
    turns = list(csv.DictReader((tmp_path / "out" / "turns.csv").open()))
    assert [t["turn"] for t in turns] == ["0", "1", "2"]
    [summary] = list(csv.DictReader((tmp_path / "out" / "summary.csv").open()))
    assert list(summary)[-len(SESSION_COLUMNS):] == list(SESSION_COLUMNS) and summary["sessions"] == "3"


def test_a_sweep_without_sessions_writes_todays_columns(tmp_path):
    res = CliRunner().invoke(main, ["sweep", "--prefixes", "2", "--workers", "2", "--concurrency", "2", "--jobs", "1",
                                    "--out", str(tmp_path)], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    header = (tmp_path / "summary.csv").read_text().splitlines()[0]
    assert header == ",".join(SUMMARY_COLUMNS)
    assert not any(name.startswith("turns") for name in (p.name for p in tmp_path.iterdir()))


def test_session_counts_sum_like_every_counter():
    a, b = SessionCounts.of(RECORDS[:4]), SessionCounts.of(RECORDS[4:8])
    assert SessionCounts.total([a, b]) == SessionCounts.of(RECORDS[:8]) == SessionFigures.of(RECORDS[:8]).counts
