"""docs/scenarios.md documents every field of both workload kinds and of a duration, one table row each, in the
order of the models (the tables are checked against the schema, so a new field cannot go undocumented)."""

from __future__ import annotations

import re

import pytest

from sim.workloads.session_spec import DurationSpec, SessionsSpec
from sim.workloads.spec import SharedPrefixSpec
from tests.support.paths import REPO

DOC = (REPO / "docs" / "scenarios.md").read_text()


def _table_after(heading: str) -> list[str]:
    """The first column of the first table after `heading`, backticks removed."""
    rest = DOC[DOC.index(heading):]
    rows = []
    for line in rest.splitlines()[1:]:
        if line.startswith("| field") or line.startswith("|---"):
            continue
        if line.startswith("| `"):
            rows.append(re.match(r"\| `([^`]+)`", line).group(1))
        elif rows:
            break
    return rows


@pytest.mark.parametrize(("heading", "model"), [
    ("### Shared prefix", SharedPrefixSpec), ("### Sessions workloads", SessionsSpec), ("#### Durations", DurationSpec),
])
def test_every_field_has_a_row(heading, model):
    assert _table_after(heading) == list(model.model_fields)
