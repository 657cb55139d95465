"""Starting from a built-in scenario: `kvsim scenarios` lists them, `kvsim scenarios export NAME` writes one that runs
from any folder (its shipped files as `kvsim:PATH`), and a copy whose reference measurements are missing runs with a
one-line warning (calibrate, which needs them, says so in one line)."""

from __future__ import annotations

import shutil

import pytest
import yaml
from click.testing import CliRunner

from sim.cli import main
from sim.scenario import builtin_scenario_names, builtin_scenario_path, load_scenario, scenarios_dir
from tests.support.paths import FIXTURES, TRACES


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_scenarios_lists_every_built_in_scenario_a_line_each():
    res = invoke("scenarios")
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert [line.split()[0] for line in lines] == builtin_scenario_names() == sorted(
        p.stem for p in scenarios_dir().glob("*.yaml"))
    (baseline,) = [line for line in lines if line.split()[0] == "service-baseline"]
    assert "Qwen3-0.6B (114,688 KV bytes/token) on vLLM 0.31.0" in baseline


def test_export_writes_the_built_in_file_with_its_shipped_files_as_kvsim_paths():
    res = invoke("scenarios", "export", "service-baseline")
    assert res.exit_code == 0, res.output
    original = builtin_scenario_path().read_text()
    assert res.output.endswith(original.replace("reference: reference/service-baseline.csv",
                                                "reference: kvsim:reference/service-baseline.csv"))
    assert res.output.startswith("# Exported by `kvsim scenarios export service-baseline`")
    assert yaml.safe_load(res.output) == {**yaml.safe_load(original),
                                          "reference": "kvsim:reference/service-baseline.csv"}
    for name in builtin_scenario_names():  # the others ship no files: the same data
        text = invoke("scenarios", "export", name).output
        if name != "service-baseline":
            assert yaml.safe_load(text) == yaml.safe_load(builtin_scenario_path(name).read_text()), name


def test_export_refuses_an_unknown_name_and_an_existing_out(tmp_path):
    res = invoke("scenarios", "export", "nope")
    assert res.exit_code == 2 and "Traceback" not in res.output
    assert res.output.strip().splitlines()[-1] == ("Error: Invalid value for NAME: no built-in scenario 'nope'; "
                                                   f"allowed: {', '.join(builtin_scenario_names())}")
    mine = tmp_path / "my.yaml"
    mine.write_text("# my edits\n")
    res = invoke("scenarios", "export", "tiny-cpu", "--out", mine)
    assert res.exit_code == 2 and res.output.strip().splitlines()[-1].startswith(f"Error: --out {mine} exists")
    assert mine.read_text() == "# my edits\n"
    assert invoke("scenarios", "export", "tiny-cpu", "--out", tmp_path / "new.yaml").exit_code == 0
    assert load_scenario(tmp_path / "new.yaml")[0] == load_scenario(builtin_scenario_path("tiny-cpu"))[0]


SMALL = ["--prefixes", "2", "--workers", "3", "--concurrency", "4"]
COMMANDS = [
    ["run", *SMALL],
    ["sweep", "--prefixes", "2", "--workers", "6", "--concurrency", "4", "--jobs", "1"],  # a measured point
    ["compare", *SMALL, "--router", "random,round-robin", "--repeats", "1", "--jobs", "1"],
    ["plan", "capacity", "--prefixes", "2", "--vary", "workers", "--target-hit-rate", "0.5", "--max", "2",
     "--repeats", "2", "--horizon", "50", "--jobs", "1"],
    ["plan", "router", *SMALL, "--router", "random,round-robin", "--budget", "2", "--repeats", "2", "--jobs", "1"],
    ["tune", *SMALL, "--router", "random", "--budget", "1", "--repeats", "1", "--jobs", "1"],
    ["replay", "--trace", TRACES / "conversation_head400.jsonl", "--workers", "2", "--limit", "20"],
    ["validate", FIXTURES / "real-vllm" / "w2-n12-c1.csv"],
]


