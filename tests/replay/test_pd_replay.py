"""A replay on a disaggregated cluster reports the P/D figures `kvsim run` does: counted as requests finish
(`PdTally`, bounded memory), equal to `PdFigures.of` over the same records, and shown and written by `kvsim replay`."""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.replay import replay
from sim.results.pd_figures import PdFigures
from sim.results.records import RequestRecord
from sim.results.report import PD_COLUMNS
from sim.results.streaming_pd import PdTally
from sim.scenario import load_scenario, with_pools
from sim.workloads.traces import read_mooncake
from tests.support.paths import SCENARIOS, TRACES

CONVERSATION = TRACES / "conversation_head400.jsonl"


def _record(request_id: int, *, worker: int, prefill_worker: int, ttft_s: float, queue_s: float, prefill_s: float,
            transfer_s: float, transfer_tokens: int) -> RequestRecord:
    return RequestRecord(request_id=request_id, prefix_id=None, warmup=False, worker=worker, prompt_tokens=1024,
                         output_tokens=8, cached_tokens=0, shareable_tokens=0, sent_s=0.0, arrival_s=0.0,
                         admitted_s=0.0, engine_first_token_s=ttft_s, first_token_s=ttft_s, finished_s=1.0,
                         num_preemptions=0, pd_prefill_worker=prefill_worker, transfer_tokens=transfer_tokens,
                         ttft_queue_s=queue_s, ttft_prefill_s=prefill_s, ttft_transfer_s=transfer_s)


def test_a_tally_of_two_requests():
    # Request 0 prefilled on prefill worker 0 and moved 1,024 tokens to decode worker 2 in 4 ms: TTFT 30 ms = 5 queue
    # + 20 prefill + 4 transfer + 1 other. Request 1 was prefilled locally on decode worker 3 (conditional
    # disaggregation): TTFT 12 ms = 2 queue + 10 prefill, nothing moved, not in the transfer's percentiles.
    tally = PdTally()
    tally.add(_record(0, worker=2, prefill_worker=0, ttft_s=0.030, queue_s=0.005, prefill_s=0.020, transfer_s=0.004,
                      transfer_tokens=1024))
    tally.add(_record(1, worker=3, prefill_worker=3, ttft_s=0.012, queue_s=0.002, prefill_s=0.010, transfer_s=0.0,
                      transfer_tokens=0))
    row = tally.figures(prefill_workers=2, decode_workers=2, utilisation=(0.5, 0.25)).row()
    assert (row["remote_prefill_requests"], row["transfer_tokens"]) == (1, 1024)
    assert row["transfer_p50_ms"] == pytest.approx(4.0, rel=0.01) and row["transfer_p99_ms"] == row["transfer_p50_ms"]
    assert row["ttft_queue_mean_ms"] == pytest.approx(3.5)
    assert row["ttft_prefill_mean_ms"] == pytest.approx(15.0)
    assert row["ttft_transfer_mean_ms"] == pytest.approx(2.0)
    assert row["ttft_other_mean_ms"] == pytest.approx(0.5)
    assert (row["prefill_utilisation"], row["decode_utilisation"]) == (0.5, 0.25)


def test_merged_tallies_count_both_parts():
    a, b = PdTally(), PdTally()
    a.add(_record(0, worker=1, prefill_worker=0, ttft_s=0.01, queue_s=0.0, prefill_s=0.008, transfer_s=0.002,
                  transfer_tokens=64))
    b.add(_record(1, worker=1, prefill_worker=0, ttft_s=0.03, queue_s=0.01, prefill_s=0.01, transfer_s=0.008,
                  transfer_tokens=128))
    a.merge(b)
    row = a.figures(prefill_workers=1, decode_workers=1, utilisation=(0.0, 0.0)).row()
    assert (row["remote_prefill_requests"], row["transfer_tokens"]) == (2, 192)
    assert row["ttft_transfer_mean_ms"] == pytest.approx(5.0)


