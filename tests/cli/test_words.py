"""What the output's words mean: one symbol per quantity, and both hit rates explained wherever both are shown.

C is the KV capacity in prompts per worker (the formula min(1, C/N), 3.95 for the reference worker); concurrency is
written `concurrency` (`conc` in a narrow header, explained under the table), never C.
"""

from __future__ import annotations

import csv
import re

from click.testing import CliRunner

from sim.cli import main
from tests.support.paths import REPO, TRACES

C_IN_A_FORMAT = re.compile(r"\bC ?= ?\{([^}]*)\}")
CONCURRENCY_AS_C = re.compile(r"\bC ?= ?\d")


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_every_title_or_label_the_code_formats_as_c_is_a_capacity():
    found = []
    for path in sorted((REPO / "sim").rglob("*.py")):
        for m in C_IN_A_FORMAT.finditer(path.read_text(encoding="utf-8")):
            if "capacity" not in m.group(1):
                found.append(f"{path.relative_to(REPO)}: {m.group(0)}")
    assert not found, "C is the KV capacity in prompts per worker; write concurrency as `concurrency`:\n" + "\n".join(found)


C_AS_A_WHOLE_NUMBER = re.compile(r"\bC ?= ?\d+\b(?![.,]\d)")
LRU_SIZES = "C = 100 / 1,000 / 10,000"  # docs/commands/plan.md: Che's check, C the LRU's size in objects


def test_the_docs_never_write_concurrency_as_c():
    """A whole-number C in the README, the docs, the notebooks or the benchmarks' READMEs is a concurrency (C = 8)
    beside the formula's C = 3.95 prompts per worker."""
    files = [REPO / "README.md", *(REPO / "docs").rglob("*.md"), *(REPO / "notebooks").glob("*.ipynb"),
             *(REPO / "benchmarks").rglob("*.md"), *(REPO / "tests" / "fixtures").rglob("README.md")]
    found = [f"{path.relative_to(REPO)}: {m.group(0)}" for path in files
             for m in C_AS_A_WHOLE_NUMBER.finditer(path.read_text(encoding="utf-8").replace(LRU_SIZES, ""))]
    assert not found, "write concurrency as `concurrency` (C is the prompts per worker):\n" + "\n".join(found)


def test_run_names_concurrency_and_says_what_c_and_each_hit_rate_are():
    res = invoke("run", "--prefixes", "7", "--workers", "3", "--concurrency", "4")
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "concurrency=4" in text and not CONCURRENCY_AS_C.search(text.replace("C = 3.95", ""))
    assert "C = 3.95 prompts per worker" in text
    assert "request_hit_rate: share of requests with any cached prefix token" in text
    assert "token_hit_rate: cached / prompt tokens" in text


def test_the_sweep_explains_its_narrow_headers_and_its_c():
    res = invoke("sweep", "--prefixes", "2", "--workers", "3", "--concurrency", "4", "--jobs", "1")
    assert res.exit_code == 0, res.output
    text = " ".join(res.output.split())
    assert "conc: concurrency (requests in flight)" in text
    assert "hit rate: share of requests with any cached prefix token; token hit: cached / prompt tokens" in text
    assert "formula: min(1, C/N), C = 3.95 prompts per worker" in text


def test_replay_explains_a_request_hit_rate_near_1_beside_a_low_reuse(tmp_path):
    """The conversation trace's 400 first requests on 2 workers: every request starts with block 0, so only the
    first request each worker serves misses: request hit rate 1 - 2/400, with a reuse of a few percent."""
    res = invoke("replay", str(TRACES / "conversation_head400.jsonl"), "--workers", "2", "--kv-tokens", "300000",
                 "--jobs", "1", "--out", str(tmp_path))
    assert res.exit_code == 0, res.output
    row = next(csv.DictReader((tmp_path / "summary.csv").open()))
    assert float(row["request_hit_rate"]) == 1 - 2 / 400 and float(row["prefix_reuse"]) < 0.1
    text = " ".join(res.output.split())
    assert "request_hit_rate: share of requests with any cached prefix token" in text
    assert "prefix_reuse = token_hit_rate: cached / prompt tokens" in text
    assert "starts with block 0" in text and "only the first request each worker serves misses" in text


def test_the_vllm_version_default_says_why_it_is_not_the_release_the_oracle_checks():
    """The default is the reference experiment's release, 0.31.0; kvsim is checked against 0.33.0: the field says
    both, and that the two follow the same rules (which the behaviour table holds)."""
    from sim.engines.vllm.behaviour import DEFAULT_VLLM_VERSION, VllmBehaviour
    from sim.engines.vllm.spec import VllmEngineSpec

    field = VllmEngineSpec.model_fields["vllm_version"]
    assert field.default == DEFAULT_VLLM_VERSION == "0.31.0"
    assert "the release the reference experiment ran" in field.description and "0.33.0" in field.description
    assert VllmBehaviour.for_version(DEFAULT_VLLM_VERSION) == VllmBehaviour.for_version("0.33.0")
    res = invoke("engines")
    assert "0.31.0, is the release the reference experiment ran" in " ".join(res.output.split())
