"""Where the tests find the repository's files: one owner for every path a test reads."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
"""The checkout's root (pyproject.toml, scenarios/, notebooks/, benchmarks/)."""
TESTS = REPO / "tests"
FIXTURES = TESTS / "fixtures"
"""Measured runs (real-vllm*/, real-sglang/), trace heads (traces/) and the tiny models' files."""
TRACES = FIXTURES / "traces"
GOLDEN = TESTS / "golden"
"""Answers recorded from the real engines' own code (see tests/support/oracle_support.py)."""
SCENARIOS = REPO / "scenarios"
