"""Preble E2 (Srivatsa et al., ICLR'25), the global scheduler `GlobalSchedulerWithTime`.

Upstream read: WukLab/preble @8e7906a3 (2024-05-24): `preble/global_scheduler_with_time.py` (the scheduler and its
`SlidingWindowHistogram`), `preble/global_lru_cache.py` (`LPRadixCache`, `TreeNode`), `preble/ttft_overload_detector.py`,
`preble/server/server.py` (how the server builds it), `preble/benchmarks/multi_bench_exp_routing.py`.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Hashable
from typing import Literal

from pydantic import Field

from policies.base import RouterBase, RouterOptions
from sim.routing.interface import ClusterView
from sim.routing.knobs import ChoiceKnob, FloatKnob, IntKnob
from sim.workloads.request import Request


class PrebleOptions(RouterOptions):
    window_s: float = Field(180.0, gt=0, description="Sliding window of the per-prefix histogram and the TTFT overload detector (upstream timedelta(minutes=3)).")
    prefill_token_s: float = Field(3.0e-5, ge=0, description="T_prefill(n) = prefill_token_s x n: seconds per prefill token (kvsim's default TimeModelSpec.prefill_token_s; upstream an offline fit, LP_mistral_7b_A6000_sglang_extend_flashinfer).")
    tpot_s: float | None = Field(None, gt=0, description="Fixed TPOT (s) in the decode term; null = upstream: per GPU the median of the last tpot_samples measured TPOTs, seeded with initial_tpot_s.")
    initial_tpot_s: float = Field(0.15, gt=0, description="The seed of each GPU's TPOT window (upstream avg_topt_per_gpu[i].append(.15)).")
    tpot_samples: int = Field(200, ge=1, description="Length of each GPU's TPOT window, seed included (upstream deque(maxlen=200)).")
    holder_pick: Literal["position", "gpu"] = Field("position", description="Exploit among several holders: position = upstream code (np.argmin's index into the holder list is used as the GPU id); gpu = the paper's argmin holder.")
    rebalancing: bool = Field(True, description="Important-node stealing (upstream enable_rebalancing=True).")
    high_load_threshold: float = Field(1.5, gt=1, description="Rebalance while the most loaded GPU's cost >= this x the least loaded one's (HIGH_LOAD_THRESHOLD).")
    rebalance_after_requests_per_gpu: int = Field(50, ge=0, description="No rebalancing until this many requests per GPU have been routed in total (upstream 50 x num_gpus; the count never decreases).")
    rebalancing_chain_length: int = Field(3, ge=1, description="Rebalance only after requests whose leaf is fewer than this many levels below its important node (REBALANCING_CHAIN_LENGTH).")
    min_rebalancing_interval_s: float | None = Field(None, ge=0, description="At most one rebalancing step per this many seconds; null = upstream code (the 10 s check is commented out: every request). 10 = the paper's.")


class _Node:
    """A node of Preble's token radix tree: a run of request keys (16-token blocks; a request's partial last block
    is its own tail key). `context_length` = tokens from the root through this node; `ref[g]` = requests routed to
    GPU g through this node and not finished (upstream `TreeNode.ref_counter`).

    Its GPU allocation (upstream `gpu_allocations[node]`) is kept lazily (see `PrebleRouter._assign_subtree`):
    `alloc` (None: none yet) as last written at epoch `stamp`, unless an ancestor's `tag`, put on all its
    descendants at a later epoch `tag_stamp`, overrides it. `win`: nodes of the window's histogram in this subtree,
    this node included (where a subtree move must write allocations at once). `slot`: its row in the window's
    table (`policies.preble_window.WindowTable`), -1 outside the window."""

    __slots__ = ("keys", "tokens", "parent", "children", "context_length", "ref", "depth", "seq",
                 "alloc", "stamp", "tag", "tag_stamp", "win", "slot")

    def __init__(self, keys, tokens, parent, context_length, num_gpus, depth, seq, stamp):
        self.keys = keys
        self.tokens = tokens
        self.parent = parent
        self.children: dict = {}
        self.context_length = context_length
        self.ref = [0] * num_gpus
        self.depth = depth
        self.seq = seq
        self.alloc: set[int] | None = None
        self.stamp = stamp
        self.tag: set[int] | None = None
        self.tag_stamp = -1
        self.win = 0
        self.slot = -1

    @property
    def context_so_far(self) -> int:
        return self.context_length - self.tokens

    def is_large(self) -> bool:
        """Upstream `is_large_node`: the node holds more tokens than all its ancestors together."""
        return self.tokens > self.context_so_far

    def __repr__(self) -> str:
        return f"_Node(seq={self.seq}, tokens={self.tokens}, context={self.context_length})"


class _Allocations:
    """Upstream `gpu_allocations` as a mapping (node -> GPU set; a node never allocated is absent), read through the
    nodes' lazy allocations (`_Node`). Writing a node's set is the router's own write."""

    def __init__(self, router: PrebleRouter) -> None:
        self._router = router

    def get(self, node: _Node, default=None):
        gpus = self._router.resolve(node)
        return default if gpus is None else gpus

    def __getitem__(self, node: _Node) -> set[int]:
        gpus = self._router.resolve(node)
        if gpus is None:
            raise KeyError(node)
        return gpus

    def __setitem__(self, node: _Node, gpus: set[int]) -> None:
        self._router.write_alloc(node, gpus)

    def __contains__(self, node: _Node) -> bool:
        return self._router.resolve(node) is not None

    def items(self):
        return [(node, gpus) for node in self._router.nodes() if (gpus := self._router.resolve(node)) is not None]

    def values(self):
        return [gpus for _, gpus in self.items()]


