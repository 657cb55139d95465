"""The shipped scenarios are what `kvsim schema` says a scenario is, read by kvsim and by any YAML tool alike:
kvsim's loader also reads YAML 1.2 floats (`50.4e9`), which PyYAML (YAML 1.1) reads as text, and the shipped files
write floats the 1.1 way so that an editor's schema check, or a script, sees the same numbers kvsim does."""

from __future__ import annotations

import json

import jsonschema
import pytest
import yaml
from click.testing import CliRunner

from sim.cli import main
from sim.scenario import load_scenario, read_yaml
from tests.support.paths import SCENARIOS

SHIPPED = sorted(SCENARIOS.glob("*.yaml"))
assert len(SHIPPED) >= 4, SCENARIOS


@pytest.fixture(scope="module")
def schema() -> dict:
    result = CliRunner().invoke(main, ["schema"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_a_shipped_scenario_validates_against_the_schema_read_as_yaml_1_1_and_by_kvsim(schema, path):
    text = path.read_text()
    by_pyyaml, (by_kvsim, _) = yaml.safe_load(text), read_yaml(text)
    jsonschema.validate(by_pyyaml, schema)
    jsonschema.validate(by_kvsim, schema)
    assert by_pyyaml == by_kvsim  # no value that one reads as a number and the other as text


def test_kvsim_reads_yaml_1_2_floats_as_numbers_and_nothing_else_changes():
    text = "a: 50.4e9\nb: 1e-3\nc: -2E+2\nd: .5e3\ne: '1e9'\nf: 50.4e+9\ng: yes\nh: 7\ni: 1e\nj: 0.31.0\n"
    data, _ = read_yaml(text)
    assert data == {"a": 50.4e9, "b": 1e-3, "c": -200.0, "d": 500.0, "e": "1e9", "f": 50.4e9, "g": True, "h": 7,
                    "i": "1e", "j": "0.31.0"}
    # PyYAML, which follows YAML 1.1, reads the first four as text: that is why the shipped files write 50.4e+9
    assert yaml.safe_load(text) == {**data, "a": "50.4e9", "b": "1e-3", "c": "-2E+2", "d": ".5e3"}


def test_a_yaml_1_2_float_in_a_scenario_file_is_the_number(tmp_path):
    text = (SCENARIOS / "trace-replay.yaml").read_text()
    assert "    bandwidth: 50.4e+9 " in text
    (tmp_path / "s.yaml").write_text(text.replace("    bandwidth: 50.4e+9 ", "    bandwidth: 50.4e9 "))
    for path in (SCENARIOS / "trace-replay.yaml", tmp_path / "s.yaml"):
        assert load_scenario(path)[0].time_model.host_link.bandwidth == 50.4e9
