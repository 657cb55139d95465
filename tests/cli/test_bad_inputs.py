"""Bad input never breaks kvsim: each case is a one-line error naming the culprit, a non-zero exit, no traceback,
and nothing hangs (every number that reaches the event loop is finite). Table-driven: a scenario file mutated one
way at a time, and router options."""

from __future__ import annotations

import os
import re
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
    ("duplicate key", lambda t: t + "\nseed: 1\n", "not valid YAML: duplicate key 'seed'"),
    ("duplicate nested key", _replace("  block_size: 16\n", "  block_size: 16\n  block_size: 32\n"),
     "duplicate key 'block_size'"),
    ("infinite step time", _replace("  step_overhead_s: 0.002001847719406711", "  step_overhead_s: .inf"),
     "time_model.step_overhead_s: Input should be a finite number"),
    ("NaN step time", _replace("  step_overhead_s: 0.002001847719406711", "  step_overhead_s: .nan"),
     "time_model.step_overhead_s"),
    ("efficiency above the peak", _replace("  memory_efficiency: 0.9964827516155794", "  memory_efficiency: 1.2"),
     "time_model.memory_efficiency: Input should be less than or equal to 1"),
    ("unknown hardware", _replace("hardware: rtx-4070-laptop ", "hardware: gtx-480 "),
     "time_model.hardware: unknown hardware 'gtx-480'; allowed: rtx-4060-laptop"),
    ("unknown device hardware", _replace("hardware: rtx-3090, sharing", "hardware: rtx-9090, sharing"),
     "cluster.deployments.0.devices.0.hardware: unknown hardware 'rtx-9090'; allowed:"),
    ("unknown model config", _replace("  config: Qwen3-0.6B ", "  config: Qwen9-1T "),
     "model: model config 'Qwen9-1T': neither a shipped model (Llama-3.1-70B, Llama-3.1-8B, Qwen2.5-72B, Qwen3-0.6B)"),
    ("infinite device speed", _replace("{name: laptop-8gb-b, workers: 1}\n    - workers: 3",
                                       "{name: laptop-8gb-b, workers: 1, speed: .inf}\n    - workers: 3"),
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
    error = result.output.strip().splitlines()[-1]
    assert re.match(rf"Error: {re.escape(str(path))}(:\d+:\d+)?: ", error), error  # the file, and its line


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
    ("kvsim:bogus=1", "kvsim:bogus=1: bogus: unknown option of kvsim; allowed: replicas, processing_s, state"),
    ("kvsim:load_factr=1", "kvsim:load_factr=1: load_factr: unknown option of kvsim; did you mean load_factor?"),
    ("kvsim:load_factr=1,processing_s=-1", "processing_s: Input should be greater than or equal to 0; load_factr: "
                                          "unknown option of kvsim; did you mean load_factor?"),
    ("kv-awre", "unknown router kv-awre; did you mean kv-aware?"),
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


# ---- run CSV + sidecar, Mooncake traces, measured CSV, CLI options ----------------------------------------------

import json as _json

from tests.support.paths import FIXTURES

_RUN = FIXTURES / "real-vllm" / "w2-n7-c4"
_RUN_LINES = _RUN.with_suffix(".csv").read_text().splitlines()
_RUN_SETUP = _json.loads(_RUN.with_suffix(".json").read_text())


def _cell(line: int, col: str, value: str):
    def mutate(lines):
        cells = lines[line].split(",")
        cells[_RUN_LINES[0].split(",").index(col)] = value
        return [*lines[:line], ",".join(cells), *lines[line + 1:]]
    return mutate


def _setup(**changes):
    return lambda setup: {k: v for k, v in {**setup, **changes}.items() if v is not None}


# (case, how the CSV lines change, how the sidecar changes (or its raw text), what the error must say)
RUN_CASES = [
    ("duplicate request_id", _cell(3, "request_id", "1"), None, "column request_id: 1 is already on line 3"),
    ("cached > prompt", _cell(3, "cached_tokens", "9999"), None, "cached_tokens: 9999 > prompt_tokens 612"),
    ("prefix outside the run", _cell(3, "prefix_id", "99"), None, "not one of the run's 7 prefixes"),
    ("negative prefix", _cell(3, "prefix_id", "-1"), None, "prefix_id: -1 must be >= 0"),
    ("end before start", _cell(3, "end_s", "0.0001"), None, "end_s: 0.0001 is before start_s"),
    ("negative TTFT", _cell(3, "ttft_ms", "-5"), None, "ttft_ms: -5 must be >= 0"),
    ("NaN TTFT", _cell(3, "ttft_ms", "nan"), None, "ttft_ms: 'nan': give a finite number"),
    ("infinite e2e", _cell(3, "e2e_ms", "inf"), None, "e2e_ms: 'inf'"),
    ("NaN start", _cell(3, "start_s", "nan"), None, "start_s: 'nan'"),
    ("negative start", _cell(3, "start_s", "-3"), None, "start_s: -3 must be >= 0"),
    ("worker outside the run", _cell(3, "worker", "7"), None, "not one of the run's 2 workers"),
    ("non-numeric tokens", _cell(3, "prompt_tokens", "many"), None, "'many' is not a whole number"),
    ("prompt over max_model_len", _cell(3, "prompt_tokens", "5000"), None, "exceeds the sidecar's max_model_len 2464"),
    ("prompt over the scenario's limit", _cell(3, "prompt_tokens", "5000"), _setup(max_model_len=None),
     "exceeds the 2464 tokens a worker of the scenario accepts"),
    ("missing column", lambda ls: [",".join(line.split(",")[1:]) for line in ls], None, "missing required column 'request_id'"),
    ("empty file", lambda ls: [], None, "missing required column"),
    ("header only", lambda ls: ls[:1], None, "no rows"),
    ("sidecar not JSON", None, "{not json", "not valid JSON"),
    ("sidecar a list", None, "[1, 2]", "(top level)"),
    ("sidecar workers 0", None, _setup(workers=0), "workers: Input should be greater than or equal to 1"),
    ("sidecar absurd blocks", None, _setup(num_gpu_blocks=10**15), "too big to simulate"),
]


@pytest.mark.parametrize("case, lines, setup, expected", RUN_CASES, ids=[c[0] for c in RUN_CASES])
def test_a_bad_run_file_is_one_line_error(tmp_path, case, lines, setup, expected):
    csv_path = tmp_path / "run.csv"
    csv_path.write_text("\n".join((lines or (lambda ls: ls))(_RUN_LINES)) + "\n")
    side = _json.dumps(setup(_RUN_SETUP)) if callable(setup) else (setup or _json.dumps(_RUN_SETUP))
    (tmp_path / "run.json").write_text(side)
    _one_line_error(CliRunner().invoke(main, ["validate", str(csv_path)]), expected)


@pytest.mark.parametrize("what, name", [("CSV", "run.csv"), ("sidecar", "run.json")])
def test_a_binary_run_file_is_one_line_error(tmp_path, what, name):
    (tmp_path / "run.csv").write_text("\n".join(_RUN_LINES) + "\n")
    (tmp_path / "run.json").write_text(_json.dumps(_RUN_SETUP))
    (tmp_path / name).write_bytes(b"\xff\xfe\x00\x01garbage")
    _one_line_error(CliRunner().invoke(main, ["validate", str(tmp_path / "run.csv")]), "not a UTF-8 text file")


def test_a_missing_sidecar_is_one_line_error(tmp_path):
    (tmp_path / "run.csv").write_text("\n".join(_RUN_LINES) + "\n")
    _one_line_error(CliRunner().invoke(main, ["validate", str(tmp_path / "run.csv")]), "missing sidecar run.json")


_OK = '{"timestamp": 0, "input_length": 600, "output_length": 6, "hash_ids": [0, 1]}'
TRACE_CASES = [
    ("infinite timestamp", [_OK, _OK.replace("0,", "Infinity,", 1)], ":2: Infinity is not a number"),
    ("NaN timestamp", [_OK.replace("0,", "NaN,", 1)], ":1: NaN is not a number"),
    ("negative timestamp", [_OK.replace("0,", "-5,", 1)], ":1: field 'timestamp' must be a finite number of ms >= 0"),
    ("backwards", [_OK.replace("0,", "100,", 1), _OK], ":2: field 'timestamp' goes backwards"),
    ("negative output", [_OK.replace('"output_length": 6', '"output_length": -3')], "'output_length' must be >= 0"),
    ("negative input", [_OK.replace('"input_length": 600', '"input_length": -3')], "'input_length' must be >= 1"),
    ("empty", [], "no requests"),
    ("blank lines", ["", ""], "no requests"),
    ("not JSON", [_OK, "{oops"], ":2: not valid JSON"),
    ("not an object", [_OK, "[1, 2]"], ":2: expected a JSON object"),
    ("missing key", [_OK, '{"timestamp": 1}'], ":2: missing field 'input_length'"),
    ("hash_ids of strings", [_OK.replace("[0, 1]", '["a", "b"]')], "'hash_ids' must hold non-negative integers"),
    ("hash_ids not a list", [_OK.replace("[0, 1]", "7")], "'hash_ids' must be a list"),
    ("hash_ids too few", [_OK.replace("[0, 1]", "[0]")], "needs ceil(600/512) = 2"),
]


@pytest.mark.parametrize("command", ["replay", "compare"])
@pytest.mark.parametrize("case, lines, expected", TRACE_CASES, ids=[c[0] for c in TRACE_CASES])
def test_a_bad_trace_is_one_line_error(tmp_path, command, case, lines, expected):
    path = tmp_path / "t.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    args = ["replay", str(path)] if command == "replay" else ["compare", "--trace", str(path)]
    _one_line_error(CliRunner().invoke(main, [*args, "--workers", "2"]), expected)


def test_a_binary_trace_is_one_line_error(tmp_path):
    path = tmp_path / "t.jsonl"
    path.write_bytes(b"\xff\xfe\x00\x01")
    _one_line_error(CliRunner().invoke(main, ["replay", str(path), "--workers", "2"]), ":1: not UTF-8 text")


_H = "workers,prefixes,concurrency,metric,value,unit,aggregation"
MEASURED_CASES = [
    ("missing column", ["workers,prefixes,metric,value", "6,2,ttft_p50,40"], "missing column(s) concurrency"),
    ("not a number", [_H, "6,2,4,ttft_p50,abc,ms,median"], ":2: column value: 'abc' is not a number"),
    ("NaN", [_H, "6,2,4,ttft_p50,nan,ms,median"], "column value: 'nan': give a finite number"),
    ("infinite", [_H, "6,2,4,ttft_p50,inf,ms,median"], "give a finite number"),
    ("negative", [_H, "6,2,4,ttft_p50,-4,ms,median"], "column value: -4 must be >= 0"),
    ("unknown metric", [_H, "6,2,4,ttft_p77,40,ms,median"], "unknown metric 'ttft_p77'; allowed: request_hit_rate"),
    ("duplicate row", [_H, "6,2,4,ttft_p50,40,ms,median", "6,2,4,ttft_p50,41,ms,median"], ":3: duplicate row"),
    ("zero workers", [_H, "0,2,4,ttft_p50,40,ms,median"], "column workers: 0 must be >= 1"),
    ("short row", [_H, "6,2"], "column concurrency: missing value"),
    ("no rows", [_H], "no rows"),
]


@pytest.mark.parametrize("case, lines, expected", MEASURED_CASES, ids=[c[0] for c in MEASURED_CASES])
def test_a_bad_measured_csv_is_one_line_error(tmp_path, case, lines, expected):
    (tmp_path / "m.csv").write_text("\n".join(lines) + "\n")
    (tmp_path / "s.yaml").write_text(BASE.replace("reference: reference/service-baseline.csv", "reference: m.csv"))
    result = CliRunner().invoke(main, ["sweep", "--scenario", str(tmp_path / "s.yaml"), "--prefixes", "2",
                                       "--workers", "6", "--concurrency", "4"])
    _one_line_error(result, expected)


def test_a_binary_measured_csv_is_one_line_error(tmp_path):
    (tmp_path / "m.csv").write_bytes(b"\xff\xfe\x00")
    result = CliRunner().invoke(main, ["calibrate", "--measured", str(tmp_path / "m.csv"), "--out",
                                       str(tmp_path / "x.yaml")])
    _one_line_error(result, "not a UTF-8 text file")


PLAN = ["plan", "capacity", "--prefixes", "2", "--target-hit-rate", "0.9", "--router", "random"]
OPTION_CASES = [
    (["sweep", "--prefixes", "2", "--router", "recorded"], 2, "recorded replays a recorded run's choices"),
    (["run", "--prefixes", "2", "--router", "recorded"], 2, "recorded replays a recorded run's choices"),
    (["tune", "--prefixes", "2", "--router", "recorded"], 2, "recorded replays a recorded run's choices"),
    ([*PLAN, "--vary", "workers", "--min", "0"], 2, "--vary workers takes whole numbers of workers >= 1"),
    ([*PLAN, "--vary", "workers", "--max", "2.5"], 2, "2.5: --vary workers takes whole numbers"),
    ([*PLAN, "--vary", "workers", "--min", "5", "--max", "2"], 2, "--min 5 is above --max 2"),
    ([*PLAN, "--vary", "kv-gib", "--min", "-1"], 2, "GiB of KV cache > 0"),
    ([*PLAN, "--vary", "kv-gib", "--max", "nan"], 2, "nan: give a finite number"),
    (["run", "--workers", "1000000000", "--prefixes", "2"], 1, "x 1000000000 workers needs about"),
    (["run", "--prefixes", "100000000"], 1, "too big to simulate"),
    (["sweep", "--workers", "1000000000", "--prefixes", "2"], 1, "too big to simulate"),
    (["run", "--prefixes", "2", "--concurrency", "1000000000"], 1, "workload.concurrency=1000000000 needs about"),
    (["run", "--prefixes", "2", "--slo", "ttft_ms=nan"], 2, "ttft_ms=nan: Input should be a finite number"),
    (["run", "--prefixes", "2", "--engine", "sglng"], 2, "unknown engine sglng; did you mean sglang?"),
    (["sweep", "--prefixes", "2", "--engine", "vllm,trtllm"], 2, "unknown engine trtllm; allowed: sglang, vllm"),
]


@pytest.mark.parametrize("args, exit_code, expected", OPTION_CASES, ids=[" ".join(c[0][:4]) + f" {i}"
                                                                          for i, c in enumerate(OPTION_CASES)])
def test_bad_options_are_refused_at_once(args, exit_code, expected):
    import time

    start = time.monotonic()
    result = CliRunner().invoke(main, args)
    assert time.monotonic() - start < 10
    assert result.exit_code == exit_code, result.output
    _one_line_error(result, expected)


SIZE_AND_VERSION_CASES = [
    ("absurd KV bytes", _replace("  kv_cache_bytes: 1073741824", "  kv_cache_bytes: 1000000000000000000"),
     "KV blocks per worker (engine.kv_cache_bytes) x 6 workers needs about"),
    ("absurd requests per prefix", _replace("  requests_per_prefix: 20", "  requests_per_prefix: 1000000000"),
     "too big to simulate"),
    ("vLLM too old", _replace('vllm_version: "0.31.0"', 'vllm_version: "0.9.0"'), "0.10.0 to 0.33.x"),
    ("vLLM too new", _replace('vllm_version: "0.31.0"', 'vllm_version: "0.34.0"'), "outside the releases"),
]


@pytest.mark.parametrize("case, mutate, expected", SIZE_AND_VERSION_CASES, ids=[c[0] for c in SIZE_AND_VERSION_CASES])
def test_absurd_sizes_and_unknown_versions_are_one_line_errors(tmp_path, case, mutate, expected):
    path = tmp_path / "bad.yaml"
    path.write_text(mutate(BASE))
    _one_line_error(CliRunner().invoke(main, ["run", str(path)]), expected)


def test_a_bad_memory_limit_in_the_environment_is_a_one_line_error():
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "sim.cli", "run", "--prefixes", "2"], capture_output=True, text=True,
                          env={**os.environ, "KVSIM_MAX_MEMORY_GIB": "lots"}, timeout=60)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == "Error: KVSIM_MAX_MEMORY_GIB='lots': give a number of GiB > 0"


