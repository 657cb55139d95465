"""The package layering of `sim` and `policies` (pyproject.toml `[tool.importlinter]`), checked by import-linter.

The contracts: the layers (`sim.cli` > `sim.studies` > `sim.servers` > `sim.replay` > `sim.runner` > `policies |
sim.cluster` > `sim.scenario` > `sim.results` > `sim.routing` > `sim.timing` > `sim.engines` > `sim.workloads` >
`sim.config | sim.csv_fields`: no upward import, no cycle between packages); vLLM and SGLang independent; engines
reached from outside only through their interface and registry; policies importing only sim's types; no import cycle
between the sibling modules of any package. Each contract is shown to fail on a copy of the code that breaks it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO


def lint(root: Path) -> subprocess.CompletedProcess:
    """import-linter over the packages found first on the path at `root`, with the repository's contracts."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
         "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_the_code_keeps_every_contract():
    result = lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "5 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("module", "line", "broken"), [
    ("sim/workloads/request.py", "import sim.cluster.cluster", "no upward import"),
    ("sim/engines/interface.py", "from sim.scenario import Scenario", "no upward import"),
    ("policies/round_robin.py", "from sim.cluster.worker import Worker", "a router never reaches into a worker"),
    ("sim/engines/vllm/block_pool.py", "import sim.engines.sglang.radix_cache", "import nothing of each other"),
    ("sim/studies/validate.py", "from sim.engines.vllm.behaviour import parse_version", "only through its interface"),
    ("sim/cluster/device.py", "import sim.cluster.worker", "no cycle between the modules"),
], ids=["workloads->cluster", "engines->scenario", "policy->worker", "vllm->sglang", "study->engine-internals",
        "cycle-in-cluster"])
def test_a_copy_that_breaks_a_contract_fails(tmp_path, module, line, broken):
    for package in ("sim", "policies"):
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / module
    text = target.read_text()
    head, sep, rest = text.partition("from __future__ import annotations\n")
    target.write_text(head + sep + line + "\n" + rest)
    result = lint(tmp_path)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout and broken in " ".join(result.stdout.split())
