"""A scenario file that is wrong says where and why: every problem on its own line (one problem: one line), each
with the file, line and column of the key; an unknown key names the nearest valid one of its section (the selected
engine's, the router's options), and an unknown key beside a missing required one is called the missing one
misspelt. Router names and options in the file are checked at load, with their lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.scenario import ScenarioError, load_scenario

SMALL = """\
name: small
model:
  kv_bytes_per_token: 114688
engine:
  kind: vllm
  kv_cache_bytes: 1073741824
workload:
  prefixes: 2
  prefix_tokens: 256
  tail_tokens: 32
  output_tokens: 8
  min_requests: 20
  requests_per_prefix: 0
  concurrency: 2
router:
  name: random
cluster:
  workers: 2
"""


def edit(*changes: tuple[str, str], add: str = "") -> str:
    text = SMALL
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new, 1)
    return text + add


def error_lines(tmp_path, text: str) -> tuple[str, list[str]]:
    """(the file's path, the lines of the error `kvsim run FILE` prints): exit 1, no traceback."""
    path = tmp_path / "s.yaml"
    path.write_text(text)
    res = CliRunner().invoke(main, ["run", str(path)])
    assert res.exit_code == 1 and "Traceback" not in res.output, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit), res.exception
    lines = res.output.rstrip("\n").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("Error:"))
    return str(path), lines[start:]


def test_the_small_scenario_is_valid(tmp_path):
    (tmp_path / "s.yaml").write_text(SMALL)
    assert load_scenario(tmp_path / "s.yaml")[0].name == "small"


def test_a_misspelt_required_key_is_named_with_its_line_and_as_the_missing_one(tmp_path):
    f, lines = error_lines(tmp_path, edit(("  kv_cache_bytes:", "  kv_cach_bytes:")))
    assert lines == [
        f"Error: {f}: 2 problems",
        f"  {f}:4:1: engine.kv_cache_bytes: Field required; probably given misspelt, as kv_cach_bytes",
        f"  {f}:6:3: engine.kv_cach_bytes: unknown key; probably the required kv_cache_bytes, misspelt",
    ]


def test_every_problem_is_shown_in_the_order_of_the_file(tmp_path):
    f, lines = error_lines(tmp_path, edit(("  workers: 2", "  workers: 0"), ("  concurrency:", "  concurency:"),
                                          ("  min_requests:", "  min_request:")))
    assert lines == [
        f"Error: {f}: 3 problems",
        f"  {f}:12:3: workload.min_request: unknown key; did you mean min_requests?",
        f"  {f}:14:3: workload.concurency: unknown key; did you mean concurrency?",
        f"  {f}:18:3: cluster.workers: Input should be greater than or equal to 1",
    ]


@pytest.mark.parametrize("engine, key, nearest", [("vllm", "block_sise", "block_size"),
                                                  ("vllm", "max_num_seq", "max_num_seqs"),
                                                  ("sglang", "page_sise", "page_size"),
                                                  ("sglang", "chunked_prefil_size", "chunked_prefill_size")])
def test_an_unknown_engine_key_suggests_the_selected_engines_field(tmp_path, engine, key, nearest):
    f, lines = error_lines(tmp_path, edit(("  kind: vllm", f"  kind: {engine}\n  {key}: 16")))
    assert lines == [f"Error: {f}:6:3: engine.{key}: unknown key; did you mean {nearest}?"]


def test_an_unknown_key_with_no_near_field_lists_the_sections_fields(tmp_path):
    f, lines = error_lines(tmp_path, edit(add="  colour: blue\n"))
    assert lines == [f"Error: {f}:19:3: cluster.colour: unknown key; allowed: workers, deployments, default_device, "
                     f"router_hop_s, request_overhead_s, response_overhead_s, reuse_breakdown"]


def test_an_unknown_engine_kind_suggests_the_nearest(tmp_path):
    f, lines = error_lines(tmp_path, edit(("  kind: vllm", "  kind: vlm")))
    assert lines == [f"Error: {f}:5:3: engine.kind: unknown engine 'vlm'; did you mean vllm?"]


def test_a_value_in_a_list_is_placed_at_its_item(tmp_path):
    f, lines = error_lines(tmp_path, edit(add="  deployments:\n    - workers: 2\n      devices:\n"
                                              "        - {name: a, workers: 1}\n        - {name: b, workers: 1, speed: 0}\n"))
    assert lines == [f"Error: {f}:23:33: cluster.deployments.0.devices.1.speed: Input should be greater than 0"]


def test_a_value_of_the_wrong_type_for_a_length_is_one_problem(tmp_path):
    f, lines = error_lines(tmp_path, edit(("  tail_tokens: 32", "  tail_tokens: many")))
    assert lines == [f"Error: {f}:10:3: workload.tail_tokens: Input should be a valid integer, unable to parse "
                     f"string as an integer; or Input should be a valid dictionary or instance of LengthSpec"]


def test_a_length_distribution_is_judged_as_one(tmp_path):
    f, lines = error_lines(tmp_path, edit(("  tail_tokens: 32", "  tail_tokens: {kind: uniform, lw: 8, high: 64}")))
    assert lines == [
        f"Error: {f}: 2 problems",
        f"  {f}:10:3: workload.tail_tokens.low: Field required; probably given misspelt, as lw",
        f"  {f}:10:32: workload.tail_tokens.lw: unknown key; probably the required low, misspelt",
    ]


