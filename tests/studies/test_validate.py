"""Run CSVs and `kvsim validate`: reading other tools' files, errors, and self-consistency with kvsim runs."""

from __future__ import annotations

import csv
import dataclasses
import json

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.runner import run as simulate
from sim.scenario import load_scenario
from sim.servers.run_csv import RunFileError, RunRow, read_run, write_run_bytes
from sim.studies.validate import Tolerance, compare
from sim.workloads.request import is_full_hit, shareable_tokens
from sim.workloads.shared_prefix import SharedPrefixRequests


def simulated_run_files(tmp_path, *, prefixes=7, workers=3, concurrency=4, name="sim"):
    """A run CSV + sidecar made from a kvsim simulation (what kvsim measure would write for that run)."""
    scenario, _ = load_scenario()
    scenario = scenario.with_overrides(**{"workload.prefixes": prefixes, "cluster.workers": workers,
                                          "workload.concurrency": concurrency})
    result = simulate(scenario)
    rows = [{"request_id": r.request_id, "warmup": r.warmup, "prefix_id": r.prefix_id, "worker": r.worker,
             "prompt_tokens": r.prompt_tokens, "cached_tokens": r.cached_tokens, "ttft_ms": r.ttft_s * 1000,
             "e2e_ms": r.e2e_s * 1000, "start_s": r.sent_s, "end_s": r.finished_s, "extra_column": "kept"}
            for r in result.records]
    w = scenario.workload
    setup = {"workers": workers, "prefixes": prefixes, "concurrency": concurrency, "requests": w.num_requests,
             "block_size": 16, "num_gpu_blocks": 585, "prefix_tokens": w.prefix_tokens, "prompt_tokens": w.prompt_tokens,
             "output_tokens": w.output_tokens, "router": "random", "warmup_per_prefix": 1, "seed": scenario.seed,
             "engine": {"name": "vllm", "version": "0.31.0"}, "max_num_batched_tokens": 2048, "max_num_seqs": 256,
             "max_model_len": 4096}
    csv_data, side = write_run_bytes(rows, setup)
    path = tmp_path / f"{name}.csv"
    text = csv_data.decode().splitlines()
    # another tool's extra column survives reading
    path.write_text("\n".join([text[0] + ",extra_column"] + [line + ",kept" for line in text[1:]]) + "\n")
    path.with_suffix(".json").write_bytes(side)
    return path


def test_validating_a_kvsim_run_reproduces_it(tmp_path):
    run = read_run(simulated_run_files(tmp_path))
    scenario, _ = load_scenario()
    by_metric = {c.metric: c for c in compare(scenario, run)}
    for m in ("request_hit_rate", "full_hit_rate", "token_hit_rate"):
        assert by_metric[m].error == pytest.approx(0.0, abs=1e-9), by_metric[m]
    assert by_metric["ttft_p50_ms"].relative_error == pytest.approx(0.0, abs=0.02)


def test_validate_command_checks_tolerances_and_writes_the_report(tmp_path):
    path = simulated_run_files(tmp_path)
    out = tmp_path / "report.csv"
    res = CliRunner().invoke(main, ["validate", str(path), "--tolerance", "request_hit_rate=0.03",
                                    "--tolerance", "ttft_p50_ms=10%", "--out", str(out)])
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader(out.open()))
    assert set(rows[0]) == {"run", "metric", "measured", "predicted", "error"}
    assert {r["metric"] for r in rows} >= {"request_hit_rate", "token_hit_rate", "ttft_p50_ms", "throughput_rps"}
    # Change the measured hits: now the run is outside a 3-point tolerance and validate says so, exit 1.
    text = path.read_text().splitlines()
    header = text[0].split(",")
    col = header.index("cached_tokens")
    rows_out = [text[0]] + [",".join(v if i != col else "0" for i, v in enumerate(line.split(","))) for line in text[1:]]
    path.write_text("\n".join(rows_out) + "\n")
    res = CliRunner().invoke(main, ["validate", str(path), "--tolerance", "request_hit_rate=0.03"])
    assert res.exit_code == 1 and "outside tolerance" in res.output and "Traceback" not in res.output


