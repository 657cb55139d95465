"""`kvsim tune`, `kvsim plan router` and `kvsim plan capacity` journal every finished simulation in --out DIR/runs.jsonl; with
--resume the search replays (same seed, same asks) and takes the journaled runs instead of simulating them, so the
resumed outputs are byte for byte those of an uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import sim.studies.tune as tune_module
from sim.cli import main
from sim.results.output_set import manifest_matches
from tests.support.interrupts import interrupt_once_journaled
from tests.support.paths import REPO

TUNE = ["tune", "--prefixes", "24", "--workers", "6", "--concurrency", "8", "--router", "kv-aware",
        "--objective", "maximize:request_hit_rate", "--constraint", "ttft_p99_ms<=215", "--repeats", "1",
        "--seed", "0"]
"""kv-aware's three knobs on a small cluster: about 0.2 s a simulation."""


def invoke(*args: str):
    return CliRunner().invoke(main, list(args))


def _run_lines(out: Path) -> list[str]:
    return [line for line in (out / "runs.jsonl").read_text().splitlines()[1:] if line.strip()]


@pytest.fixture
def simulations(monkeypatch) -> list:
    """The simulations run in this process (with --jobs 1 every one of them), counted as they start."""
    seen: list = []
    real = tune_module.run_point

    def counted(base, point):
        seen.append(point)
        return real(base, point)

    monkeypatch.setattr(tune_module, "run_point", counted)
    return seen


