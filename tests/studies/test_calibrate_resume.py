"""`kvsim calibrate` journals every finished simulation beside its --out file, in <out>.runs.jsonl; with --resume
the deterministic fit replays and takes the journaled runs instead of simulating them, so the resumed fitted
scenario and residuals are byte for byte those of an uninterrupted run."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import sim.studies.calibrate as calibrate_module
from sim.cli import main
from tests.support.calibration_inputs import small_scenario, write_calibration_inputs
from tests.support.interrupts import interrupt_once_journaled
from tests.support.paths import REPO

FAST = ["--fit", "time_model.compute_efficiency", "--holdout", "prefixes=4", "--repeats", "1", "--starts", "2",
        "--refine", "1", "--max-evaluations", "15", "--jobs", "1"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> list[str]:
    """--scenario and --measured of a small calibration (synthetic measurements of a known parameter)."""
    scenario_file, measured = write_calibration_inputs(tmp_path_factory.mktemp("inputs"),
                                                       {"time_model.compute_efficiency": 0.3})
    return ["--scenario", str(scenario_file), "--measured", str(measured)]


@pytest.fixture
def simulations(monkeypatch) -> list:
    """The simulations run in this process (with --jobs 1 every one of them), counted as they start."""
    seen: list = []
    real = calibrate_module.simulate_latencies

    def counted(scenario, *args):
        seen.append(scenario.seed)
        return real(scenario, *args)

    monkeypatch.setattr(calibrate_module, "simulate_latencies", counted)
    return seen


def calibrate(inputs: list[str], out: Path, *extra: str):
    return CliRunner().invoke(main, ["calibrate", *inputs, *FAST, "--out", str(out),
                                     "--report", str(out.with_suffix(".csv")), *extra])


def _journal(out: Path) -> list[str]:
    return Path(f"{out}.runs.jsonl").read_text().splitlines()


@pytest.mark.slow
def test_resume_runs_only_the_simulations_the_journal_lacks_and_gives_the_same_bytes(tmp_path, inputs, simulations):
    first = tmp_path / "a" / "fitted.yaml"
    full = calibrate(inputs, first)
    assert full.exit_code == 0, full.output
    header, *lines = _journal(first)
    assert json.loads(header)["study"] == "calibrate"
    assert len(lines) == len(simulations) > 10
    key = json.loads(lines[0])["key"]
    # the initial value, the first case and its seed (one repeat: the base seed)
    assert key[0] == [["time_model.compute_efficiency", small_scenario().time_model.compute_efficiency]]
    assert key[1] == "2/2/2" and key[2] == small_scenario().seed
    # an evaluation the optimiser repeats (the report's, of the best candidate) is taken from the journal, so
    # every journaled simulation is a different one
    assert len({json.dumps(json.loads(line)["key"]) for line in lines}) == len(lines)

    second = tmp_path / "b" / "fitted.yaml"
    second.parent.mkdir()
    k = len(lines) // 2
    Path(f"{second}.runs.jsonl").write_text("\n".join([header, *lines[:k]]) + "\n")
    simulations.clear()
    resumed = calibrate(inputs, second, "--resume")
    assert resumed.exit_code == 0, resumed.output
    assert len(simulations) == len(lines) - k
    assert sorted(_journal(second)[1:]) == sorted(lines)
    assert second.read_bytes() == first.read_bytes()
    assert second.with_suffix(".csv").read_bytes() == first.with_suffix(".csv").read_bytes()

    simulations.clear()
    again = calibrate(inputs, second, "--resume")  # a complete journal: nothing to simulate
    assert again.exit_code == 0, again.output
    assert simulations == [] and second.read_bytes() == first.read_bytes()


def test_resume_refuses_the_journal_of_other_options_in_one_line(tmp_path, inputs):
    out = tmp_path / "fitted.yaml"
    assert calibrate(inputs, out).exit_code == 0
    journal = Path(f"{out}.runs.jsonl").read_bytes()
    res = CliRunner().invoke(main, ["calibrate", *inputs, *FAST, "--starts", "3", "--out", str(out), "--resume"])
    assert res.exit_code == 2, res.output
    assert "records another study" in res.output and "Traceback" not in res.output
    assert len(res.output.strip().splitlines()) == 1
    assert Path(f"{out}.runs.jsonl").read_bytes() == journal  # left as it was


@pytest.mark.slow
def test_sigterm_stops_the_calibration_in_one_line_and_resume_gives_the_uninterrupted_fit(tmp_path, inputs):
    slower = [*FAST, "--starts", "8", "--refine", "2", "--max-evaluations", "40"]

    def cli(out: Path, *extra: str) -> list[str]:
        return [sys.executable, "-m", "sim.cli", "calibrate", *inputs, *slower, "--out", str(out), *extra]

    full = subprocess.run(cli(tmp_path / "full.yaml"), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut.yaml"
    journal = Path(f"{out}.runs.jsonl")
    returncode, stderr = interrupt_once_journaled(cli(out), journal, lines=4, signum=signal.SIGTERM)
    assert returncode == 143, stderr
    saved = len(journal.read_text().splitlines()) - 1
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("stopped by SIGTERM: ") and f"{saved} runs saved in {journal}" in last
    assert "--resume" in last and "Traceback" not in stderr, stderr
    assert not out.exists()
    resumed = subprocess.run(cli(out, "--resume"), cwd=REPO, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert out.read_bytes() == (tmp_path / "full.yaml").read_bytes()