def test_a_missing_column_is_named(tmp_path):
    path = simulated_run_files(tmp_path)
    lines = path.read_text().splitlines()
    header = lines[0].split(",")
    drop = header.index("ttft_ms")
    path.write_text("\n".join(",".join(v for i, v in enumerate(l.split(",")) if i != drop) for l in lines) + "\n")
    with pytest.raises(RunFileError, match="missing required column 'ttft_ms'"):
        read_run(path)
    res = CliRunner().invoke(main, ["validate", str(path)])
    assert res.exit_code != 0 and "missing required column 'ttft_ms'" in res.output
    assert len([l for l in res.output.splitlines() if l.strip()]) == 1


def test_malformed_values_and_sidecars_name_line_and_field(tmp_path):
    path = simulated_run_files(tmp_path)
    lines = path.read_text().splitlines()
    cols = lines[3].split(",")
    cols[5] = "lots"  # cached_tokens
    lines[3] = ",".join(cols)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(RunFileError, match=r"sim.csv:4: column cached_tokens"):
        read_run(path)
    side = json.loads(path.with_suffix(".json").read_text())
    del side["block_size"]
    path.with_suffix(".json").write_text(json.dumps(side))
    with pytest.raises(RunFileError, match="sim.json: block_size: Field required"):
        read_run(path)
    path.with_suffix(".json").unlink()
    with pytest.raises(RunFileError, match="missing sidecar sim.json"):
        read_run(path)


def test_tolerance_parsing():
    t = Tolerance.parse("ttft_p50_ms=25%")
    assert t.relative and t.limit == pytest.approx(0.25)
    assert not Tolerance.parse("request_hit_rate=0.03").relative
    with pytest.raises(ValueError, match="METRIC one of"):
        Tolerance.parse("hit=0.1")


def test_the_full_hit_rule_is_the_requests_for_measured_and_simulated_runs():
    # Blocks of 16: a 2032-token prefix in a 2434-token prompt shares its 127 full blocks; a prefix that covers the
    # whole prompt shares one block less, since a hit stops at the prompt's last token (2032 - 1 -> 126 blocks).
    assert shareable_tokens(prefix_tokens=2032, prompt_tokens=2434, block_size=16) == 2032
    assert shareable_tokens(prefix_tokens=2032, prompt_tokens=2032, block_size=16) == 2016
    assert shareable_tokens(prefix_tokens=10, prompt_tokens=100, block_size=16) == 0  # no full block: no full hit
    assert is_full_hit(2032, 2032) and is_full_hit(2048, 2032) and not is_full_hit(2016, 2032)
    assert not is_full_hit(0, 0)
    maker = SharedPrefixRequests(block_size=16)
    for prefix, prompt in ((2032, 2434), (2032, 2032), (2040, 2045), (10, 100)):
        made = maker.make(1, 0, prefix_tokens=prefix, prompt_tokens=prompt, output_tokens=4)
        assert made.num_shareable_tokens == shareable_tokens(prefix_tokens=prefix, prompt_tokens=prompt, block_size=16)


def test_the_servers_tpot_is_its_generation_time_where_recorded():
    row = RunRow(request_id=1, warmup=False, prefix_id=0, worker=0, prompt_tokens=612, cached_tokens=0, ttft_ms=30.0,
                 e2e_ms=330.0, start_s=0.0, end_s=0.33, server_ttft_ms=10.0, server_queue_ms=0.0,
                 server_generation_ms=126.0)
    assert row.tpot_ms(64) == pytest.approx(300 / 63)  # the client's: (e2e - TTFT) / 63
    assert row.tpot_ms(64, "server") == pytest.approx(2.0)  # vLLM's generation time / 63
    assert row.tpot_ms(1, "server") is None
    older = dataclasses.replace(row, server_generation_ms=None)  # a run measured before the column existed
    assert older.tpot_ms(64, "server") == pytest.approx(300 / 63)  # the client's
