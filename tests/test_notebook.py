"""The notebooks run top to bottom (so they cannot rot) and are stored without outputs."""

from __future__ import annotations

import json

import nbformat
import pytest
from nbclient import NotebookClient

from tests.support.paths import REPO

NOTEBOOKS = REPO / "notebooks"
# What each notebook must print once executed: a line of each of its analyses.
EXPECTED = {
    "capacity_planning.ipynb": ("GiB per worker", "block model", "GiB host KV per worker", "of host KV per worker"),
    "autoscaling_study.ipynb": ("GPU-hours", "of the fixed fleet's goodput", "first minute"),
    "router_study.ipynb": ("bound min(1, W·C/N)", "live", "mocker kv_router", "processing_s=0.01", "gap survival",
                           "P/D and tiers, best token hit"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_notebook_is_stored_without_outputs(name):
    nb = json.loads((NOTEBOOKS / name).read_text())
    for cell in nb["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.slow
def test_notebook_runs_top_to_bottom(name):
    path = NOTEBOOKS / name
    nb = nbformat.read(path, as_version=4)
    NotebookClient(nb, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    for expected in EXPECTED[name]:
        assert expected in text, expected


def test_every_notebook_is_tested():
    assert {p.name for p in NOTEBOOKS.glob("*.ipynb")} == set(EXPECTED)
