"""A sessions workload's fields are checked as the file is read: each problem is one line naming the field (its key's
line and column in the file) and what is allowed; a file without `workload.kind` is a shared-prefix workload."""

from __future__ import annotations

import pytest
import yaml

from sim.scenario import ScenarioError, load_scenario
from sim.workloads.session_spec import DurationSpec, sample_seconds
from sim.workloads.shared_prefix import rng_for
from tests.support.paths import REPO
from tests.workloads.session_scenarios import BASE, CHAT


def _write(tmp_path, workload: dict) -> str:
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({**BASE, "workload": workload}, sort_keys=False))
    return str(path)


def _error(tmp_path, workload: dict) -> str:
    path = _write(tmp_path, workload)
    with pytest.raises(ScenarioError) as err:
        load_scenario(path)
    text = str(err.value)
    assert "\n" not in text and "Traceback" not in text
    return text.removeprefix(path)


def _line_of(tmp_path, key: str) -> int:
    """The line of `key` in the file's workload section, else of the section (where a missing key is placed)."""
    lines = (tmp_path / "s.yaml").read_text().splitlines()
    section = lines.index("workload:")
    return next((i + 1 for i, line in enumerate(lines) if i > section and line.strip().startswith(f"{key}:")),
                section + 1)


CASES = [
    ({"think_time_s": None, "tool_latency_s": 2.0}, "tool_latency_s",
     "workload.tool_latency_s: not a field of style chat; its pause between turns is think_time_s"),
    ({"think_time_s": None}, "think_time_s",
     "workload.think_time_s: style chat needs it (the pause before each next turn, seconds)"),
    ({"session_rate_per_s": 1.0}, "session_rate_per_s",
     "workload.session_rate_per_s: give one of session_rate_per_s (Poisson session starts), arrival_curve (starts "
     "at a rate that follows a curve) or concurrent_sessions (a closed loop); got session_rate_per_s and "
     "concurrent_sessions"),
    ({"context_limit_tokens": 50}, "context_limit_tokens",
     "workload.context_limit_tokens: 50 cannot hold one turn: a system prompt, the newest message and an output "
     "need up to 64 tokens"),
    ({"on_context_limit": "compact", "context_limit_tokens": 500}, "compact_summary_tokens",
     "workload.compact_summary_tokens: on_context_limit compact needs it"),
    ({"subagent_probability": 0.5}, "subagent_probability",
     "workload.subagent_probability: subagents are of style agent, not chat"),
    ({"style": "agent", "think_time_s": None, "tool_latency_s": 1.0, "subagent_probability": 0.5}, "subagent_turns",
     "workload.subagent_turns: subagent_probability > 0 needs it"),
    ({"think_time_s": {"kind": "exponential", "mean": 2.0, "value": 3.0}}, "think_time_s",
     "workload.think_time_s: Input should be a valid number; or a exponential duration takes no value (it takes "
     "high, low, mean)"),
    ({"think_time_s": {"kind": "lognormal", "mean": 2.0}}, "think_time_s",
     "workload.think_time_s: Input should be a valid number; or a lognormal duration needs sd"),
    ({"turns": 0}, "turns", "workload.turns: must be >= 1, got 0"),
    ({"style": "dialogue"}, "style", "workload.style: Input should be 'chat' or 'agent'"),
    ({"kind": "session"}, "kind", "workload.kind: unknown workload kind 'session'; did you mean sessions?"),
    ({"concurent_sessions": 2, "concurrent_sessions": None}, "concurent_sessions",
     "workload.concurent_sessions: unknown key; did you mean concurrent_sessions?"),
]


@pytest.mark.parametrize(("change", "key", "expected"), CASES, ids=[c[1] + ":" + c[2][9:30] for c in CASES])
def test_a_bad_field_is_one_line_at_its_key(tmp_path, change, key, expected):
    workload = {"kind": "sessions", **CHAT, **change}
    workload = {k: v for k, v in workload.items() if v is not None}
    text = _error(tmp_path, workload)
    line, _, message = text.removeprefix(":").partition(": ")
    assert message == expected
    assert int(line.split(":")[0]) == _line_of(tmp_path, key)


def test_a_file_without_a_kind_is_a_shared_prefix_workload_as_before():
    scenario, _ = load_scenario(REPO / "scenarios" / "service-baseline.yaml")
    assert scenario.workload.kind == "shared-prefix" and not scenario.has_sessions
    assert scenario.workload.prefixes == 7


def test_the_shipped_session_scenarios_load_and_switch_engines():
    for name in ("chat", "agent"):
        scenario, _ = load_scenario(REPO / "scenarios" / f"{name}.yaml")
        assert scenario.has_sessions and scenario.workload.style == name
        assert scenario.with_engine("sglang").workload == scenario.workload
        assert scenario.max_request_tokens >= scenario.workload.context_limit_tokens


def test_without_a_context_limit_the_longest_history_must_fit_the_model_length(tmp_path):
    text = _error(tmp_path, {"kind": "sessions", **CHAT, "turns": 300})
    assert text.endswith("workload prompt+output = 9632 tokens exceeds engine.max_model_len=8192 (without "
                         "workload.context_limit_tokens, a session's history may grow to that): lower "
                         "workload.context_limit_tokens or raise the engine's")


def test_durations_draw_as_their_kind_says():
    rng = rng_for(0, "test")
    assert sample_seconds(2.5, rng) == 2.5
    assert sample_seconds(DurationSpec(kind="fixed", value=1.5), rng) == 1.5
    clipped = DurationSpec(kind="exponential", mean=10.0, low=1.0, high=2.0)
    assert all(1.0 <= sample_seconds(clipped, rng) <= 2.0 for _ in range(200))
    lognormal = DurationSpec(kind="lognormal", mean=4.0, sd=2.0)
    draws = [sample_seconds(lognormal, rng) for _ in range(20_000)]
    assert sum(draws) / len(draws) == pytest.approx(4.0, rel=0.05)
