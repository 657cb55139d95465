"""Executors (local processes, a real Dask LocalCluster), the run journal, the output set and its manifest, and
interrupted sweeps resumed to the same bytes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.results.journal import JournalError, RunJournal
from sim.results.output_set import MANIFEST_NAME, manifest_matches, write_output_set
from sim.studies.executor import DaskExecutor, LocalExecutor
from tests.support.interrupts import interrupt_once_journaled
from tests.support.paths import REPO

SMALL = ["--prefixes", "2,7", "--workers", "3", "--concurrency", "4", "--repeats", "2"]
"""A 4-run sweep of tiny points."""
SIGNAL_SWEEP = ["--prefixes", "12,24", "--workers", "6", "--concurrency", "16,24", "--repeats", "4", "--jobs", "2"]
"""16 runs of about 0.2 s each: long enough to interrupt in the middle."""


def _square(x: int) -> int:
    time.sleep(0.01 * (x % 3))  # NOTE: uneven durations, so that calls finish out of order
    return x * x


def test_local_executor_returns_in_order_and_reports_each_result_as_it_finishes():
    seen = []
    ticks = []
    with LocalExecutor(2) as ex:
        out = ex.map(_square, list(range(9)), progress=lambda: ticks.append(1), on_result=lambda i, r: seen.append((i, r)))
    assert out == [x * x for x in range(9)]
    assert sorted(seen) == [(x, x * x) for x in range(9)]
    assert len(ticks) == 9


@pytest.mark.slow
def test_dask_executor_on_a_local_cluster_returns_in_order():
    seen = []
    with DaskExecutor(jobs=2) as ex:
        assert ex.jobs == 2
        out = ex.map(_square, list(range(7)), on_result=lambda i, r: seen.append(i))
    assert out == [x * x for x in range(7)]
    assert sorted(seen) == list(range(7))


@pytest.mark.slow
def test_sweep_on_dask_writes_the_same_summary_bytes_as_one_local_process(tmp_path):
    runner = CliRunner()
    one = runner.invoke(main, ["sweep", *SMALL, "--jobs", "1", "--out", str(tmp_path / "one")])
    assert one.exit_code == 0, one.output
    dask = runner.invoke(main, ["sweep", *SMALL, "--executor", "dask", "--jobs", "2", "--out", str(tmp_path / "dask")])
    assert dask.exit_code == 0, dask.output
    assert (tmp_path / "one" / "summary.csv").read_bytes() == (tmp_path / "dask" / "summary.csv").read_bytes()
    manifest = json.loads((tmp_path / "dask" / MANIFEST_NAME).read_text())
    assert manifest["runs"] == 4 and set(manifest["files"]) == {"summary.csv", "hit_rate.png", "ttft_cdf.png"}
    assert manifest_matches(tmp_path / "dask")
    journal = (tmp_path / "dask" / "runs.jsonl").read_text().splitlines()
    assert json.loads(journal[0])["study"] == "sweep" and len(journal) == 1 + 4


@pytest.mark.slow
def test_resume_runs_only_what_the_journal_lacks_and_gives_the_same_bytes(tmp_path):
    runner = CliRunner()
    full = runner.invoke(main, ["sweep", *SMALL, "--jobs", "1", "--out", str(tmp_path / "full")])
    assert full.exit_code == 0, full.output
    part = tmp_path / "part"
    lines = (tmp_path / "full" / "runs.jsonl").read_text().splitlines()
    part.mkdir()
    # two runs done, the third torn in mid-write by a crash
    (part / "runs.jsonl").write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])
    resumed = runner.invoke(main, ["sweep", *SMALL, "--jobs", "1", "--out", str(part), "--resume"])
    assert resumed.exit_code == 0, resumed.output
    assert (part / "summary.csv").read_bytes() == (tmp_path / "full" / "summary.csv").read_bytes()
    assert len((part / "runs.jsonl").read_text().splitlines()) == 1 + 4


@pytest.mark.slow
def test_resume_refuses_the_journal_of_another_scenario_in_one_line(tmp_path):
    runner = CliRunner()
    assert runner.invoke(main, ["sweep", *SMALL, "--jobs", "1", "--out", str(tmp_path)]).exit_code == 0
    other = runner.invoke(main, ["sweep", *SMALL, "--jobs", "1", "--out", str(tmp_path), "--resume",
                                 "--slo", "ttft_ms=100"])
    assert other.exit_code == 2
    assert other.output.count("\n") == 1 and "records another study" in other.output


def test_journal_keeps_every_finished_run_and_drops_only_a_torn_last_line(tmp_path):
    path = tmp_path / "runs.jsonl"
    with RunJournal(path, study="s", fingerprint="f", resume=False) as j:
        j.append([1, "a"], {"x": 1.5})
        j.append([2, "b"], {"x": float("nan")})
    with open(path, "a") as f:
        f.write('{"key": [3, "c"], "ru')
    with RunJournal(path, study="s", fingerprint="f", resume=True) as j:
        assert [1, "a"] in j and [2, "b"] in j and [3, "c"] not in j
        assert j.get([1, "a"]) == {"x": 1.5}
    with pytest.raises(JournalError, match="another study"):
        RunJournal(path, study="s", fingerprint="g", resume=True)
    with RunJournal(path, study="s", fingerprint="g", resume=False) as j:  # without resume: afresh
        assert not j.done


def test_an_interrupted_write_leaves_no_manifest_beside_the_new_files(tmp_path, monkeypatch):
    write_output_set(tmp_path, {"a.csv": b"old", "b.png": b"old"}, runs=1, command="x")
    assert manifest_matches(tmp_path)
    real_replace = os.replace
    calls = []

    def replace_then_die(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_then_die)
    with pytest.raises(KeyboardInterrupt):
        write_output_set(tmp_path, {"a.csv": b"new", "b.png": b"new"}, runs=2, command="x")
    monkeypatch.setattr(os, "replace", real_replace)
    assert (tmp_path / "a.csv").read_bytes() == b"new" and (tmp_path / "b.png").read_bytes() == b"old"
    assert not (tmp_path / MANIFEST_NAME).exists() and not manifest_matches(tmp_path)
    assert not list(tmp_path.glob(".staging-*"))
    write_output_set(tmp_path, {"a.csv": b"new", "b.png": b"new"}, runs=2, command="x")
    assert manifest_matches(tmp_path)


def test_an_unwritable_out_is_refused_before_any_run(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = CliRunner().invoke(main, ["sweep", *SMALL, "--out", str(blocker / "sub")])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "--out" in result.output and "not a writable directory" in result.output
    wrong = CliRunner().invoke(main, ["sweep", *SMALL, "--dask-scheduler", "tcp://127.0.0.1:1"])
    assert wrong.exit_code == 2 and "--dask-scheduler goes with --executor dask" in wrong.output


def _children(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.add(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _sweep_cli(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sim.cli", "sweep", *SIGNAL_SWEEP, "--out", str(out), *extra]


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc to find the worker processes")
@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
@pytest.mark.slow
def test_a_signal_stops_the_sweep_kills_its_workers_and_resume_finishes_it(tmp_path, signum, code):
    full = subprocess.run(_sweep_cli(tmp_path / "full"), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    journal = out / "runs.jsonl"
    children: set[int] = set()
    returncode, stderr = interrupt_once_journaled(_sweep_cli(out), journal, lines=2, signum=signum,  # header + a run
                                                  while_waiting=lambda pid: children.update(_children(pid)))
    assert returncode == code, stderr
    assert children, "the sweep ran no worker process"
    assert not [pid for pid in children if _alive(pid)]
    saved = len(journal.read_text().splitlines()) - 1
    assert 1 <= saved < 16
    last = stderr.strip().splitlines()[-1]
    assert f"{saved} of 16 runs saved" in last and "--resume" in last and "Traceback" not in stderr, stderr
    assert not (out / "summary.csv").exists()
    resumed = subprocess.run(_sweep_cli(out, "--resume"), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "summary.csv").read_bytes() == (tmp_path / "full" / "summary.csv").read_bytes()
    assert manifest_matches(out)