OUT_CASES = [
    (["run", "--prefixes", "2", "--out", "/etc/passwd/x"], "--out /etc/passwd/x: not a writable directory"),
    (["replay", "TRACE", "--workers", "2", "--kv-tokens", "100000", "--out", "/etc/passwd/x"],
     "--out /etc/passwd/x: not a writable directory"),
    (["calibrate", "--out", "/etc/passwd/x.yaml"], "--out /etc/passwd/x.yaml: folder /etc/passwd"),
    (["calibrate", "--out", "OK/fitted.yaml", "--report", "/etc/passwd/r.csv"], "--report /etc/passwd/r.csv: folder"),
    (["validate", "RUN", "--out", "/etc/passwd/v.csv"], "--out /etc/passwd/v.csv: folder /etc/passwd"),
]


@pytest.mark.parametrize("args, expected", OUT_CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in OUT_CASES])
def test_an_unwritable_out_is_refused_before_any_work(tmp_path, args, expected):

    fixtures = FIXTURES
    subst = {"TRACE": str(fixtures / "traces" / "conversation_head400.jsonl"),
             "RUN": str(fixtures / "real-vllm" / "w2-n12-c1.csv"), "OK/fitted.yaml": str(tmp_path / "fitted.yaml")}
    result = CliRunner().invoke(main, [subst.get(a, a) for a in args])
    assert result.exit_code == 2
    _one_line_error(result, expected)


