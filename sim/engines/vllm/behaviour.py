"""Which vLLM release behaves how: the cache and scheduler rules that changed between 0.10 and 0.33.

Source: `docs/engines/vllm-rules.md` §1 (each rule with its upstream PR or file).
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_VLLM_VERSION = "0.31.0"
"""The release the reference experiment ran; its rules are 0.33.0's (the release the oracle checks)."""
OLDEST_VLLM_VERSION = (0, 10, 0)
NEWEST_VLLM_VERSION = (0, 33, 0)
"""The releases whose rules kvsim knows (docs/engines/vllm-rules.md §1); a version outside them is refused."""


def parse_version(version: str) -> tuple[int, int, int]:
    """'0.24.1' -> (0, 24, 1); local suffixes ('+cpu') and missing parts are tolerated."""
    core = version.split("+", 1)[0].strip()
    parts = core.split(".")
    try:
        nums = [int(p) for p in parts[:3]]
    except ValueError:
        raise ValueError(f"vllm_version must look like '0.31.0', got {version!r}") from None
    while len(nums) < 3:
        nums.append(0)
    v = (nums[0], nums[1], nums[2])
    if not (OLDEST_VLLM_VERSION <= v and v[:2] <= NEWEST_VLLM_VERSION[:2]):  # 0.33.x patch releases too
        raise ValueError(f"vllm_version {version!r} is outside the releases kvsim reproduces: "
                         f"{_text(OLDEST_VLLM_VERSION)} to {_text(NEWEST_VLLM_VERSION[:2])}.x")
    return v


def _text(v: tuple[int, ...]) -> str:
    return ".".join(map(str, v))


@dataclass(frozen=True, slots=True)
class VllmBehaviour:
    """The version-dependent rules kvsim reproduces."""

    unhashed_to_head: bool
    """>= 0.24: a freed block without a hash goes to the head of the free queue (else the tail, like cached ones)."""
    full_sequence_must_fit: bool
    """>= 0.19: a waiting request is admitted only if its whole prompt fits in free blocks (else only its first chunk)."""
    stats_at_admission_only: bool
    """>= 0.27: prefix-cache stats are recorded once, at admission (else at every lookup, failed ones included)."""
    count_preempted_lookups: bool
    """<= 0.11.0: lookups of re-admitted preempted requests count in the exported stats."""

    @classmethod
    def for_version(cls, version: str) -> VllmBehaviour:
        v = parse_version(version)
        return cls(
            unhashed_to_head=v >= (0, 24, 0),
            full_sequence_must_fit=v >= (0, 19, 0),
            stats_at_admission_only=v >= (0, 27, 0),
            count_preempted_lookups=v <= (0, 11, 0),
        )
