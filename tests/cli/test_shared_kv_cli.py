"""`--shared-kv-gib` on run, sweep and replay: the shared store's columns appear only when it exists, and bad input
is one line."""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.results.report import SHARED_TIER_COLUMNS
from tests.support.paths import TRACES


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_run_with_a_shared_store_writes_its_columns_and_the_records_tier_fields(tmp_path):
    res = invoke("run", "--prefixes", "24", "--workers", "6", "--concurrency", "8", "--router", "random",
                 "--shared-kv-gib", "64", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    assert "shared KV" in res.output  # the setup line names the store
    row = next(csv.DictReader((tmp_path / "summary.csv").open()))
    assert list(row)[-len(SHARED_TIER_COLUMNS):] == list(SHARED_TIER_COLUMNS)
    assert float(row["shared_kv_gib"]) == 64 and float(row["shared_hit_rate"]) > 0.8
    requests = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert {"shared_cached_tokens", "tier_load_s"} <= set(requests[0])
    assert any(int(r["shared_cached_tokens"]) > 0 and float(r["tier_load_s"]) > 0 for r in requests)


def test_without_a_shared_store_no_column_changes(tmp_path):
    res = invoke("run", "--prefixes", "2", "--workers", "2", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    header = (tmp_path / "summary.csv").read_text().splitlines()[0].split(",")
    assert not set(SHARED_TIER_COLUMNS) & set(header)
    assert "tier_load_s" not in (tmp_path / "requests.csv").read_text().splitlines()[0]


def test_sweep_with_a_shared_store(tmp_path):
    res = invoke("sweep", "--prefixes", "24", "--workers", "6", "--router", "random,kv-aware", "--shared-kv-gib", "64",
                 "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert len(rows) == 2 and all(float(r["shared_kv_gib"]) == 64 for r in rows)
    assert all(float(r["request_hit_rate"]) > 0.99 for r in rows)


def test_replay_with_a_shared_store(tmp_path):
    res = invoke("replay", str(TRACES / "conversation_head400.jsonl"), "--workers", "2", "--kv-blocks", "300",
                 "--shared-kv-gib", "64", "--limit", "100", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    row = next(csv.DictReader((tmp_path / "summary.csv").open()))
    assert float(row["shared_kv_gib"]) == 64 and int(row["shared_stored_blocks"]) > 0


@pytest.mark.parametrize("args, message", [
    (["run", "--shared-kv-gib", "-1"], "-1"),
    (["run", "--shared-kv-gib", "nan"], "finite"),
    (["run", "--engine", "sglang", "--shared-kv-gib", "4"], "has no cluster-shared KV tier"),
    (["sweep", "--prefixes", "2", "--engine", "vllm,sglang", "--shared-kv-gib", "4"], "has no cluster-shared KV tier"),
    (["replay", str(TRACES / "conversation_head400.jsonl"), "--shared-kv-gib", "x"], "--shared-kv-gib"),
])
def test_bad_shared_kv_input_is_one_line(args, message):
    res = CliRunner().invoke(main, args)
    assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output