# --- k=v lists: one grammar (sim.config.key_values) for --slo, --tolerance, --holdout, router options, --space -------

def test_key_values_reads_a_k_v_list_in_order_and_refuses_what_is_not_one():
    from sim.config import key_value, key_values

    assert key_values(" ttft_ms = 200 ,, tpot_ms=50, ") == {"ttft_ms": "200", "tpot_ms": "50"}
    assert list(key_values("b=1,a=2")) == ["b", "a"] and key_values("") == {}
    assert key_value("prefixes=7,12") == ("prefixes", "7,12")  # one pair: commas belong to the value
    assert key_values("state=") == {"state": ""}  # an empty value is the caller's rule
    for text, message in (("a=1,b", "'b' is not KEY=V"), ("=1", "'=1' is not KEY=V"), ("a=1,a=2", "a: given twice")):
        with pytest.raises(ValueError, match=message):
            key_values(text, "KEY=V")


def test_tolerances_are_a_k_v_list_too():
    from sim.studies.validate import Tolerance

    hit, ttft = Tolerance.parse_list("request_hit_rate=0.03, ttft_p50_ms=25%")
    assert (hit.metric, hit.limit, hit.relative) == ("request_hit_rate", 0.03, False)
    assert (ttft.metric, ttft.limit, ttft.relative) == ("ttft_p50_ms", 0.25, True)
    with pytest.raises(ValueError, match="limit must be a number >= 0"):
        Tolerance.parse("request_hit_rate=nan")