def _common(a, b, start: int) -> int:
    n = 0
    for x, y in zip(a, b[start:]):
        if x != y:
            break
        n += 1
    return n


class PrebleRouter(RouterBase):
    """Preble E2: an approximate token radix tree of every routed prompt; per important node the GPUs it is
    allocated to, and its requests in a sliding window. Per request, with the prompt inserted into the tree first:

        leaf     = the prompt's last node after the insert (a new node for an unseen suffix; the existing node if the
                   whole prompt was already a path); missed = leaf.tokens, cached = leaf.context_so_far (tokens before it)
        if missed < cached:    # exploit
            G = allocation of the deepest node on leaf -> root that has one (none: all GPUs)
            gpu = G's only member, else argmin_{g in G} load_cost(g)    (see holder_pick)
        else:                  # explore
            gpu = argmin_{g in all} load_cost(g)                        (first minimum)
        load_cost(g) = sum over important nodes n in the window allocated to g of
                       miss_rate(n) * count(n) * T_prefill(n.tokens) / |alloc(n)|  +  ref_g(n) * out(n) * TPOT_g
        then: every node leaf -> root gets gpu in its allocation and ref_gpu += 1.

    * important node of a leaf: the deepest node on leaf -> root holding more tokens than all its ancestors. The
      window (`window_s`) keeps, per important node, count(n), sum of prompt tokens and sum of leaf.context_so_far
      (hit tokens); miss_rate(n) = 1 - hit / prompt, recomputed when n gets a request; out(n) = the output length of
      n's latest request. When an entry leaves the window (checked after each routing decision) the node's counts
      drop; at zero the node leaves the histogram and its allocation is reset to empty (only important nodes are
      ever reset; the root's allocation is the union of all GPUs ever chosen).
    * T_prefill(n) = prefill_token_s x n.tokens (upstream: an offline-fitted model of n.tokens and n.context_length).
    * TPOT_g = median of GPU g's last 200 measured TPOTs (seeded 0.15 s), (t_done - t_first) / (output - 1).

    e.g. 2 GPUs, prompt = 2032 shared + 339 own tokens, the shared node allocated to GPU 1: leaf = the new 339-token
    node, 339 < 2032 -> exploit; G = {1} -> GPU 1. An unseen 2371-token prompt: missed 2371, cached 0 -> explore.

    Rebalancing (important-node stealing), after a request whose leaf is < 3 levels below its important node, once
    50 x num_gpus requests have been routed (a running total): GPUs sorted by load_cost over nodes with count >= 2,
    most loaded first; pair the first with the last: stop if first < 1.5 x last. Candidates: large nodes of the first
    GPU with count > 1, by cost on it (ascending; ties by creation order, upstream TreeNode.__lt__). One candidate:
    if the TTFT overload detector flags it on the first GPU (mean TTFT of the window's second half >= 2 x the first
    half's) and the last GPU does not have it, the last GPU is added to its allocation (replication, cost / 2 moved).
    Several: move the cheapest while first - cost >= last + cost (allocation := {last}, descendants too), until
    first < 1.5 x last. Then recurse on the list without its first entry.

    Doc/code disagreements (followed the code): docs/routers/rules.md (Preble) says rebalancing runs at most every 10 s; the check is
    commented out upstream, so it may run after every request (`min_rebalancing_interval_s` restores it). The exploit
    argmin uses `np.argmin(costs)` (a position in the holder list) as the GPU id (`holder_pick=position`, the code;
    `gpu` = the paper's rule); holders iterate in ascending id order, as a Python set of small ints does.
    Granularity: upstream's tree is over token ids; here keys are the requests' 16-token blocks (plus each prompt's
    partial last block as its own key), so a match that ends inside a block is not seen (error < 16 tokens per
    request); node depths follow upstream's bookkeeping (a split gives the new node
    the child's depth and the child depth + 1, descendants unchanged; the insert descends +1, +2 after a split).

    Membership (kvsim's rule: Preble's GPU set is fixed at start, `num_gpus`, with no join or leave): the GPUs are the
    routable workers. A GPU that leaves is taken out of every allocation (a node allocated only to it has none left,
    so its next request explores or takes its ancestor's GPUs) and of the rebalancing ranks; a new GPU starts with no
    allocation, no TPOT samples (the 0.15 s seed) and no TTFT history, and is found by explore's argmin (cost 0).
    Exploit's holders and explore's argmin range over the routable GPUs; with `holder_pick=position` the position
    indexes the routable list (the i-th routable GPU: on a fixed fleet GPU i, as upstream). The rebalancing threshold
    is 50 x the routable GPUs.

    Left out: eviction modelling (`enable_eviction`, off in the benchmarks' `GlobalSchedulerTime`, on in
    `server.py`: the virtual LRU eviction cost in load_cost and the 198,516-token per-GPU capacity);
    `runtime_id_with_highest_hit_rate` (None in the server); the unused incremental cost bookkeeping
    (`current_prefill_cost_per_gpu`, `migrate_node_cost`). Upstream uses wall-clock time; here the simulated clock.
    """

    name = "preble"
    summary = "Preble E2: token tree + 3-min window; exploit (missed < cached) else explore by load cost; rebalancing"
    Options = PrebleOptions
    search_space = (FloatKnob("high_load_threshold", 1.1, 4), IntKnob("rebalancing_chain_length", 1, 6),
                    ChoiceKnob("rebalancing", (True, False)))

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        n = self.num_workers
        opts = self.options
        self._seq = 0
        self._stamp = 0
        """The epoch of allocation writes: a subtree move opens a new one (`_assign_subtree`)."""
        self.root = self._new_node([], 0, None, 0, 0)
        self.alloc = _Allocations(self)
        """Upstream `gpu_allocations`: node -> GPUs it is allocated to (kept on the nodes, see `_Node`). NOTE: a set
        may be shared by several nodes (a moved subtree shares one), so it is never changed in place: a change puts
        a new set."""
        # the sliding-window histogram (upstream SlidingWindowHistogram), keyed by important node
        from policies.preble_window import WindowTable  # numpy, imported when a Preble router is built

        self._window: deque = deque()  # (time_s, [important node], leaf)
        self._boxes: dict[_Node, list[_Node]] = {}
        """Per window node, the one-element list its window entries hold it in: a rename re-points the box."""
        self._table = WindowTable(n, opts.prefill_token_s)
        """The window's nodes as columns, for the load costs (kept in step with the tables below)."""
        self.prompt_sum: dict[_Node, int] = {}
        self.count: dict[_Node, int] = {}
        self.hit_tokens: dict[_Node, int] = {}
        self.prompt_tokens: dict[_Node, int] = {}
        self.miss_rate: dict[_Node, float] = {}
        self.out_tokens: dict[_Node, int] = {}
        self._tpots = [deque([opts.initial_tpot_s], maxlen=opts.tpot_samples) for _ in range(n)]
        self._tpots_sorted = [[opts.initial_tpot_s] for _ in range(n)]
        """Each GPU's TPOT window in ascending order (its median read off it, as statistics.median sorts it)."""
        self._tpot_median = [opts.initial_tpot_s] * n
        self.routed = [0] * n
        """Upstream `per_gpu_load`: requests routed to each GPU so far (never decremented)."""
        self._ttft: dict[tuple[_Node, int], deque] = {}
        self._last_rebalance_s: float | None = None
        self._pending: tuple[int, _Node, _Node] | None = None
        self._sent_s: dict[int, float] = {}
        self._first_s: dict[int, float] = {}
        self.explored = 0
        self.exploited = 0

    # ------------------------------------------------------------------ the tree
    def _new_node(self, keys, tokens, parent, context_length, depth) -> _Node:
        self._seq += 1
        # NOTE: stamped now, so that no earlier subtree move (an ancestor's tag) reaches a node made after it.
        return _Node(keys, tokens, parent, context_length, self.num_workers, depth, self._seq, self._stamp)

    def request_keys(self, request: Request) -> tuple[list[Hashable], int]:
        """The prompt as tree keys: its full blocks, then its partial last block as a key of its own; and the
        tail's token count (0: none)."""
        keys = list(request.block_hashes)
        tail = request.prompt_tokens - len(keys) * self.block_size
        if tail:
            keys.append(("tail", request.request_id))
        return keys, tail

    def insert(self, keys: list[Hashable], tail: int) -> tuple[_Node, dict[_Node, _Node]]:
        """Upstream `LPRadixCache.insert`: the prompt's last node, and the splits made ({old child: new parent})."""
        B = self.block_size
        node, pos, depth, n = self.root, 0, 0, len(keys)
        splits: dict[_Node, _Node] = {}
        while pos < n and keys[pos] in node.children:
            child = node.children[keys[pos]]
            length = len(child.keys)
            # NOTE: the whole node's keys compared in C first (a resent conversation walks its earlier turns)
            m = length if keys[pos:pos + length] == child.keys else _common(child.keys, keys, pos)
            if m == length:
                if pos + m == n:
                    return child, splits
                node, pos, depth = child, pos + m, depth + 1
                continue
            node = self._split(child, m)  # NOTE: keys diverge before any tail key (tails are unique): m full blocks
            splits[child] = node
            pos, depth = pos + m, depth + 2
        if pos == n:
            return node, splits
        rest = keys[pos:]
        tokens = (len(rest) - (1 if tail else 0)) * B + tail
        leaf = self._new_node(rest, tokens, node, node.context_length + tokens, depth + 1)
        node.children[rest[0]] = leaf
        return leaf, splits

    def _split(self, child: _Node, m: int) -> _Node:
        B = self.block_size
        parent = child.parent
        new = self._new_node(child.keys[:m], m * B, parent, parent.context_length + m * B, child.depth)
        new.ref = list(child.ref)
        new.win = child.win  # the same window nodes below (the new node is not one yet)
        new.children = {child.keys[m]: child}
        child.keys = child.keys[m:]
        child.tokens -= m * B
        if child.slot >= 0:
            self._table.set_tokens(child)
        child.parent = new
        child.depth = new.depth + 1
        parent.children[new.keys[0]] = new
        return new

    def find(self, keys: list[Hashable]) -> _Node:
        """Upstream `find_node`: the node a routed prompt's path ends at (paths are never removed)."""
        node, pos = self.root, 0
        while pos < len(keys) and keys[pos] in node.children:
            child = node.children[keys[pos]]
            node, pos = child, pos + len(child.keys)
        return node

    # ------------------------------------------------------------------ allocations (lazy subtree moves)
    def resolve(self, node: _Node) -> set[int] | None:
        """`node`'s allocation now (None: never allocated): its own, unless an ancestor's subtree move came later."""
        best_stamp, best = node.stamp, node.alloc  # NOTE: its own write wins a tie (it came after the move)
        parent = node.parent
        while parent is not None:
            if parent.tag_stamp > best_stamp:
                best_stamp, best = parent.tag_stamp, parent.tag
            parent = parent.parent
        return best

    def path_allocs(self, leaf: _Node) -> tuple[list[_Node], list[set[int] | None]]:
        """The path leaf -> root and each node's allocation now (`resolve`, in one walk)."""
        path = []
        node = leaf
        while node is not None:
            path.append(node)
            node = node.parent
        if not self._stamp:  # no subtree was ever moved: every node's own allocation is its allocation
            return path, [node.alloc for node in path]
        allocs = [None] * len(path)
        carry_stamp, carry = -1, None
        for i in range(len(path) - 1, -1, -1):
            node = path[i]
            allocs[i] = node.alloc if node.stamp >= carry_stamp else carry
            if node.tag_stamp > carry_stamp:
                carry_stamp, carry = node.tag_stamp, node.tag
        return path, allocs

    def write_alloc(self, node: _Node, gpus: set[int]) -> None:
        """`node`'s own allocation is now `gpus` (and its row in the window's table, if it has one)."""
        node.alloc, node.stamp = gpus, self._stamp
        if node.slot >= 0:
            self._table.set_alloc(node, gpus)

    def nodes(self) -> list[_Node]:
        """Every node of the tree, root first."""
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    @staticmethod
    def important(node: _Node) -> _Node:
        while node.tokens <= node.context_length - node.tokens:  # not node.is_large(), inlined (per request)
            node = node.parent
        return node

    def _after_splits(self, splits: dict[_Node, _Node]) -> None:
        """Upstream `handle_split_nodes_gpu_allocations` then `handle_split_node_histogram`."""
        stamp = self._stamp
        for child, new in splits.items():
            new.alloc, new.stamp = set(self.resolve(child) or ()), stamp
        for child, new in splits.items():
            if new.is_large() and not child.is_large():
                self._rename(child, new)
                for g in self.resolve(child) or ():
                    data = self._ttft.pop((child, g), None)
                    if data is not None:
                        self._ttft[(new, g)] = data

    def _rename(self, old: _Node, new: _Node) -> None:
        if old not in self.prompt_sum:
            return
        old.win -= 1  # `new` is old's parent: its count already holds the window node, now itself
        for table in (self.prompt_sum, self.count, self.miss_rate, self.hit_tokens, self.prompt_tokens,
                      self.out_tokens):
            table[new] = table.pop(old)
        self._table.remove(old)
        self._table.add(new, self.count[new], self.miss_rate[new], self.out_tokens[new])  # last, as in the dicts
        box = self._boxes.pop(old)
        box[0] = new  # every window entry of `old` now names `new` (no pass over the window)
        self._boxes[new] = box

    # ------------------------------------------------------------------ load cost
    def tpot(self, gpu: int) -> float:
        fixed = self.options.tpot_s
        return self._tpot_median[gpu] if fixed is None else fixed

    def prefill_cost(self, node: _Node) -> float:
        return (self.miss_rate[node] * self.count[node] * self.options.prefill_token_s * node.tokens
                / len(self.alloc[node]))

    def node_cost(self, node: _Node, gpu: int, tpot: float) -> float:
        return self.prefill_cost(node) + node.ref[gpu] * self.out_tokens[node] * tpot

    def load_costs(self, min_count: int = 0) -> list[float]:
        """Upstream `current_allocation_per_gpu` (min_count 0) / `..._with_atleast_min_load(2)`: per GPU, over the
        window's nodes counted at least `min_count` times and allocated to it, in window order,
        `prefill_cost(node) + ref[g] * out * TPOT_g` (node_cost), summed in the window's order (numpy columns,
        `WindowTable.load_costs`: the same floats)."""
        return self._table.load_costs(min_count, [self.tpot(g) for g in range(self.num_workers)])

    # ------------------------------------------------------------------ decision
    def route(self, request: Request, view: ClusterView) -> int:
        keys, tail = self.request_keys(request)
        leaf, splits = self.insert(keys, tail)
        self._after_splits(splits)
        if leaf.tokens < leaf.context_so_far:
            self.exploited += 1
            holders = None
            for holders in self.path_allocs(leaf)[1]:  # leaf -> root: the deepest node with an allocation
                if holders:
                    break
            # NOTE: holders are routable (a GPU that left is taken out of every allocation).
            candidates = sorted(holders) if holders else list(self.workers)
            if len(candidates) == 1:
                gpu = candidates[0]
            else:
                cost = self.load_costs()
                costs = [cost[g] for g in candidates]
                i = costs.index(min(costs))
                gpu = self.workers[i] if self.options.holder_pick == "position" else candidates[i]
        else:
            self.explored += 1
            cost = self.load_costs()
            gpu = min(self.workers, key=cost.__getitem__)  # the first minimum, as list.index(min)
        self._pending = (request.request_id, leaf, self.important(leaf))
        return gpu

    def after_dispatch(self, request: Request, worker: int) -> None:
        pending = self._pending
        if pending is None or pending[0] != request.request_id:
            raise RuntimeError(f"preble: request {request.request_id} dispatched without being routed by this router")
        _, leaf, important = pending
        self._pending = None
        now = self.view.now_s
        self._sent_s[request.request_id] = now
        path, allocs = self.path_allocs(leaf)
        self._belief[request.request_id] = self._believed(path, allocs, worker)
        stamp = self._stamp
        # upstream update_gpu_allocation_for_parent and update_allocated_size, root included. NOTE: every node of
        # the path gets its allocation written (if unchanged, as it is), so that a window node's own is current.
        table = self._table
        for node, gpus in zip(path, allocs):
            if gpus is None:
                gpus = {worker}
            elif worker not in gpus:
                gpus = gpus | {worker}
            node.alloc, node.stamp = gpus, stamp
            node.ref[worker] += 1
            if node.slot >= 0:
                table.add_ref(node, worker, 1)
                table.set_alloc(node, gpus)
        self._window_add(now, important, leaf, request.output_tokens)
        self.routed[worker] += 1
        if self.options.rebalancing and leaf.depth - important.depth < self.options.rebalancing_chain_length:
            self.rebalance(now)

    @staticmethod
    def _believed(path: list[_Node], allocs: list[set[int] | None], worker: int) -> int:
        """Tokens Preble counts on `worker`: the path from the root (`path`: leaf -> root, with its allocations)
        while each node is allocated to it."""
        tokens = 0
        for i in range(len(path) - 2, -1, -1):  # the root (last) is not counted
            gpus = allocs[i]
            if not gpus or worker not in gpus:
                break
            tokens += path[i].tokens
        return tokens

    def _window_add(self, now: float, node: _Node, leaf: _Node, out_tokens: int) -> None:
        """Upstream `SlidingWindowHistogram.update`: count the request, then drop entries older than the window."""
        box = self._boxes.get(node)
        if box is None:
            box = self._boxes[node] = [node]
        self._window.append((now, box, leaf))
        if node not in self.prompt_sum:
            up = node
            while up is not None:
                up.win += 1
                up = up.parent
        self.prompt_sum[node] = self.prompt_sum.get(node, 0) + leaf.context_length
        self.count[node] = self.count.get(node, 0) + 1
        self.out_tokens[node] = out_tokens
        self.hit_tokens[node] = self.hit_tokens.get(node, 0) + leaf.context_so_far
        self.prompt_tokens[node] = self.prompt_tokens.get(node, 0) + leaf.context_length
        self.miss_rate[node] = 1 - self.hit_tokens[node] / self.prompt_tokens[node]
        table = self._table
        if node.slot < 0:
            table.add(node, self.count[node], self.miss_rate[node], out_tokens)
        else:
            table.set_stats(node, self.count[node], self.miss_rate[node], out_tokens)
        start = now - self.options.window_s
        window = self._window
        while window and window[0][0] < start:
            _, box, old_leaf = window.popleft()
            old = box[0]
            # NOTE: upstream reads the leaf's sizes now, not as they were added (a later split changes them)
            self.prompt_sum[old] -= old_leaf.context_length
            self.count[old] -= 1
            self.hit_tokens[old] -= old_leaf.context_so_far
            self.prompt_tokens[old] -= old_leaf.context_length
            if self.prompt_sum[old] <= 0:
                for column in (self.prompt_sum, self.count, self.miss_rate, self.hit_tokens, self.prompt_tokens,
                               self.out_tokens):
                    del column[old]
                del self._boxes[old]  # its last entry (prompt_sum is the sum of its entries' context lengths)
                up = old
                while up is not None:
                    up.win -= 1
                    up = up.parent
                table.remove(old)
                old.alloc, old.stamp = set(), self._stamp  # upstream: "reset the gpu allocation outside the time window"
            else:
                table.set_count(old, self.count[old])

    # ------------------------------------------------------------------ membership
    def after_set_workers(self, left, joined, renewed) -> None:
        gone = set(left) | set(renewed)
        if gone:
            # NOTE: allocation sets may be shared between nodes and are never changed in place: new sets are put.
            # One new set per old one, so that nodes sharing a set still share one (the old sets are kept here).
            # Own allocations and subtree moves' tags alike: whichever a node's allocation comes from loses them.
            changed: dict[int, tuple[set[int], set[int]]] = {}

            def without(gpus: set[int] | None) -> set[int] | None:
                if not gpus or not gpus & gone:
                    return gpus
                entry = changed.get(id(gpus))
                if entry is None:
                    entry = changed[id(gpus)] = (gpus, gpus - gone)
                return entry[1]

            for node in self.nodes():
                node.alloc = without(node.alloc)
                node.tag = without(node.tag)
                if node.slot >= 0:
                    self._table.set_alloc(node, node.alloc)
            self._ttft = {key: data for key, data in self._ttft.items() if key[1] not in gone}
        seed = self.options.initial_tpot_s
        for g in renewed:
            self._tpots[g] = deque([seed], maxlen=self.options.tpot_samples)
            self._tpots_sorted[g] = [seed]
            self._tpot_median[g] = seed

    # ------------------------------------------------------------------ feedback
    def after_first_token(self, request: Request, worker: int) -> None:
        self._first_s[request.request_id] = self.view.now_s

    def after_complete(self, request: Request, worker: int) -> None:
        now = self.view.now_s
        sent = self._sent_s.pop(request.request_id, now)
        first = self._first_s.pop(request.request_id, now)
        keys, _ = self.request_keys(request)
        node = self.find(keys)
        self._ttft_add(now, self.important(node), worker, first - sent)
        table = self._table
        while node is not self.root:  # upstream dec_ref_counter stops below the root
            node.ref[worker] -= 1
            if node.slot >= 0:
                table.add_ref(node, worker, -1)
            node = node.parent
        if request.output_tokens > 1 and now > first:
            window, ordered = self._tpots[worker], self._tpots_sorted[worker]
            tpot = (now - first) / (request.output_tokens - 1)
            if len(window) == window.maxlen:
                del ordered[bisect_left(ordered, window[0])]  # the sample the append drops
            window.append(tpot)
            insort(ordered, tpot)
            # statistics.median(window), read off the sorted copy: the middle sample, or the mean of the two
            k = len(ordered)
            self._tpot_median[worker] = ordered[k // 2] if k % 2 else (ordered[k // 2 - 1] + ordered[k // 2]) / 2

    def _ttft_add(self, now: float, node: _Node, gpu: int, ttft_s: float) -> None:
        data = self._ttft.setdefault((node, gpu), deque())
        data.append((now, ttft_s))
        while data and data[0][0] < now - self.options.window_s:
            data.popleft()

    def overloaded(self, node: _Node, gpu: int, now: float) -> bool:
        """Upstream `TTFTWindowedOverloadedDetector.is_node_overloaded`: the mean TTFT of the window's second half
        is at least twice the first half's (both halves non-empty)."""
        data = self._ttft.get((node, gpu))
        if not data:
            return False
        cutoff = now - self.options.window_s / 2
        first = [v for t, v in data if t < cutoff]
        second = [v for t, v in data if t >= cutoff]
        if not first or not second:
            return False
        return sum(second) / len(second) >= 2 * (sum(first) / len(first))

    # ------------------------------------------------------------------ rebalancing
    def rebalance(self, now: float) -> None:
        """Upstream `handle_important_node_stealing`."""
        opts = self.options
        if sum(self.routed) < opts.rebalance_after_requests_per_gpu * len(self.workers):
            return
        cost = self.load_costs(min_count=2)
        ranked = sorted(((g, cost[g]) for g in self.workers), key=lambda gc: -gc[1])
        self._steal(ranked, now)

    def _steal(self, ranked: list[tuple[int, float]], now: float) -> None:
        opts = self.options
        high = opts.high_load_threshold
        while len(ranked) > 1:
            larger, larger_cost = ranked[0]
            smaller, smaller_cost = ranked[-1]
            if larger_cost < high * smaller_cost:
                return
            if opts.min_rebalancing_interval_s is not None:
                last = self._last_rebalance_s
                if last is not None and now - last < opts.min_rebalancing_interval_s:
                    return
                self._last_rebalance_s = now
            # Large nodes of the window counted more than once and allocated to `larger`, by node_cost on it
            # (ascending; ties by creation order): the window's columns (`WindowTable.steal_candidates`).
            candidates = self._table.steal_candidates(larger, self.tpot(larger))
            if len(candidates) == 1:
                moved, node = candidates[0]
                moved /= 2  # the node's load is split in two
                if smaller not in node.alloc and self.overloaded(node, larger, now):
                    larger_cost -= moved
                    smaller_cost += moved
                    self.write_alloc(node, node.alloc | {smaller})
                    self._ttft.pop((node, larger), None)
            else:
                rows: list[int] = []  # the window rows the moves write, written at once after them
                for moved, node in candidates:
                    if larger_cost - moved < smaller_cost + moved:
                        break
                    larger_cost -= moved
                    smaller_cost += moved
                    node.alloc, node.stamp = {smaller}, self._stamp  # a window node: its row below
                    rows.append(node.slot)
                    self._assign_subtree(node, smaller, rows)
                    if larger_cost < high * smaller_cost:
                        break
                if rows:
                    self._table.set_rows_to_one_gpu(rows, smaller)
            ranked[0] = (larger, larger_cost)
            ranked[-1] = (smaller, smaller_cost)
            ranked = ranked[1:]

    def _assign_subtree(self, node: _Node, gpu: int, rows: list[int]) -> None:
        """Every node below `node` is allocated to `gpu` alone (upstream `update_gpu_allocation_for_subtree`).

        Lazily: the move is a tag on `node`, of a new epoch, that every node below it reads as its allocation until
        the node's own is written again (`resolve`); the window's nodes below it, which the load costs read
        directly, get theirs written now (the subtrees holding one are found by their `win` counts), their table
        rows appended to `rows` for the caller to write (`WindowTable.set_rows_to_one_gpu`). A move
        visits the paths down to the window's nodes, not the whole subtree (upstream's walk, and kvsim's before,
        visited ~87 nodes a move on the conversation trace)."""
        if not node.children:
            return  # nothing below (a node made later is stamped after the move: no tag would reach it)
        only = {gpu}  # one set for the whole subtree: sets in `alloc` are never changed in place
        self._stamp += 1
        stamp = self._stamp
        node.tag, node.tag_stamp = only, stamp
        stack = [child for child in node.children.values() if child.win]
        pop = stack.pop
        while stack:
            child = pop()
            if child.slot >= 0:  # in the window
                child.alloc, child.stamp = only, stamp
                rows.append(child.slot)
            for below in child.children.values():
                if below.win:
                    stack.append(below)
