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


def test_run_with_prefill_decode_pools_and_a_shared_store(tmp_path):
    # the store is the prefill pool's: the hits come from the prefill workers, the decode workers never touch it
    res = invoke("run", "--prefixes", "24", "--prefill-workers", "2", "--decode-workers", "4", "--concurrency", "8",
                 "--router", "random", "--shared-kv-gib", "64", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    row = next(csv.DictReader((tmp_path / "summary.csv").open()))
    assert float(row["shared_kv_gib"]) == 64 and float(row["shared_hit_rate"]) > 0.5
    assert float(row["request_hit_rate"]) > 0.99
    requests = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert any(int(r["shared_cached_tokens"]) > 0 and float(r["tier_load_s"]) > 0 for r in requests)


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


def _scenario_with(tmp_path, engine_lines: str):
    """The built-in scenario with `engine_lines` added to its engine section."""
    from sim.scenario import builtin_scenario_path

    text = builtin_scenario_path().read_text()
    assert "\nengine:\n" in text
    path = tmp_path / "tiered.yaml"
    path.write_text(text.replace("\nengine:\n", "\nengine:\n" + engine_lines, 1))
    return path


def test_the_scenario_form_sets_the_store_and_its_link(tmp_path):
    path = _scenario_with(tmp_path, "  shared_kv_bytes: 68719476736\n"
                                    "  shared_link: {bandwidth: 1.1e10, overhead_s: 0.0}\n")
    res = invoke("run", "--scenario", str(path), "--prefixes", "24", "--workers", "6", "--router", "random",
                 "--out", str(tmp_path / "out"))
    assert res.exit_code == 0, res.output
    row = next(csv.DictReader((tmp_path / "out" / "summary.csv").open()))
    assert float(row["shared_kv_gib"]) == 64 and float(row["request_hit_rate"]) > 0.99
    # Half the default bandwidth and no overhead: a 127-block load takes 1.835 MB x 127 / 1.1e10 + 20 us.
    assert float(row["tier_load_p50_ms"]) >= 127 * 16 * 114688 / 1.1e10 * 1000


@pytest.mark.parametrize("lines, message", [
    ("  shared_kv_bytes: -1\n", "engine.shared_kv_bytes"),
    ("  shared_link: {bandwidth: 0}\n", "engine.shared_link.bandwidth"),
    ("  shared_eviction_policy: fifo\n", "engine.shared_eviction_policy"),
])
def test_a_bad_scenario_store_is_one_line(tmp_path, lines, message):
    res = CliRunner().invoke(main, ["run", "--scenario", str(_scenario_with(tmp_path, lines))])
    assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output