@pytest.fixture(scope="module")
def pd_replay():
    base = load_scenario(SCENARIOS / "trace-replay.yaml")[0]
    scenario = with_pools(base, 1, 2).with_overrides(**{"router.name": "dynamo-disagg"})
    trace = read_mooncake(CONVERSATION, block_size=scenario.engine.block_size, limit=120)
    return replay(scenario, trace, keep_records=True)


def test_a_disaggregated_replay_reports_what_a_run_would_over_its_records(pd_replay):
    row = pd_replay.row()
    records = pd_replay.records
    exact = PdFigures.of(records, prefill_workers=1, decode_workers=2, utilisation=(0.0, 0.0)).row()
    assert (row["prefill_workers"], row["decode_workers"]) == (1, 2)
    assert row["remote_prefill_requests"] == exact["remote_prefill_requests"] == len(records) == 120
    assert row["transfer_tokens"] == exact["transfer_tokens"] > 0
    for part in ("queue", "prefill", "transfer", "other"):
        assert row[f"ttft_{part}_mean_ms"] == pytest.approx(exact[f"ttft_{part}_mean_ms"], rel=1e-9)
    for q in ("p50", "p99"):  # the streaming histogram's bins are 1 % wide
        assert row[f"transfer_{q}_ms"] == pytest.approx(exact[f"transfer_{q}_ms"], rel=0.01)
    assert {r.pd_prefill_worker for r in records} == {0} and {r.worker for r in records} <= {1, 2}


def test_the_pools_utilisation_is_their_busy_time_over_the_replay(pd_replay):
    row, stats = pd_replay.row(), pd_replay.stats
    prefill_busy_s, decode_busy_s = pd_replay.pool_busy_s
    assert row["prefill_utilisation"] == pytest.approx(prefill_busy_s / stats.span_s)
    assert row["decode_utilisation"] == pytest.approx(decode_busy_s / (2 * stats.span_s))
    assert 0 < row["prefill_utilisation"] <= 1 and 0 < row["decode_utilisation"] <= 1


def test_an_aggregated_replay_has_no_pd_columns(tmp_path):
    scenario = load_scenario(SCENARIOS / "trace-replay.yaml")[0].with_overrides(**{"cluster.workers": 2})
    result = replay(scenario, read_mooncake(CONVERSATION, block_size=scenario.engine.block_size, limit=20))
    assert result.pools is None and not set(PD_COLUMNS) & set(result.row())
    cli = CliRunner().invoke(main, ["replay", str(CONVERSATION), "--limit", "20", "--workers", "2", "--out",
                                    str(tmp_path)])
    assert cli.exit_code == 0, cli.output
    assert "transfer_p50_ms" not in (tmp_path / "summary.csv").read_text()
    assert (tmp_path / "workers.csv").read_text().splitlines()[0] == (
        "worker,requests,prompt_tokens,token_hit_rate,preemptions")


def test_kvsim_replay_prints_and_writes_the_pd_columns(tmp_path):
    result = CliRunner().invoke(main, ["replay", str(CONVERSATION), "--limit", "60", "--workers", "3",
                                       "--prefill-workers", "1", "--decode-workers", "2", "--router", "dynamo-disagg",
                                       "--out", str(tmp_path), "--requests"])
    assert result.exit_code == 0, result.output
    [row] = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert all(c in row for c in PD_COLUMNS)
    assert "transfer_p50_ms" in result.output and "decode_utilisation" in result.output
    assert (row["prefill_workers"], row["decode_workers"], row["remote_prefill_requests"]) == ("1", "2", "60")
    workers = list(csv.DictReader((tmp_path / "workers.csv").open()))
    assert [(w["worker"], w["pool"]) for w in workers] == [("0", "prefill"), ("1", "decode"), ("2", "decode")]
    assert workers[0]["requests"] == "0"  # a request counts on its decode worker
    requests = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert int(row["transfer_tokens"]) == sum(int(r["transfer_tokens"]) for r in requests)
    parts = sum(float(row[f"ttft_{p}_mean_ms"]) for p in ("queue", "prefill", "transfer", "other"))
    assert parts == pytest.approx(sum(float(r["ttft_ms"]) for r in requests) / len(requests), rel=1e-5)  # CSV digits