@pytest.mark.parametrize("router, expected", [
    ("router:\n  name: kv-awre", "16:3: router.name: unknown router 'kv-awre'; did you mean kv-aware?"),
    ("router:\n  name: kv-aware\n  options:\n    temprature: 2",
     "18:5: router.options.temprature: unknown option of kv-aware; did you mean temperature?"),
    ("router:\n  name: p2c\n  options: {event_loss: 0.5}",
     "17:13: router.options.event_loss: unknown option of p2c; allowed: replicas, processing_s, scrape_interval_s"),
    ("router:\n  name: kv-aware\n  options:\n    state: eventz",
     "18:5: router.options.state: Input should be 'exact', 'events' or 'approximate'"),
    ('router: "kv-aware:bogus=1"', "15:1: router.options.bogus: unknown option of kv-aware; allowed: replicas, "),
])
def test_router_errors_from_a_file_name_the_file_and_line(tmp_path, router, expected):
    f, lines = error_lines(tmp_path, edit(("router:\n  name: random", router)))
    assert len(lines) == 1 and lines[0].startswith(f"Error: {f}:{expected}"), lines


def test_router_problems_are_listed_with_the_others(tmp_path):
    f, lines = error_lines(tmp_path, edit(("  name: random", "  name: kv-awre"), ("  concurrency:", "  concurency:")))
    assert lines == [
        f"Error: {f}: 2 problems",
        f"  {f}:14:3: workload.concurency: unknown key; did you mean concurrency?",
        f"  {f}:16:3: router.name: unknown router 'kv-awre'; did you mean kv-aware?",
    ]


def test_an_engine_option_for_another_engine_is_placed_at_its_line(tmp_path):
    f, lines = error_lines(tmp_path, edit(add="engine_options:\n  sglang:\n    chunked_prefil_size: 2048\n"))
    assert lines == [f"Error: {f}:21:5: engine_options.sglang.chunked_prefil_size: unknown option; did you mean "
                     f"chunked_prefill_size?"]


def test_a_problem_of_the_whole_scenario_names_the_file_and_no_key(tmp_path):
    f, lines = error_lines(tmp_path, edit(("  kv_cache_bytes: 1073741824", "  kv_cache_bytes: 1000000000000000000")))
    assert len(lines) == 1 and lines[0].startswith(f"Error: {f}: too big to simulate: "), lines


@pytest.mark.parametrize("add, expected", [
    ("name: again\n", ":19:1: not valid YAML: duplicate key 'name'"),
    ("seed: [1, 2\n", r":20:1: not valid YAML: expected ',' or ']', but got '<stream end>'"),
])
def test_a_yaml_error_names_the_line(tmp_path, add, expected):
    f, lines = error_lines(tmp_path, edit(add=add))
    assert lines == [f"Error: {f}{expected}"]


def test_a_scenario_not_from_a_file_says_what_it_was_made_from_and_every_problem(tmp_path):
    (tmp_path / "s.yaml").write_text(SMALL)
    scenario, _ = load_scenario(tmp_path / "s.yaml")
    with pytest.raises(ScenarioError) as err:
        scenario.with_overrides(**{"workload.concurrency": 0, "cluster.workers": 0})
    assert str(err.value).splitlines() == [
        "scenario 'small' with {'workload.concurrency': 0, 'cluster.workers': 0}: 2 problems",
        "  workload.concurrency: Input should be greater than or equal to 1",
        "  cluster.workers: Input should be greater than or equal to 1",
    ]


def test_the_api_checks_routers_only_when_asked(tmp_path):
    from sim.runner import router_problems

    (tmp_path / "s.yaml").write_text(edit(("  name: random", "  name: kv-awre")))
    assert load_scenario(tmp_path / "s.yaml")[0].router.name == "kv-awre"  # sim.scenario cannot see the routers
    with pytest.raises(ScenarioError, match=re.escape(":16:3: router.name: unknown router 'kv-awre'")):
        load_scenario(tmp_path / "s.yaml", checks=(router_problems,))


def test_the_errors_docs_scenarios_md_shows_are_what_kvsim_prints(tmp_path, monkeypatch):
    from tests.support.paths import REPO

    doc = (REPO / "docs" / "scenarios.md").read_text()
    shown = re.findall(r"```\n(Error: my\.yaml.*?)\n```", doc, re.S)
    exported = CliRunner().invoke(main, ["scenarios", "export", "service-baseline"]).output
    monkeypatch.chdir(tmp_path)
    printed = []
    for changes in ((("  kv_cache_bytes:", "  kv_cach_bytes:"), ("  concurrency: 8", "  concurency: 8")),
                    (("router:\n  name: random", "router:\n  name: kv-aware\n  options:\n    temprature: 2"),)):
        text = exported
        for old, new in changes:
            assert old in text, old
            text = text.replace(old, new, 1)
        Path("my.yaml").write_text(text)
        res = CliRunner().invoke(main, ["run", "my.yaml"])
        printed.append(res.output[res.output.index("Error:"):].rstrip("\n"))
    assert shown == printed
