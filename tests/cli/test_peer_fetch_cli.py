"""`--peer-fetch` on run, sweep and replay: G2 peer fetch's columns appear only when it is on, it pulls blocks
between host tiers, a replay with it stays in one process, and bad input is one line."""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.replay import device_groups
from sim.results.report import PEER_FETCH_COLUMNS
from sim.scenario import load_scenario, with_cpu_kv_gib
from tests.support.paths import SCENARIOS, TRACES


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_run_with_peer_fetch_pulls_blocks_and_writes_its_columns(tmp_path):
    # random routing over 4 workers: a prefix's blocks sit in some worker's host tier when another one misses them
    res = invoke("run", "--workers", "4", "--cpu-kv-gib", "4", "--peer-fetch", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    row = next(csv.DictReader((tmp_path / "summary.csv").open()))
    assert list(row)[-len(PEER_FETCH_COLUMNS):] == list(PEER_FETCH_COLUMNS)
    pulled, stored = int(row["peer_fetched_blocks"]), int(row["cpu_stored_blocks"])
    assert pulled > 0 and float(row["peer_share"]) == pytest.approx(pulled / (pulled + stored), rel=1e-5)


def test_without_peer_fetch_no_column_changes(tmp_path):
    res = invoke("run", "--workers", "4", "--cpu-kv-gib", "4", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    header = (tmp_path / "summary.csv").read_text().splitlines()[0].split(",")
    assert not set(PEER_FETCH_COLUMNS) & set(header)


def test_sweep_and_replay_with_peer_fetch(tmp_path):
    res = invoke("sweep", "--prefixes", "24", "--workers", "3", "--cpu-kv-gib", "2,4", "--peer-fetch",
                 "--out", str(tmp_path / "s"))
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "s" / "summary.csv").open()))
    assert len(rows) == 2 and all(int(r["peer_fetched_blocks"]) >= 0 and "peer_share" in r for r in rows)
    res = invoke("replay", str(TRACES / "conversation_head400.jsonl"), "--workers", "2", "--kv-blocks", "300",
                 "--cpu-kv-gib", "4", "--peer-fetch", "--limit", "100", "--out", str(tmp_path / "r"))
    assert res.exit_code == 0, res.output
    row = next(csv.DictReader((tmp_path / "r" / "summary.csv").open()))
    assert int(row["peer_fetched_blocks"]) >= 0 and "peer_share" in row


def test_a_replay_with_peer_fetch_is_one_process():
    # Every worker reads the others' host tiers: a random-routed replay that would split over 3 processes stays one.
    s, _ = load_scenario(SCENARIOS / "trace-replay.yaml")
    s = with_cpu_kv_gib(s.with_overrides(**{"cluster.workers": 8, "router.name": "random", "router.options": {}}), 4)
    assert len(device_groups(s, 3)) == 3
    assert device_groups(s.with_overrides(**{"engine.peer_fetch": True}), 3) == [frozenset(range(8))]


def test_bad_input_is_one_line():
    for args, message in ((("run", "--peer-fetch"), "--peer-fetch: needs a host tier to fetch into"),
                          (("run", "--engine", "sglang", "--cpu-kv-gib", "1", "--peer-fetch"),
                           "--peer-fetch: engine.kind 'sglang' has no G2 peer fetch"),
                          (("sweep", "--prefixes", "2", "--cpu-kv-gib", "0,4", "--peer-fetch"),
                           "--peer-fetch: every point needs a host tier"),
                          # NOTE: a sweep's points on SGLang would silently run without it.
                          (("sweep", "--prefixes", "2", "--cpu-kv-gib", "4", "--peer-fetch", "--engine", "vllm,sglang"),
                           "--peer-fetch: engine.kind 'sglang' has no G2 peer fetch")):
        res = CliRunner().invoke(main, list(args))
        assert res.exit_code != 0 and message in res.output and "Traceback" not in res.output, res.output
