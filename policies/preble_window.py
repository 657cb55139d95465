"""Preble's sliding-window histogram as numpy columns, for its load costs (`policies.preble`).

Kept apart so that numpy is imported when a Preble router is built, not when the router registry is read.
"""

from __future__ import annotations

import numpy as np


class WindowTable:
    """The window's important nodes, one row each, in the window's order (the order of `PrebleRouter.prompt_sum`):
    a node entering the window takes the next row, one leaving it leaves a hole (rows are compacted, in order, when
    the table is full and at least half holes). A node's row is `node.slot` (-1: not in the window).

    Columns: its count in the window, miss rate and latest output length (as the router's tables hold them), its
    tokens and context length, creation order (`seq`), per GPU its reference count and whether it is allocated
    there, and its number of GPUs. The router writes a row whenever one of these changes for a window node.

    The load costs are the router's sums, term by term in the same IEEE operations and the same order, so the same
    floats: per node and GPU `rate * count * prefill_token_s * tokens / len(alloc) + ref * out * tpot`, summed over
    the window's nodes in order (`np.add.accumulate` adds row after row; a node not counted adds 0.0, which leaves a
    sum of non-negative terms as it was).
    """

    def __init__(self, num_gpus: int, capacity: int = 16) -> None:
        self.num_gpus = num_gpus
        self.size = 0
        """Rows used, holes included."""
        self.holes = 0
        self.nodes: list = []
        self._one_hot = np.eye(num_gpus, dtype=bool)
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        W = self.num_gpus
        self.active = np.zeros(capacity, dtype=bool)
        self.count = np.zeros(capacity, dtype=np.int64)
        self.rate = np.zeros(capacity, dtype=np.float64)
        self.out = np.zeros(capacity, dtype=np.int64)
        self.tokens = np.zeros(capacity, dtype=np.int64)
        self.context = np.zeros(capacity, dtype=np.int64)
        self.seq = np.zeros(capacity, dtype=np.int64)
        self.nalloc = np.zeros(capacity, dtype=np.int64)
        self.mask = np.zeros((capacity, W), dtype=bool)
        self.ref = np.zeros((capacity, W), dtype=np.int64)

    _COLUMNS = ("active", "count", "rate", "out", "tokens", "context", "seq", "nalloc", "mask", "ref")

    def _make_room(self) -> None:
        size, capacity = self.size, len(self.active)
        if size < capacity:
            return
        if self.holes * 2 >= size:
            keep = np.flatnonzero(self.active[:size])
            for name in self._COLUMNS:
                column = getattr(self, name)
                column[: len(keep)] = column[keep]
                column[len(keep):] = 0
            self.nodes = [self.nodes[i] for i in keep.tolist()]
            for row, node in enumerate(self.nodes):
                node.slot = row
            self.size, self.holes = len(keep), 0
            return
        old = {name: getattr(self, name) for name in self._COLUMNS}
        self._allocate(capacity * 2)
        for name, column in old.items():
            getattr(self, name)[:capacity] = column

    def add(self, node, count: int, rate: float, out: int) -> None:
        """`node` enters the window (the last row)."""
        self._make_room()
        row = self.size
        self.size += 1
        self.nodes.append(node)
        node.slot = row
        self.active[row] = True
        self.count[row], self.rate[row], self.out[row] = count, rate, out
        self.tokens[row], self.context[row], self.seq[row] = node.tokens, node.context_length, node.seq
        self.ref[row] = node.ref
        self.set_alloc(node, node.alloc)

    def remove(self, node) -> None:
        row = node.slot
        node.slot = -1
        self.nodes[row] = None
        self.active[row] = False
        self.mask[row] = False
        self.holes += 1

    def set_stats(self, node, count: int, rate: float, out: int) -> None:
        row = node.slot
        self.count[row], self.rate[row], self.out[row] = count, rate, out

    def set_alloc(self, node, gpus) -> None:
        row = node.slot
        if gpus and len(gpus) == 1:
            for gpu in gpus:
                self.mask[row] = self._one_hot[gpu]
            self.nalloc[row] = 1
            return
        mask = self.mask[row]
        mask[:] = False
        if gpus:
            mask[list(gpus)] = True
        self.nalloc[row] = len(gpus) if gpus else 0

    def set_rows_to_one_gpu(self, rows: list[int], gpu: int) -> None:
        """Rows `rows` are allocated to `gpu` alone (a subtree move's window nodes)."""
        self.mask[rows] = self._one_hot[gpu]
        self.nalloc[rows] = 1

    def load_costs(self, min_count: int, prefill_token_s: float, tpots: list[float]) -> list[float]:
        """Per GPU, the sum over the window's nodes counted at least `min_count` times and allocated to it."""
        k = self.size
        if not k:
            return [0.0] * self.num_gpus
        count = self.count[:k]
        prefill = self.rate[:k] * count * prefill_token_s * self.tokens[:k] / np.maximum(self.nalloc[:k], 1)
        terms = prefill[:, None] + (self.ref[:k] * self.out[:k, None]) * np.array(tpots)
        counted = self.mask[:k] & (self.active[:k] & (count >= min_count))[:, None]
        return np.add.accumulate(np.where(counted, terms, 0.0), axis=0)[-1].tolist()

    def steal_candidates(self, gpu: int, prefill_token_s: float, tpot: float) -> list[tuple[float, object]]:
        """Large nodes counted more than once and allocated to `gpu`, with their cost on it, cheapest first (ties
        by creation order)."""
        k = self.size
        tokens = self.tokens[:k]
        rows = np.flatnonzero(self.active[:k] & (self.count[:k] > 1) & (tokens > self.context[:k] - tokens)
                              & self.mask[:k, gpu])
        if not rows.size:
            return []
        cost = (self.rate[rows] * self.count[rows] * prefill_token_s * self.tokens[rows] / self.nalloc[rows]
                + (self.ref[rows, gpu] * self.out[rows]) * tpot)
        order = np.lexsort((self.seq[rows], cost))
        nodes = self.nodes
        return list(zip(cost[order].tolist(), [nodes[r] for r in rows[order].tolist()]))
