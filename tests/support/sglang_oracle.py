"""The SGLang oracles' common set-up: each oracle script (benchmarks/oracles/sglang/) runs under the SGLang venv's
python named by KVSIM_SGLANG_PYTHON and reports the version it ran, which must be `SGLANG_VERSION`."""

from __future__ import annotations

from tests.support.oracle_support import Oracle
from tests.support.paths import GOLDEN, REPO

SGLANG_VERSION = "0.5.23"
"""The SGLang release every recorded answer comes from."""


def sglang_oracle(script: str, golden: str, answer_keys: tuple[str, ...] | None = None) -> Oracle:
    """The oracle `benchmarks/oracles/sglang/<script>` with its golden files in `tests/golden/<golden>/`."""
    return Oracle(script=REPO / "benchmarks" / "oracles" / "sglang" / script, env_var="KVSIM_SGLANG_PYTHON",
                  golden_dir=GOLDEN / golden, version_key="sglang_version",
                  setup="benchmarks/oracles/sglang/README.md", answer_keys=answer_keys)
