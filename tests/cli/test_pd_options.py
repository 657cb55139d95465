"""`--prefill-workers P --decode-workers D` on run, sweep and replay: a disaggregated cluster, its columns, and a
one-line error for every bad combination."""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner

from sim.cli import main
from tests.cli.test_bad_inputs import _one_line_error


@pytest.mark.parametrize("args, expected", [
    (["run", "--prefill-workers", "2"], "--decode-workers: give both --prefill-workers and --decode-workers"),
    (["run", "--decode-workers", "2"], "--prefill-workers: give both --prefill-workers and --decode-workers"),
    (["run", "--prefill-workers", "0", "--decode-workers", "2"], "'--prefill-workers': 0 is not in the range x>=1"),
    (["run", "--prefill-workers", "2", "--decode-workers", "4", "--workers", "3"],
     "--workers: a disaggregated cluster has prefill + decode workers (6)"),
    (["sweep", "--prefixes", "7", "--prefill-workers", "2", "--decode-workers", "4", "--workers", "3,6"],
     "--workers: a disaggregated cluster has prefill + decode workers (6)"),
    (["run", "--router", "dynamo-disagg"], "dynamo-disagg routes a disaggregated cluster"),
    (["run", "--prefill-workers", "1", "--decode-workers", "1", "--router", "dynamo-disagg:eff_isl_ratio_threshold=2"],
     "eff_isl_ratio_threshold"),
])
def test_bad_pools_are_one_line_errors(args, expected):
    _one_line_error(CliRunner().invoke(main, args), expected)


def test_a_disaggregated_run_writes_its_columns(tmp_path):
    result = CliRunner().invoke(main, ["run", "--prefill-workers", "1", "--decode-workers", "2", "--router",
                                       "dynamo-disagg", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [row] = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert (row["workers"], row["prefill_workers"], row["decode_workers"]) == ("3", "1", "2")
    assert int(row["remote_prefill_requests"]) == int(row["requests"])  # no conditional disaggregation
    assert float(row["transfer_p50_ms"]) > 0
    parts = sum(float(row[f"ttft_{p}_mean_ms"]) for p in ("queue", "prefill", "transfer", "other"))
    requests = list(csv.DictReader((tmp_path / "requests.csv").open()))
    measured = [r for r in requests if r["warmup"] == "False"]
    assert parts == pytest.approx(sum(float(r["ttft_ms"]) for r in measured) / len(measured))
    assert {r["pd_prefill_worker"] for r in requests} == {"0"}
    assert {r["worker"] for r in requests} <= {"1", "2"}


def test_sglang_runs_disaggregated_too(tmp_path):
    result = CliRunner().invoke(main, ["run", "--prefill-workers", "2", "--decode-workers", "4", "--engine", "sglang",
                                       "--router", "dynamo-disagg", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    [row] = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert row["engine"] == "sglang" and int(row["remote_prefill_requests"]) == int(row["requests"])
    # no decode radix cache: every transfer moves the whole prompt
    assert int(row["transfer_tokens"]) == sum(
        int(r["prompt_tokens"]) for r in csv.DictReader((tmp_path / "requests.csv").open()) if r["warmup"] == "False")


def test_an_aggregated_run_has_no_pd_columns(tmp_path):
    result = CliRunner().invoke(main, ["run", "--workers", "2", "--out", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert "transfer_p50_ms" not in (tmp_path / "summary.csv").read_text()
    assert "pd_prefill_worker" not in (tmp_path / "requests.csv").read_text()
