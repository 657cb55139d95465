"""The command line: outputs, files, and one-line errors for bad input (no traceback, non-zero exit)."""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.scenario import ScenarioError, load_scenario
from tests.support.paths import FIXTURES, SCENARIOS, TRACES

REQUIRED = ["workers", "prefixes", "concurrency", "router", "repeat", "requests", "request_hit_rate",
            "full_hit_rate", "token_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "throughput_rps"]


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


@pytest.mark.slow
def test_sweep_writes_summary_and_figure(tmp_path):
    out = tmp_path / "out"
    res = invoke("sweep", "--prefixes", "2,7", "--workers", "3", "--concurrency", "4", "--router", "random,kv-aware",
                 "--repeats", "2", "--jobs", "1", "--out", str(out))
    assert res.exit_code == 0, res.output
    assert "formula" in res.output and "measured" in res.output
    rows = list(csv.DictReader((out / "summary.csv").open()))
    assert len(rows) == 2 * 2 * 2
    assert set(REQUIRED) <= set(rows[0])
    assert {(r["prefixes"], r["router"], r["repeat"]) for r in rows} == {
        (n, r, k) for n in ("2", "7") for r in ("random", "kv-aware") for k in ("0", "1")}
    for name in ("hit_rate.png", "ttft_cdf.png"):
        png = (out / name).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000, name


def test_sweep_shows_the_measured_value_and_the_formula():
    res = invoke("sweep", "--prefixes", "2", "--workers", "6", "--concurrency", "4", "--jobs", "1")
    assert res.exit_code == 0, res.output
    line = next(l for l in res.output.splitlines() if l.split()[1:2] == ["2"] and "random" in l)
    assert "0.950" in line  # simulated (exactly the first-visit misses) and measured
    assert "1.000" in line  # the formula min(1, 3.95/2)
    assert "RMSE" in res.output


def test_run_writes_one_row_and_the_requests(tmp_path):
    res = invoke("run", "--prefixes", "7", "--workers", "3", "--concurrency", "4", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    rows = list(csv.DictReader((tmp_path / "summary.csv").open()))
    assert len(rows) == 1 and rows[0]["workers"] == "3" and set(REQUIRED) <= set(rows[0])
    requests = list(csv.DictReader((tmp_path / "requests.csv").open()))
    assert len(requests) == 200 + 7
    assert sum(r["warmup"] == "True" for r in requests) == 7


@pytest.mark.parametrize("args,message", [
    (["sweep", "--prefixes", "2,x"], "'2,x' is not a comma-separated list of whole numbers"),
    (["sweep", "--prefixes", "0"], "every value must be a whole number >= 1"),
    (["sweep", "--prefixes", "2", "--router", "magic"], "unknown router magic; allowed: "),
    (["sweep", "--prefixes", "2", "--scenario", "/nonexistent.yaml"], "scenario file '/nonexistent.yaml' does not exist"),
    (["sweep", "--prefixes", "2", "--repeats", "0"], "--repeats"),
    (["run", "--workers", "0"], "--workers"),
    (["sweep", "--prefixes", "2", "--router", "kv-aware:state=eventz"],
     "kv-aware:state=eventz: state: Input should be 'exact', 'events' or 'approximate'"),
    (["sweep", "--prefixes", "2", "--router", "kv-aware:bogus=1,random"], "bogus: unknown option of kv-aware; allowed: "),
    (["sweep", "--prefixes", "2", "--router", "kv-aware:"], "nothing after ':'"),
    (["run", "--router", "p2c:temperature=1"], "temperature: unknown option of p2c; allowed: "),
    (["sweep", "--prefixes", "2", "--router", "kv-aware:state=events,event_lag_s=-1"], "event_lag_s"),
])
def test_bad_input_is_one_clear_line_and_a_nonzero_exit(args, message):
    res = CliRunner().invoke(main, args)
    assert res.exit_code != 0
    assert message in res.output
    assert "Traceback" not in res.output


def test_router_options_the_cluster_contradicts_are_one_line(tmp_path):
    # One event lag per worker, but two lags for a three-worker cluster: found before any run.
    path = tmp_path / "s.yaml"
    path.write_text("name: s\nmodel: {kv_bytes_per_token: 114688}\nengine: {kind: vllm, kv_cache_bytes: 1073741824}\n"
                    "workload: {prefixes: 4, prefix_tokens: 2032, tail_tokens: 339, output_tokens: 64, concurrency: 2}\n"
                    "router: 'kv-aware:state=events'\ncluster: {workers: 3}\n")
    text = path.read_text().replace("'kv-aware:state=events'", "{name: kv-aware, options: {state: events, event_lag_s: [0.1, 0.2]}}")
    path.write_text(text)
    for args in (["sweep", "--scenario", str(path), "--prefixes", "4"], ["run", str(path)]):
        res = CliRunner().invoke(main, args)
        assert res.exit_code != 0 and "Traceback" not in res.output, res.output
        assert "event_lag_s: give one lag >= 0 per worker (3), got [0.1, 0.2]" in res.output


def test_bad_scenario_file_names_the_field(tmp_path):
    scenario, path = load_scenario()
    text = path.read_text().replace("block_size: 16", "block_size: -3")
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    res = CliRunner().invoke(main, ["run", str(bad)])
    assert res.exit_code != 0
    assert "engine.block_size: Input should be greater than or equal to 1" in res.output
    assert "Traceback" not in res.output


def test_nothing_written_when_input_is_bad(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "summary.csv").write_text("keep me\n")
    res = CliRunner().invoke(main, ["sweep", "--prefixes", "2", "--router", "nope", "--out", str(out)])
    assert res.exit_code != 0
    assert (out / "summary.csv").read_text() == "keep me\n"


def test_scenario_overrides_are_validated():
    scenario, _ = load_scenario()
    with pytest.raises(ScenarioError, match="one request needs 153 blocks but a worker has 99 usable: "
                                            "raise engine.kv_cache_bytes"):
        scenario.with_overrides(**{"engine.kv_cache_bytes": 100 * 16 * 114688})
    with pytest.raises(ScenarioError, match="one request needs 153 blocks but a worker has 99 usable: "
                                            "raise engine.num_gpu_blocks_override"):
        scenario.with_overrides(**{"engine.num_gpu_blocks_override": 100})
    with pytest.raises(ScenarioError, match="cluster.workers: Input should be greater than or equal to 1"):
        scenario.with_overrides(**{"cluster.workers": 0})


def test_help_explains_every_option():
    res = invoke("sweep", "--help")
    for option in ("--scenario", "--prefixes", "--workers", "--concurrency", "--router", "--repeats", "--seed",
                   "--jobs", "--out"):
        assert option in res.output
    assert "routers" in invoke("--help").output
    assert "kv-aware" in invoke("routers").output


def _commands(group=main, path=()):
    """Every command of `kvsim`, subcommands of groups included, as (path, command)."""
    import click

    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        yield (*path, name), command


def test_the_executor_options_are_declared_once_with_one_help_text():
    shared = {}
    for path, command in _commands():
        for param in command.params:
            if param.name in ("jobs", "executor_kind", "dask_scheduler"):
                shared.setdefault(param.opts[0], {}).setdefault(param.help, []).append(" ".join(path))
    assert set(shared) == {"--jobs", "--executor", "--dask-scheduler"}
    for option, helps in shared.items():
        assert len(helps) == 1, (option, helps)
    users = sorted(next(iter(shared["--jobs"].values())))
    assert users == sorted(next(iter(shared["--executor"].values()))) == sorted(
        next(iter(shared["--dask-scheduler"].values())))
    assert {"sweep", "compare", "tune", "calibrate", "replay"} <= set(users)


def test_run_takes_its_scenario_as_scenario_file_or_positional(tmp_path):
    from sim.scenario import builtin_scenario_path

    tiny = str(builtin_scenario_path("tiny-cpu"))
    for name, args in (("option", ["run", "--scenario", tiny]), ("positional", ["run", tiny])):
        res = invoke(*args, "--prefixes", "2", "--out", str(tmp_path / name))
        assert res.exit_code == 0, res.output
        assert "tiny-cpu" in res.output
    assert (tmp_path / "option" / "summary.csv").read_bytes() == (tmp_path / "positional" / "summary.csv").read_bytes()
    res = CliRunner().invoke(main, ["run", tiny, "--scenario", tiny])
    assert res.exit_code == 2 and res.output.strip().splitlines()[-1] == "Error: give SCENARIO or --scenario, not both"


def test_replay_and_validate_take_their_files_as_compare_and_calibrate_spell_them():
    trace, run_csv = str(TRACES / "conversation_head400.jsonl"), str(FIXTURES / "real-vllm" / "w2-n12-c1.csv")
    replay = ["--workers", "2", "--kv-tokens", "100000", "--limit", "40"]
    by_option, by_position = invoke("replay", "--trace", trace, *replay), invoke("replay", trace, *replay)
    assert by_option.exit_code == by_position.exit_code == 0, by_option.output
    assert "40 requests" in by_option.output and "40 requests" in by_position.output
    tiny = ["--scenario", str(SCENARIOS / "tiny-cpu.yaml")]
    assert invoke("validate", "--runs", run_csv, *tiny).output == invoke("validate", run_csv, *tiny).output
    for args, message in ((["replay", trace, "--trace", trace, *replay], "give TRACE or --trace, not both"),
                          (["replay", *replay], "give the trace to replay: TRACE or --trace FILE"),
                          (["validate", run_csv, "--runs", run_csv], "give RUN.csv... or --runs, not both"),
                          (["validate"], "give the measured runs: RUN.csv... or --runs FILE (repeatable)")):
        res = CliRunner().invoke(main, args)
        assert res.exit_code == 2 and res.output.strip().splitlines()[-1] == f"Error: {message}", res.output


def test_the_resume_line_of_a_subcommand_names_its_group(monkeypatch):
    import sys

    import click

    from sim.cli.study_runs import resume_command

    monkeypatch.setattr(sys, "argv", ["/venv/bin/kvsim", "plan", "router", "--router", "random,kv-aware", "--out",
                                      "my dir", "--resume"])
    plan = main.get_command(click.Context(main), "plan")
    with click.Context(main, info_name="kvsim") as root, click.Context(plan, parent=root, info_name="plan") as group, \
            click.Context(plan.commands["router"], parent=group, info_name="router") as ctx:
        assert resume_command(ctx) == "kvsim plan router --router random,kv-aware --out 'my dir'"


def test_every_command_that_takes_a_scenario_spells_it_scenario_file():
    takes = {" ".join(path): command for path, command in _commands()
             if any(p.name == "scenario_path" for p in command.params)}
    assert set(takes) == {"run", "sweep", "compare", "plan capacity", "plan router", "plan cost", "tune", "calibrate",
                          "replay", "validate", "measure"}
    for name, command in takes.items():
        [option] = [p for p in command.params if p.name == "scenario_path"]
        assert option.opts == ["--scenario"] and option.metavar == "FILE", name
        assert "`kvsim scenarios` lists the built-in ones" in option.help, name


def test_the_root_help_lists_every_command_as_its_module_registers_it_without_importing_one():
    # `kvsim --help` reads the commands' one-line help from sim.cli.root.COMMANDS (issue 27: start-up), so the
    # registry must name each command's module and its help exactly as the command gives it.
    import importlib
    import subprocess
    import sys

    import click

    from sim.cli.root import COMMANDS

    for name, (module, short_help) in COMMANDS.items():
        importlib.import_module(module)
        command = main.commands[name]
        assert command.get_short_help_str(limit=10_000) == short_help, name
    assert set(main.commands) == set(COMMANDS)  # every module imported: no command missing from the registry
    code = "import sys; from sim.cli import main; print(sorted(m for m in sys.modules if m.startswith('sim.')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['sim.cli', 'sim.cli.root']"
    # The help as an eager group of the same commands renders it.
    eager = click.Group("kvsim", commands=main.commands, help=main.help,
                        context_settings=main.context_settings, params=main.params)
    assert (CliRunner().invoke(main, ["--help"], prog_name="kvsim").output
            == CliRunner().invoke(eager, ["--help"], prog_name="kvsim").output)
