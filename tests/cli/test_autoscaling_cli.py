"""`--autoscaler` on run and replay: an autoscaled replay writes its timeline, instances and figure and appends the
fleet columns, an autoscaled run that never scales serves exactly as the fixed fleet, a replay with an autoscaler
never splits, and bad input is one line."""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.replay import device_groups
from sim.results.report import SUMMARY_COLUMNS
from sim.results.timeline import FLEET_COLUMNS, INSTANCE_COLUMNS, TIMELINE_COLUMNS
from sim.scenario import load_scenario
from tests.support.paths import SCENARIOS, TRACES

TRACE = str(TRACES / "conversation_head400.jsonl")


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_an_autoscaled_replay_writes_its_timeline(tmp_path):
    # A schedule: 1 worker, 2 from 30 s (ready 30 s after the tick at 30 s: the trace-replay model has no
    # architecture, so the delay is the engine start-up's 30 s), back to 1 at 90 s.
    res = invoke("replay", TRACE, "--autoscaler", "schedule:at=0/1,30/2,90/1,interval_s=10", "--max-workers", "3",
                 "--kv-blocks", "2000", "--router", "round-robin", "--timeline-bin-s", "30", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    row = next(csv.DictReader((tmp_path / "summary.csv").open()))
    assert set(FLEET_COLUMNS) <= set(row)
    assert (row["workers"], row["jobs"], row["fleet_launched"], row["fleet_drained"]) == ("3", "1", "1", "1")
    instances = list(csv.DictReader((tmp_path / "instances.csv").open()))
    assert tuple(instances[0]) == INSTANCE_COLUMNS
    assert [(i["slot"], i["instance"], i["started_s"], i["ready_s"], i["drained_s"]) for i in instances] == [
        ("0", "0", "0", "0", ""), ("1", "1", "30", "60", "90")]
    timeline = list(csv.DictReader((tmp_path / "timeline.csv").open()))
    assert tuple(timeline[0]) == TIMELINE_COLUMNS
    assert [(r["start_s"], r["workers_ready"], r["workers_starting"], r["workers_launched"]) for r in timeline[:3]] == [
        ("0", "1", "0", "0"), ("30", "1", "1", "1"), ("60", "2", "0", "0")]
    # Device-seconds: worker 0 all along, worker 1 from its launch at 30 s to its stop (after its drain at 90 s).
    simulated_s = float(row["simulated_s"])
    assert float(row["fleet_device_s"]) >= simulated_s + 60
    assert (tmp_path / "timeline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_autoscaled_run_that_never_scales_is_the_fixed_fleet(tmp_path):
    # Two workers ready at 0, bounds [2, 2]: the autoscaler can change nothing, so every request is routed and
    # served as on the fixed fleet of two (kv-aware routing reads the caches: any difference would show).
    fixed = invoke("run", "--workers", "2", "--router", "kv-aware", "--out", str(tmp_path / "fixed"))
    scaled = invoke("run", "--workers", "2", "--router", "kv-aware", "--autoscaler", "hpa", "--min-workers", "2",
                    "--max-workers", "2", "--out", str(tmp_path / "scaled"))
    assert fixed.exit_code == 0 and scaled.exit_code == 0, fixed.output + scaled.output
    assert (tmp_path / "fixed" / "requests.csv").read_bytes() == (tmp_path / "scaled" / "requests.csv").read_bytes()
    fixed_row = next(csv.DictReader((tmp_path / "fixed" / "summary.csv").open()))
    scaled_row = next(csv.DictReader((tmp_path / "scaled" / "summary.csv").open()))
    assert {k: scaled_row[k] for k in SUMMARY_COLUMNS} == {k: fixed_row[k] for k in SUMMARY_COLUMNS}
    assert (scaled_row["fleet_launched"], scaled_row["fleet_workers_mean"]) == ("0", "2")
    assert not set(FLEET_COLUMNS) & set(fixed_row)


def test_a_session_trace_replays_closed_loop_on_an_autoscaled_fleet(tmp_path):
    # Qwen-Bailian sessions (closed loop): the schedule asks for 3 workers from 5 s; two start then and serve.
    res = invoke("replay", str(TRACES / "bailian_synthetic.jsonl"), "--autoscaler", "schedule:at=0/1,5/3,interval_s=5",
                 "--max-workers", "3", "--router", "kv-aware", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    instances = list(csv.DictReader((tmp_path / "instances.csv").open()))
    assert [(i["slot"], i["started_s"], i["ready_s"]) for i in instances] == [("0", "0", "0"), ("1", "5", "35"),
                                                                             ("2", "5", "35")]
    row = next(csv.DictReader((tmp_path / "summary.csv").open()))
    assert int(row["requests"]) == sum(int(i["requests"]) for i in instances)


def test_an_autoscaled_replay_never_splits():
    s, _ = load_scenario(SCENARIOS / "trace-replay.yaml")
    s = s.with_overrides(**{"cluster.workers": 8, "router.name": "random", "router.options": {}})
    assert len(device_groups(s, 3)) == 3
    scaled = s.with_overrides(**{"cluster.autoscaling": {"autoscaler": {"name": "hpa"}, "max_workers": 8}})
    assert device_groups(scaled, 3) == [frozenset(range(8))]


@pytest.mark.parametrize("args, message", [
    (("run", "--min-workers", "2"), "--min-workers: only with an autoscaler; give --autoscaler NAME"),
    (("replay", TRACE), "give --workers N (or an autoscaler: --autoscaler NAME --max-workers N)"),
    pytest.param(("replay", TRACE, "--autoscaler", "hpa"),
                 "--autoscaler: give --max-workers N"),
    pytest.param(("replay", TRACE, "--autoscaler", "hpaa", "--max-workers", "4"),
                 "cluster.autoscaling.autoscaler.name: unknown autoscaler 'hpaa'; did you mean hpa?"),
    pytest.param(("replay", TRACE, "--autoscaler", "hpa", "--min-workers", "5", "--max-workers", "4"),
                 "min_workers (5) must be <= max_workers (4)"),
    pytest.param(("run", "--autoscaler", "hpa", "--max-workers", "4", "--prefill-workers", "1", "--decode-workers",
                  "1"), "cluster.autoscaling: not modelled with P/D pools"),
])
def test_bad_input_is_one_line(args, message):
    res = CliRunner().invoke(main, list(args))
    assert res.exit_code != 0
    assert message in res.output, res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) <= 3


def test_a_scenario_files_unknown_autoscaler_is_named_with_its_line(tmp_path):
    text = (SCENARIOS / "service-baseline.yaml").read_text()
    assert "\ncluster:\n" in text
    path = tmp_path / "s.yaml"
    path.write_text(text.replace("\ncluster:\n", "\ncluster:\n  autoscaling:\n    autoscaler: {name: nosuch}\n"
                                                 "    max_workers: 4\n", 1))
    res = CliRunner().invoke(main, ["run", str(path)])
    assert res.exit_code != 0
    assert "cluster.autoscaling.autoscaler.name: unknown autoscaler 'nosuch'" in res.output, res.output
    assert "s.yaml:" in res.output and "Traceback" not in res.output