KV_CASES = [
    (["run", "--slo", "ttft_ms=200,tpot_ms"], "'--slo': 'tpot_ms' is not KEY=MS with KEY one of ttft_ms, tpot_ms"),
    (["run", "--slo", "ttft_ms=1,ttft_ms=2"], "'--slo': ttft_ms: given twice"),
    (["sweep", "--prefixes", "2", "--router", "kv-aware:state=events,state=exact"],
     "'kv-aware:state=events,state=exact': option state: given twice"),
    (["run", "--router", "kv-aware:=1"], "option '=1' is not key=value (NAME or NAME:key=value,...)"),
    (["tune", "--space", "temperature=0:1,temperature=0:2"], "temperature: given twice"),
    (["tune", "--space", "temperature="], "temperature: no range or choices after '='"),
    (["validate", "RUN", "--tolerance", "request_hit_rate"],
     "'--tolerance': 'request_hit_rate' is not METRIC=LIMIT with METRIC one of request_hit_rate"),
    (["validate", "RUN", "--tolerance", "request_hit_rate=0.1,hit=2"], "hit=2: expected METRIC=LIMIT"),
    (["calibrate", "--out", "OK/fitted.yaml", "--holdout", "prefixes"],
     "'--holdout': 'prefixes' is not workers=..., prefixes=... or concurrency=..., e.g. prefixes=7,12"),
    (["calibrate", "--out", "OK/fitted.yaml", "--holdout", "seeds=1"], "'seeds=1' is not workers=..., prefixes="),
]


@pytest.mark.parametrize("args, expected", KV_CASES, ids=[" ".join(c[0][:1] + c[0][-2:]) for c in KV_CASES])
def test_a_bad_k_v_list_is_a_one_line_usage_error_naming_the_option(tmp_path, args, expected):
    subst = {"RUN": str(FIXTURES / "real-vllm" / "w2-n12-c1.csv"),
             "OK/fitted.yaml": str(tmp_path / "fitted.yaml")}
    result = CliRunner().invoke(main, [subst.get(a, a) for a in args])
    assert result.exit_code == 2, result.output
    _one_line_error(result, expected)
