"""Integer arithmetic of vLLM's block bookkeeping (vLLM `vllm/utils/math_utils.py`)."""

from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """Ceiling division: the blocks of `b` tokens that `a` tokens occupy."""
    return -(-a // b)
