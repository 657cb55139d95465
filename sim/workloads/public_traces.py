"""The public Mooncake traces kvsim replays: where they are (pinned to one commit) and what they must hash to.

The repository keeps only their first lines (tests/fixtures/traces/); `kvsim traces fetch` downloads the whole files
(only the command line writes files). Both are JSONL in the format `sim.workloads.traces.read_mooncake` reads, from
github.com/kvcache-ai/Mooncake (Apache-2.0), `FAST25-release/traces/`, the traces of the FAST'25 paper "Mooncake:
Trading More Storage for Less Computation" (Appendix A). Sizes and SHA-256 were computed from the files at the pinned
commit; the files were last changed upstream in commit 3cca71d (2025-02-21).
"""

from __future__ import annotations

from dataclasses import dataclass

MOONCAKE_COMMIT = "3b5a594133958449a1feaf1c9e0fc1b553e34a28"
MOONCAKE_TRACES_URL = ("https://raw.githubusercontent.com/kvcache-ai/Mooncake/"
                       f"{MOONCAKE_COMMIT}/FAST25-release/traces")
"""The folder the files are fetched from: a file's URL is this, a slash and its name."""
DEFAULT_TRACES_DIR = "traces"
"""Where `kvsim traces fetch` puts them and the benchmarks look for them: `traces/` in the folder the command runs
from (the repository root: git-ignored there)."""


@dataclass(frozen=True, slots=True)
class PublicTrace:
    """One public trace file: its name, request count, size in bytes, SHA-256 (hex) and what it holds."""

    file_name: str
    num_requests: int
    num_bytes: int
    sha256: str
    what: str


MOONCAKE_TRACES = (
    PublicTrace("conversation_trace.jsonl", 12_031, 3_029_533,
                "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
                "sampled from 1 h of Kimi conversation traffic, real arrival times"),
    PublicTrace("synthetic_trace.jsonl", 3_993, 1_136_313,
                "bd070915a98fc0ed264d7cfef2ce746002eb3076a695ec31ba2674c0111ec131",
                "synthetic: Poisson arrivals, each conversation's turns in order"),
)
