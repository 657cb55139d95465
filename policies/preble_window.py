"""Preble's sliding-window histogram as numpy columns, for its load costs (`policies.preble`).

Kept apart so that numpy is imported when a Preble router is built, not when the router registry is read.
"""

from __future__ import annotations

import numpy as np


class WindowTable:
    """The window's important nodes, one row each, in the window's order (the order of `PrebleRouter.prompt_sum`):
    a node entering the window takes the next row, one leaving it leaves a hole (rows are compacted, in order, when
    the table is full and at least half holes). A node's row is `node.slot` (-1: not in the window).

    Columns: its count in the window, tokens, context length, creation order (`seq`), per GPU whether it is
    allocated there and its reference count, its number of GPUs; and the two parts of its cost, kept as they
    change: `prefill` = rate * count * prefill_token_s * tokens / len(alloc) (Preble's prefill_cost, computed in
    Python from the row's values, 0.0 while unallocated) and per GPU `refout` = ref * out (an int). The router
    calls the setters whenever one of these changes for a window node.

    The load costs are the router's sums, term by term in the same IEEE operations and the same order, so the same
    floats: per node and GPU `prefill + ref * out * tpot`, summed over the window's nodes in order
    (`np.add.accumulate` adds row after row; a node not counted adds 0.0, which leaves a sum of non-negative terms
    as it was).
    """

    def __init__(self, num_gpus: int, prefill_token_s: float, capacity: int = 16) -> None:
        self.num_gpus = num_gpus
        self.prefill_token_s = prefill_token_s
        self.size = 0
        """Rows used, holes included."""
        self.holes = 0
        self.nodes: list = []
        self._one_hot = np.eye(num_gpus, dtype=bool)
        # The row's values as Python numbers, from which `prefill` is computed (a numpy scalar is slow to read).
        self._rate: list[float] = []
        self._count: list[int] = []
        self._out: list[int] = []
        self._nalloc: list[int] = []
        self._allocate(capacity)

    _COLUMNS = ("count", "tokens", "context", "seq", "mask", "ref", "refout", "prefill")

    def _allocate(self, capacity: int) -> None:
        W = self.num_gpus
        self.count = np.zeros(capacity, dtype=np.int64)
        self.tokens = np.zeros(capacity, dtype=np.int64)
        self.context = np.zeros(capacity, dtype=np.int64)
        self.seq = np.zeros(capacity, dtype=np.int64)
        self.mask = np.zeros((capacity, W), dtype=bool)
        self.ref = np.zeros((capacity, W), dtype=np.int64)
        self.refout = np.zeros((capacity, W), dtype=np.int64)
        self.prefill = np.zeros(capacity, dtype=np.float64)

    def _make_room(self) -> None:
        size, capacity = self.size, len(self.count)
        if size < capacity:
            return
        if self.holes * 2 >= size:
            keep = [row for row, node in enumerate(self.nodes) if node is not None]
            index = np.array(keep, dtype=np.int64)
            for name in self._COLUMNS:
                column = getattr(self, name)
                column[: len(keep)] = column[index]
                column[len(keep):] = 0
            self.nodes = [self.nodes[row] for row in keep]
            for python in (self._rate, self._count, self._out, self._nalloc):
                python[:] = [python[row] for row in keep]
            for row, node in enumerate(self.nodes):
                node.slot = row
            self.size, self.holes = len(keep), 0
            return
        old = {name: getattr(self, name) for name in self._COLUMNS}
        self._allocate(capacity * 2)
        for name, column in old.items():
            getattr(self, name)[:capacity] = column

    def _refresh_prefill(self, row: int) -> None:
        n = self._nalloc[row]
        # NOTE: Preble's prefill_cost, left to right as the router wrote it: rate * count * T * tokens / |alloc|
        self.prefill[row] = (self._rate[row] * self._count[row] * self.prefill_token_s * int(self.tokens[row]) / n
                             if n else 0.0)

    def add(self, node, count: int, rate: float, out: int) -> None:
        """`node` enters the window (the last row)."""
        self._make_room()
        row = self.size
        self.size += 1
        self.nodes.append(node)
        self._rate.append(rate)
        self._count.append(count)
        self._out.append(out)
        self._nalloc.append(0)
        node.slot = row
        self.count[row] = count
        self.tokens[row], self.context[row], self.seq[row] = node.tokens, node.context_length, node.seq
        self.ref[row] = node.ref
        self.refout[row] = [r * out for r in node.ref]
        self.set_alloc(node, node.alloc)  # refreshes prefill

    def remove(self, node) -> None:
        row = node.slot
        node.slot = -1
        self.nodes[row] = None
        self.mask[row] = False  # no longer counted anywhere
        self.holes += 1

    def set_stats(self, node, count: int, rate: float, out: int) -> None:
        row = node.slot
        self._rate[row], self._count[row] = rate, count
        self.count[row] = count
        if out != self._out[row]:
            self._out[row] = out
            self.refout[row] = self.ref[row] * out
        self._refresh_prefill(row)

    def set_count(self, node, count: int) -> None:
        row = node.slot
        self._count[row] = count
        self.count[row] = count
        self._refresh_prefill(row)

    def set_tokens(self, node) -> None:
        row = node.slot
        self.tokens[row] = node.tokens
        self._refresh_prefill(row)

    def add_ref(self, node, gpu: int, delta: int) -> None:
        row = node.slot
        self.ref[row, gpu] += delta
        self.refout[row, gpu] += delta * self._out[row]

    def set_alloc(self, node, gpus) -> None:
        row = node.slot
        if gpus and len(gpus) == 1:
            for gpu in gpus:
                self.mask[row] = self._one_hot[gpu]
            n = 1
        else:
            mask = self.mask[row]
            mask[:] = False
            if gpus:
                mask[list(gpus)] = True
            n = len(gpus) if gpus else 0
        if n != self._nalloc[row]:
            self._nalloc[row] = n
            self._refresh_prefill(row)

    def set_rows_to_one_gpu(self, rows: list[int], gpu: int) -> None:
        """Rows `rows` are allocated to `gpu` alone (a subtree move's window nodes)."""
        self.mask[rows] = self._one_hot[gpu]
        nalloc = self._nalloc
        for row in rows:
            if nalloc[row] != 1:
                nalloc[row] = 1
                self._refresh_prefill(row)

    def load_costs(self, min_count: int, tpots: list[float]) -> list[float]:
        """Per GPU, the sum over the window's nodes counted at least `min_count` times and allocated to it."""
        k = self.size
        if not k:
            return [0.0] * self.num_gpus
        terms = self.prefill[:k, None] + self.refout[:k] * np.array(tpots)
        counted = self.mask[:k]  # a hole's row is allocated nowhere
        if min_count > 0:
            counted = counted & (self.count[:k] >= min_count)[:, None]
        return np.add.accumulate(np.where(counted, terms, 0.0), axis=0)[-1].tolist()

    def steal_candidates(self, gpu: int, tpot: float) -> list[tuple[float, object]]:
        """Large nodes counted more than once and allocated to `gpu`, with their cost on it, cheapest first (ties
        by creation order)."""
        k = self.size
        tokens = self.tokens[:k]
        rows = np.flatnonzero(self.mask[:k, gpu] & (self.count[:k] > 1) & (tokens > self.context[:k] - tokens))
        if not rows.size:
            return []
        cost = self.prefill[rows] + self.refout[rows, gpu] * tpot
        order = np.lexsort((self.seq[rows], cost))
        nodes = self.nodes
        return list(zip(cost[order].tolist(), [nodes[r] for r in rows[order].tolist()]))