@pytest.mark.parametrize("args", COMMANDS, ids=[" ".join(map(str, c[:2])) for c in COMMANDS])
def test_an_exported_scenario_runs_under_every_command_from_another_folder(tmp_path, monkeypatch, args):
    monkeypatch.chdir(tmp_path)
    assert invoke("scenarios", "export", "service-baseline", "--out", "my.yaml").exit_code == 0
    res = invoke(*args, "--scenario", "my.yaml")
    assert res.exit_code == 0, res.output
    assert "warning" not in res.stderr
    if args[0] == "sweep":  # its reference found: the measured column and the error against it
        assert "RMSE" in res.output


def test_an_exported_scenario_finds_its_reference_for_calibrate(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    invoke("scenarios", "export", "service-baseline", "--out", "my.yaml")
    # NOTE: a bad --fit is refused after the measurements are read: the reference was found (a fit takes minutes)
    res = invoke("calibrate", "--scenario", "my.yaml", "--fit", "time_model.nope", "--out", "fitted.yaml")
    assert res.exit_code == 2 and "--fit" in res.output and "reference" not in res.output, res.output


def test_a_plain_copy_whose_reference_is_missing_runs_with_a_one_line_warning(tmp_path):
    copy = tmp_path / "copy.yaml"
    shutil.copy(builtin_scenario_path(), copy)
    missing = tmp_path / "reference" / "service-baseline.csv"
    res = invoke("sweep", "--scenario", copy, *SMALL, "--jobs", "1", "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output
    [warning] = res.stderr.strip().splitlines()
    assert warning.startswith(f"warning: reference: {missing} not found; running without measurements")
    assert "RMSE" not in res.output and (tmp_path / "out" / "summary.csv").is_file()
    for args in (["run", copy, *SMALL], ["compare", "--scenario", copy, *SMALL, "--router", "random", "--repeats",
                                         "1", "--jobs", "1"]):
        assert invoke(*args).exit_code == 0, args
    res = invoke("calibrate", "--scenario", copy, "--out", tmp_path / "fitted.yaml")  # it needs measurements
    assert res.exit_code == 1 and "Traceback" not in res.output
    assert res.output.strip().splitlines() == [
        f"Error: reference: {missing} not found; calibrating needs measurements: give --measured FILE or --runs "
        "RUN.csv, or point the scenario's reference at them"]
    assert not (tmp_path / "fitted.yaml").exists()


def test_kvsim_paths_resolve_against_the_scenarios_folder(tmp_path, monkeypatch):
    import sim.scenario
    from sim.studies.reference import load_reference, reference_path
    from sim.timing.architecture import load_architecture, models_dir

    text = builtin_scenario_path().read_text()
    shipped = tmp_path / "installed"
    (shipped / "models").mkdir(parents=True)
    shutil.copy(models_dir() / "Qwen3-0.6B.json", shipped / "models" / "qwen.json")
    shutil.copytree(scenarios_dir() / "reference", shipped / "reference")
    monkeypatch.setattr(sim.scenario, "scenarios_dir", lambda: shipped)
    elsewhere = tmp_path / "elsewhere" / "s.yaml"
    elsewhere.parent.mkdir()
    elsewhere.write_text(text.replace("reference: reference/", "reference: kvsim:reference/").replace(
        "  config: Qwen3-0.6B ", "  config: kvsim:models/qwen.json "))
    scenario, path = load_scenario(elsewhere)
    assert scenario.model.architecture == load_architecture("Qwen3-0.6B")[1] and scenario.model.name == "qwen"
    assert scenario.reference == "kvsim:reference/service-baseline.csv"
    assert reference_path(scenario, path) == shipped / "reference" / "service-baseline.csv"
    assert load_reference(reference_path(scenario, path)) == load_reference(scenarios_dir() / "reference" /
                                                                           "service-baseline.csv")
