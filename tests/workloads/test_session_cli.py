"""`kvsim run` on the shipped session scenarios, on both engines: the per-turn table and turns.csv, and one-line
errors where a command or an option needs a shared-prefix workload."""

from __future__ import annotations

import csv

import pytest
from click.testing import CliRunner

from sim.cli import main
from tests.support.paths import SCENARIOS


def invoke(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.mark.parametrize(("name", "engine"), [
    ("chat", "vllm"), ("agent", "sglang"),
    pytest.param("chat", "sglang", marks=pytest.mark.slow), pytest.param("agent", "vllm", marks=pytest.mark.slow),
])
def test_a_shipped_session_scenario_runs_and_reports_per_turn_hit_rates(tmp_path, name, engine):
    res = invoke("run", SCENARIOS / f"{name}.yaml", "--engine", engine, "--out", tmp_path)
    assert res.exit_code == 0, res.output
    assert "per turn (" in res.output and "gap survival" in res.output
    (summary,) = _rows(tmp_path / "summary.csv")
    assert summary["engine"] == engine and int(summary["sessions"]) >= (240 if name == "chat" else 64)
    turns = _rows(tmp_path / "turns.csv")
    assert [int(t["turn"]) for t in turns[:3]] == [0, 1, 2]
    assert sum(int(t["requests"]) for t in turns) == int(summary["session_requests"]) == int(summary["requests"])
    # Later turns resend their history: their prompts hit more than first turns do (the system prompt alone).
    assert float(turns[1]["token_hit_rate"]) > 0 and int(turns[1]["reprefill_tokens"]) >= 0
    requests = _rows(tmp_path / "requests.csv")
    assert {"session_id", "turn", "context_tokens"} <= set(requests[0])


def test_concurrency_sets_the_sessions_at_once_and_prefixes_is_refused(tmp_path):
    res = invoke("run", SCENARIOS / "chat.yaml", "--concurrency", "3", "--workers", "2", "--out", tmp_path)
    assert res.exit_code == 0, res.output
    (summary,) = _rows(tmp_path / "summary.csv")
    assert (summary["prefixes"], summary["concurrency"], summary["workers"]) == ("8", "3", "2")
    assert "chat sessions: 240, 8 groups, 3 at once" in res.output
    res = invoke("run", SCENARIOS / "chat.yaml", "--prefixes", "3")
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert res.output.strip().splitlines()[-1] == (
        "Error: --prefixes: a sessions workload has no shared prefixes N; its system prompts are workload.groups in "
        "the scenario file")


@pytest.mark.parametrize("command", [
    ("sweep", "--prefixes", "3"), ("tune",), ("plan", "router", "--router", "random"),
    ("calibrate", "--out", "x.yaml"), ("validate", "x.csv"),
])
def test_commands_of_the_shared_prefix_workload_refuse_sessions_in_one_line(tmp_path, command):
    res = invoke(*command, "--scenario", SCENARIOS / "agent.yaml")
    assert res.exit_code == 1 and "Traceback" not in res.output
    name = command[0]
    assert res.output == (f"Error: kvsim {name}: agent.yaml has a sessions workload (workload.kind: sessions); "
                          f"{name} works on a shared-prefix workload (workload.kind: shared-prefix). Run sessions "
                          f"with `kvsim run` or compare routers on them with `kvsim compare`\n")


def test_compare_puts_routers_side_by_side_on_sessions(tmp_path):
    # 24 chat sessions, 4 at once, on 2 workers: a point is (workers, groups, sessions at once); the bound is the
    # reuse available, and vllm-router-session keeps each session on one worker where random does not.
    text = (SCENARIOS / "chat.yaml").read_text().replace("sessions: 240", "sessions: 24")
    text = text.replace("session_rate_per_s:", "# session_rate_per_s:")
    scenario = tmp_path / "chat24.yaml"
    scenario.write_text(text.replace("  kind: sessions", "  kind: sessions\n  concurrent_sessions: 4", 1))
    res = invoke("compare", "--scenario", scenario, "--workers", "2", "--router", "random,vllm-router-session",
                 "--format", "csv", "--out", tmp_path / "out")
    assert res.exit_code == 0, res.output
    rows = {r["router"]: r for r in _rows(tmp_path / "out" / "compare.csv")}
    assert set(rows) == {"random", "vllm-router-session"}
    for r in rows.values():
        assert (r["workers"], r["prefixes"], r["concurrency"], r["primary_metric"]) == ("2", "8", "4", "token_hit_rate")
        assert float(r["bound"]) == pytest.approx(float(r["reuse_available"]))
    assert float(rows["vllm-router-session"]["token_hit_rate"]) > float(rows["random"]["token_hit_rate"])
