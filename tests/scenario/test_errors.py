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


# (case, the edit of SMALL, the lines of the error with F for the file): every problem, in the file's order
SEVERAL_CASES = [
    ("a misspelt required key is called the missing one", [("  kv_cache_bytes:", "  kv_cach_bytes:")], [
        "Error: F: 2 problems",
        "  F:4:1: engine.kv_cache_bytes: Field required; probably given misspelt, as kv_cach_bytes",
        "  F:6:3: engine.kv_cach_bytes: unknown key; probably the required kv_cache_bytes, misspelt"]),
    ("three sections", [("  workers: 2", "  workers: 0"), ("  concurrency:", "  concurency:"),
                        ("  min_requests:", "  min_request:")], [
        "Error: F: 3 problems",
        "  F:12:3: workload.min_request: unknown key; did you mean min_requests?",
        "  F:14:3: workload.concurency: unknown key; did you mean concurrency?",
        "  F:18:3: cluster.workers: Input should be greater than or equal to 1"]),
    ("a length distribution is judged as one", [("  tail_tokens: 32", "  tail_tokens: {kind: uniform, lw: 8, high: 64}")], [
        "Error: F: 2 problems",
        "  F:10:3: workload.tail_tokens.low: Field required; probably given misspelt, as lw",
        "  F:10:32: workload.tail_tokens.lw: unknown key; probably the required low, misspelt"]),
    ("the router's among the others", [("  name: random", "  name: kv-awre"), ("  concurrency:", "  concurency:")], [
        "Error: F: 2 problems",
        "  F:14:3: workload.concurency: unknown key; did you mean concurrency?",
        "  F:16:3: router.name: unknown router 'kv-awre'; did you mean kv-aware?"]),
]


@pytest.mark.parametrize("case, changes, expected", SEVERAL_CASES, ids=[c[0] for c in SEVERAL_CASES])
def test_several_problems_are_a_summary_line_then_one_line_each(tmp_path, case, changes, expected):
    f, lines = error_lines(tmp_path, edit(*changes))
    assert lines == [line.replace("F", f, 1) if line.startswith("Error: F") else line.replace("  F:", f"  {f}:", 1)
                     for line in expected]


_ROUTER = "router:\n  name: random"

# (case, the edit of SMALL: (old, new) pairs and text to add, the one line after "Error: FILE"; "..." ends a prefix)
ONE_LINE_CASES = [
    ("vllm's own key", [("  kind: vllm", "  kind: vllm\n  block_sise: 16")], "",
     ":6:3: engine.block_sise: unknown key; did you mean block_size?"),
    ("vllm's own key, plural", [("  kind: vllm", "  kind: vllm\n  max_num_seq: 16")], "",
     ":6:3: engine.max_num_seq: unknown key; did you mean max_num_seqs?"),
    ("sglang's own key", [("  kind: vllm", "  kind: sglang\n  page_sise: 16")], "",
     ":6:3: engine.page_sise: unknown key; did you mean page_size?"),
    ("sglang's own key, long", [("  kind: vllm", "  kind: sglang\n  chunked_prefil_size: 16")], "",
     ":6:3: engine.chunked_prefil_size: unknown key; did you mean chunked_prefill_size?"),
    ("no near field", [], "  colour: blue\n",
     ":19:3: cluster.colour: unknown key; allowed: workers, deployments, default_device, router_hop_s, "
     "request_overhead_s, response_overhead_s, reuse_breakdown, disaggregation, autoscaling"),
    ("unknown engine", [("  kind: vllm", "  kind: vlm")], "", ":5:3: engine.kind: unknown engine 'vlm'; did you mean vllm?"),
    ("a list item", [], "  deployments:\n    - workers: 2\n      devices:\n        - {name: a, workers: 1}\n"
                        "        - {name: b, workers: 1, speed: 0}\n",
     ":23:33: cluster.deployments.0.devices.1.speed: Input should be greater than 0"),
    ("a length of the wrong type is one problem", [("  tail_tokens: 32", "  tail_tokens: many")], "",
     ":10:3: workload.tail_tokens: Input should be a valid integer, unable to parse string as an integer; or Input "
     "should be a valid dictionary or instance of LengthSpec"),
    ("another engine's option", [], "engine_options:\n  sglang:\n    chunked_prefil_size: 2048\n",
     ":21:5: engine_options.sglang.chunked_prefil_size: unknown option; did you mean chunked_prefill_size?"),
    ("the whole scenario, no key", [("  kv_cache_bytes: 1073741824", "  kv_cache_bytes: 1000000000000000000")], "",
     ": too big to simulate: ..."),
    ("duplicate key", [], "name: again\n", ":19:1: not valid YAML: duplicate key 'name'"),
    ("YAML syntax", [], "seed: [1, 2\n", ":20:1: not valid YAML: expected ',' or ']', but got '<stream end>'"),
    # the router's name and options, checked as the file is read
    ("unknown router", [(_ROUTER, "router:\n  name: kv-awre")], "",
     ":16:3: router.name: unknown router 'kv-awre'; did you mean kv-aware?"),
    ("misspelt router option", [(_ROUTER, "router:\n  name: kv-aware\n  options:\n    temprature: 2")], "",
     ":18:5: router.options.temprature: unknown option of kv-aware; did you mean temperature?"),
    ("another router's option", [(_ROUTER, "router:\n  name: p2c\n  options: {event_loss: 0.5}")], "",
     ":17:13: router.options.event_loss: unknown option of p2c; allowed: replicas, processing_s, scrape_interval_s, ..."),
    ("bad router option value", [(_ROUTER, "router:\n  name: kv-aware\n  options:\n    state: eventz")], "",
     ":18:5: router.options.state: Input should be 'exact', 'events' or 'approximate'"),
    ("router spec text", [(_ROUTER, 'router: "kv-aware:bogus=1"')], "",
     ":15:1: router.options.bogus: unknown option of kv-aware; allowed: replicas, processing_s, ..."),
]


@pytest.mark.parametrize("case, changes, add, expected", ONE_LINE_CASES, ids=[c[0] for c in ONE_LINE_CASES])
def test_one_problem_is_one_line_naming_the_file_line_and_column(tmp_path, case, changes, add, expected):
    f, lines = error_lines(tmp_path, edit(*changes, add=add))
    assert len(lines) == 1, lines
    if expected.endswith("..."):
        assert lines[0].startswith(f"Error: {f}{expected[:-3]}"), lines[0]
    else:
        assert lines[0] == f"Error: {f}{expected}"


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