@pytest.mark.slow
def test_resume_runs_only_the_simulations_the_journal_lacks_and_gives_the_same_bytes(tmp_path, simulations):
    full = invoke(*TUNE, "--budget", "12", "--jobs", "1", "--out", str(tmp_path / "d1"))
    assert full.exit_code == 0, full.output
    lines = _run_lines(tmp_path / "d1")
    # 12 trials; a setting asked twice is simulated once, so there may be fewer runs than trials
    assert len(lines) == len(simulations) and 8 <= len(lines) <= 12
    assert json.loads(lines[0])["key"] == ["kv-aware", [], 0]  # trial 0: the defaults, seed 0

    cut = tmp_path / "d2"
    cut.mkdir()
    k = 5
    header = (tmp_path / "d1" / "runs.jsonl").read_text().splitlines()[0]
    (cut / "runs.jsonl").write_text("\n".join([header, *lines[:k]]) + "\n")
    simulations.clear()
    resumed = invoke(*TUNE, "--budget", "12", "--jobs", "1", "--out", str(cut), "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert len(simulations) == len(lines) - k
    assert sorted(_run_lines(cut)) == sorted(lines)
    for name in ("tune.csv", "best.yaml", "tune.png"):
        assert (cut / name).read_bytes() == (tmp_path / "d1" / name).read_bytes(), name
    assert manifest_matches(cut)


@pytest.mark.slow
def test_a_complete_journal_resumes_without_simulating(tmp_path, simulations):
    out = tmp_path / "out"
    assert invoke(*TUNE, "--budget", "6", "--jobs", "1", "--out", str(out)).exit_code == 0
    first = (out / "tune.csv").read_bytes()
    simulations.clear()
    again = invoke(*TUNE, "--budget", "6", "--jobs", "1", "--out", str(out), "--resume")
    assert again.exit_code == 0, again.output
    assert simulations == [] and (out / "tune.csv").read_bytes() == first


@pytest.mark.parametrize("changed", [["--budget", "8"], ["--sampler", "random"], ["--space", "temperature=0:1"],
                                     ["--constraint", "ttft_p99_ms<=250"]])
@pytest.mark.slow
def test_resume_refuses_the_journal_of_other_search_options_in_one_line(tmp_path, changed):
    out = tmp_path / "out"
    assert invoke(*TUNE, "--budget", "4", "--jobs", "1", "--out", str(out)).exit_code == 0
    args = [*TUNE, "--budget", "4", "--jobs", "1", "--out", str(out), "--resume"]
    for i in range(0, len(args) - 1):  # the changed option replaces the one given (or is added)
        if args[i] == changed[0]:
            args[i + 1] = changed[1]
            break
    else:
        args += changed
    res = invoke(*args)
    assert res.exit_code == 2, res.output
    assert "records another study" in res.output and "Traceback" not in res.output


def test_resume_without_out_is_a_usage_error():
    res = invoke(*TUNE, "--budget", "2", "--jobs", "1", "--resume")
    assert res.exit_code == 2 and "--resume needs --out DIR" in res.output


def _tune_cli(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "sim.cli", *TUNE, "--budget", "16", "--jobs", "2", "--out", str(out), *extra]


@pytest.mark.slow
def test_sigint_stops_the_tune_in_one_line_and_resume_gives_the_uninterrupted_csv(tmp_path):
    full = subprocess.run(_tune_cli(tmp_path / "full"), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    journal = out / "runs.jsonl"
    # NOTE: the header and two runs: trial 0 runs alone (in this process), the next from the first batch, once the
    # pool has forked its workers. A SIGINT that lands inside fork() is swallowed by an at-fork hook (logging's
    # `_releaseLock`, "Exception ignored"), so the signal is sent after the forks.
    returncode, stderr = interrupt_once_journaled(_tune_cli(out), journal, lines=3, signum=signal.SIGINT)
    assert returncode == 130, stderr
    saved = len(_run_lines(out))
    assert 2 <= saved < 16
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGINT: ") and f"{saved} of at most 16 runs saved in {journal}" in last
    assert "--resume" in last and "Traceback" not in stderr, stderr
    assert not (out / "tune.csv").exists()
    resumed = subprocess.run(_tune_cli(out, "--resume"), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert (out / "tune.csv").read_bytes() == (tmp_path / "full" / "tune.csv").read_bytes()
    assert manifest_matches(out)


PLAN = ["plan", "router", "--prefixes", "24", "--workers", "6", "--concurrency", "8", "--router", "random,kv-aware",
        "--constraint", "ttft_p99_ms<=250", "--budget", "8", "--repeats", "2", "--seed", "0", "--jobs", "1"]


@pytest.mark.slow
def test_plan_choose_router_resumes_from_its_journal_with_the_same_bytes(tmp_path, simulations):
    full = invoke(*PLAN, "--out", str(tmp_path / "d1"))
    assert full.exit_code == 0, full.output
    lines = _run_lines(tmp_path / "d1")
    assert len(lines) == len(simulations)
    keys = [json.loads(line)["key"] for line in lines]
    assert keys[:2] == [["random", [], 0], ["random", [], 1]]  # no knobs: its defaults on the two seeds
    assert all(k[0].startswith("kv-aware") for k in keys[2:])  # the router spec first, its name first
    cut = tmp_path / "d2"
    cut.mkdir()
    header = (tmp_path / "d1" / "runs.jsonl").read_text().splitlines()[0]
    (cut / "runs.jsonl").write_text("\n".join([header, *lines[:3]]) + "\n")
    simulations.clear()
    resumed = invoke(*PLAN, "--out", str(cut), "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert len(simulations) == len(lines) - 3
    for name in ("plan.csv", "plan.png"):
        assert (cut / name).read_bytes() == (tmp_path / "d1" / name).read_bytes(), name
    assert manifest_matches(cut)


PLAN_VARY = ["plan", "capacity", "--prefixes", "8", "--target-hit-rate", "0.6", "--vary", "kv-gib", "--min", "1",
             "--max", "3", "--step", "0.5", "--router", "random,prefix-hash", "--repeats", "2", "--horizon", "200", "--jobs", "1"]


@pytest.mark.slow
def test_plan_vary_resume_runs_only_the_bisections_missing_simulations(tmp_path, monkeypatch):
    import sim.studies.plan as plan_module

    seen: list = []
    real = plan_module._simulate
    monkeypatch.setattr(plan_module, "_simulate", lambda job: seen.append(job[0].seed) or real(job))
    full = invoke(*PLAN_VARY, "--out", str(tmp_path / "d1"))
    assert full.exit_code == 0, full.output
    lines = _run_lines(tmp_path / "d1")
    assert len(lines) == len(seen) >= 4
    key = json.loads(lines[0])["key"]
    assert key[:2] == ["random", "kv-gib"] and len(key) == 4  # [router, vary, value, seed]

    cut = tmp_path / "d2"
    cut.mkdir()
    k = 3
    header = (tmp_path / "d1" / "runs.jsonl").read_text().splitlines()[0]
    (cut / "runs.jsonl").write_text("\n".join([header, *lines[:k]]) + "\n")
    seen.clear()
    resumed = invoke(*PLAN_VARY, "--out", str(cut), "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert len(seen) == len(lines) - k
    assert sorted(_run_lines(cut)) == sorted(lines)
    for name in ("plan.csv", "plan.png"):
        assert (cut / name).read_bytes() == (tmp_path / "d1" / name).read_bytes(), name

    other = invoke(*PLAN_VARY, "--horizon", "300", "--out", str(cut), "--resume")
    assert other.exit_code == 2 and "records another study" in other.output
    assert len(other.output.strip().splitlines()) == 1


def test_plan_vary_resume_needs_out():
    res = invoke("plan", "capacity", "--prefixes", "7", "--target-hit-rate", "0.5", "--vary", "workers", "--resume")
    assert res.exit_code == 2 and "--resume needs --out DIR" in res.output
