"""SGLang 0.5.23's radix-tree eviction priorities (`python/sglang/srt/mem_cache/evict_policy.py`): the smallest
priority is evicted first. One registry, as SGLang's `get_eviction_strategy` (`mem_cache/utils.py`).

`last_access_time` and `creation_time` are ticks of the tree's logical clock: SGLang stamps them with
`time.monotonic()`, of which only the order matters, and every stamp is a separate call (so no two nodes tie).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol


class TreeNode(Protocol):
    """What a priority reads of a radix-tree node (`sim.engines.sglang.radix_cache.TreeNode`)."""

    last_access_time: int
    creation_time: int
    hit_count: int
    priority: int


Priority = Callable[[TreeNode], object]


def lru(node: TreeNode) -> object:
    return node.last_access_time


def lfu(node: TreeNode) -> object:
    return (node.hit_count, node.last_access_time)


def fifo(node: TreeNode) -> object:
    return node.creation_time


def mru(node: TreeNode) -> object:
    return -node.last_access_time


def filo(node: TreeNode) -> object:
    return -node.creation_time


def priority(node: TreeNode) -> object:
    """Lower request priority first, then LRU (SGLang `PriorityStrategy`)."""
    return (node.priority, node.last_access_time)


def slru(node: TreeNode, protected_threshold: int = 2) -> object:
    """Segmented LRU: nodes hit fewer than `protected_threshold` times (probationary) go before protected ones."""
    return (1 if node.hit_count >= protected_threshold else 0, node.last_access_time)


EVICTION_POLICIES: dict[str, Priority] = {
    "lru": lru, "lfu": lfu, "fifo": fifo, "mru": mru, "filo": filo, "priority": priority, "slru": slru,
}
"""`--radix-eviction-policy` values kvsim reproduces (0.5.23 also has `tlru`, a tail-latency variant that needs a
per-conversation history length kvsim's requests do not carry)."""
