"""Bad input never breaks kvsim: each case is a one-line error naming the culprit, a non-zero exit, no traceback,
and nothing hangs (every number that reaches the event loop is finite). Table-driven: a scenario file mutated one
way at a time, and router options."""

from __future__ import annotations

import os
import stat

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.scenario import builtin_scenario_path

BASE = builtin_scenario_path().read_text()


def _replace(old: str, new: str):
    def mutate(text: str) -> str:
        assert old in text, old
        return text.replace(old, new, 1)
    return mutate


# (case, how the built-in scenario's text is changed, what the error must say)
SCENARIO_CASES = [
    ("duplicate key", lambda t: t + "\nseed: 1\n", "duplicate key 'seed' at line"),
    ("duplicate nested key", _replace("  block_size: 16\n", "  block_size: 16\n  block_size: 32\n"),
     "duplicate key 'block_size'"),
    ("infinite step time", _replace("  base_s: 0.004899502386278894", "  base_s: .inf"),
     "time_model.base_s: Input should be a finite number"),
    ("NaN step time", _replace("  base_s: 0.004899502386278894", "  base_s: .nan"), "time_model.base_s"),
    ("infinite device speed", _replace("speed: 1.0}\n    - workers: 3", "speed: .inf}\n    - workers: 3"),
     "finite number"),
    ("infinite arrival rate", _replace("  concurrency: 8\n", "  concurrency: 8\n  arrival_rate_rps: .inf\n"),
     "workload.arrival_rate_rps: Input should be a finite number"),
    ("negative tail", _replace("  tail_tokens: 339 ", "  tail_tokens: -5 "), "tail_tokens must be >= 0 tokens, got -5"),
    ("negative prefix", _replace("  prefix_tokens: 2032 ", "  prefix_tokens: -1 "), "prefix_tokens must be >= 0"),
    ("no output", _replace("  output_tokens: 64\n", "  output_tokens: 0\n"), "output_tokens must be >= 1 tokens"),
    ("empty prompt", lambda t: t.replace("  prefix_tokens: 2032 ", "  prefix_tokens: 0 ", 1).replace(
        "  tail_tokens: 339 ", "  tail_tokens: 0 ", 1), "a prompt needs at least one token"),
    ("NaN popularity weight", _replace("  prefixes: 7\n", "  prefixes: 2\n  popularity: weights\n  weights: [1, .nan]\n"),
     "finite number"),
    ("infinite router hop", _replace("  router_hop_s: 0.0005", "  router_hop_s: .inf"), "cluster.router_hop_s"),
    ("infinite KV bytes", _replace("  kv_bytes_per_token: 114688", "  kv_bytes_per_token: .inf"), "kv_bytes_per_token"),
    ("not a mapping", lambda t: "- just\n- a list\n", "a scenario is a YAML mapping"),
    ("broken YAML", lambda t: t + "\n  : : [\n", "not valid YAML"),
    ("infinite SLO", lambda t: t + "\nslo: {ttft_ms: .inf}\n", "slo"),
]


def _one_line_error(result, expected: str) -> None:
    assert result.exit_code != 0
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    lines = [line for line in result.output.strip().splitlines() if line.strip()]
    assert lines and lines[-1].startswith("Error:"), result.output
    assert expected in lines[-1], lines[-1]


@pytest.mark.parametrize("case, mutate, expected", SCENARIO_CASES, ids=[c[0] for c in SCENARIO_CASES])
def test_a_bad_scenario_file_is_one_line_error(tmp_path, case, mutate, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(mutate(BASE))
    result = CliRunner().invoke(main, ["run", str(path)])
    _one_line_error(result, expected)


def test_a_binary_scenario_file_is_one_line_error(tmp_path):
    path = tmp_path / "bin.yaml"
    path.write_bytes(b"seed: 0\n\xff\xfe\x00garbage\n")
    _one_line_error(CliRunner().invoke(main, ["run", str(path)]), "not a UTF-8 text file")


ROUTER_CASES = [
    ("kv-aware:temperature=.inf", "temperature"),
    ("kv-aware:prefill_load_scale=.nan", "prefill_load_scale"),
    ("kvsim:load_factor=.inf", "load_factor"),
    ("prefix-hash:load_factor=0.5", "load_factor"),
    ("kvsim:processing_s=-1", "processing_s"),
    ("kvsim:bogus=1", "bogus"),
]


@pytest.mark.parametrize("spec, expected", ROUTER_CASES, ids=[c[0] for c in ROUTER_CASES])
def test_bad_router_options_are_a_usage_error(spec, expected):
    result = CliRunner().invoke(main, ["run", "--prefixes", "2", "--router", spec])
    assert result.exit_code == 2
    _one_line_error(result, expected)


def test_written_files_get_the_umask_mode_not_0600(tmp_path):
    old = os.umask(0o022)
    try:
        result = CliRunner().invoke(main, ["run", "--prefixes", "2", "--out", str(tmp_path / "out")])
    finally:
        os.umask(old)
    assert result.exit_code == 0, result.output
    for name in ("summary.csv", "requests.csv"):
        assert stat.S_IMODE((tmp_path / "out" / name).stat().st_mode) == 0o644


def test_schema_is_the_scenario_json_schema():
    import json

    import yaml

    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == 0
    schema = json.loads(result.output)
    assert schema["additionalProperties"] is False
    assert set(yaml.safe_load(BASE)) <= set(schema["properties"])
