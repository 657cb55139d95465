"""Consistent hashing of the first K prompt blocks, optionally with bounded loads (CHWBL).

Strict mode is SGLang gateway's `prefix_hash` ring without its load check; with `load_factor` c set it is
consistent hashing with bounded loads (Mirrokni, Thorup, Zadimoghaddam, SODA'18), as KubeAI's `PrefixHash` walks
it: from the key, clockwise, the first worker whose in-flight count + 1 <= ceil(c * (total in flight + 1) / workers);
if none qualifies, the key's own worker.
NOTE: the bin capacity is rounded up as in the paper; KubeAI's unrounded bound would send every request home
whenever the cluster is nearly idle (no worker could take one more).

Membership: the ring holds `virtual_nodes` points per routable worker, each the hash of (instance id, point number):
a ring of the worker set, as SGLang's and KubeAI's rings are rebuilt from the current workers' names (URLs, pod
names). So a join adds only the new instance's points (exactly the keys whose first point clockwise is now one of them
move, all to the new worker) and a leave removes only the departed instance's points (exactly its keys move, each to
the next point clockwise): consistent hashing's minimal remap (Karger et al., STOC'97). A new instance in a reused
slot has new points. The bounded load counts the routable workers' in-flight requests over their number.
"""

from __future__ import annotations

import bisect
import hashlib
import math

from pydantic import Field

from policies.base import RouterBase, RouterOptions
from sim.workloads.request import Request
from sim.routing.interface import ClusterView
from sim.routing.knobs import FloatKnob, IntKnob


def stable_hash64(value: object) -> int:
    """A 64-bit hash that is the same in every process (unlike `hash()` of a str)."""
    return int.from_bytes(hashlib.blake2b(repr(value).encode(), digest_size=8).digest(), "big")


class PrefixHashOptions(RouterOptions):
    prefix_blocks: int = Field(16, ge=1, description="Leading full prompt blocks that form the key (16 x 16 = SGLang's 256 tokens).")
    load_factor: float | None = Field(None, gt=1.0, description="Bounded-load factor c > 1 (KubeAI 1.25); null = strict consistent hashing.")
    virtual_nodes: int = Field(256, ge=1, description="Ring points per worker (KubeAI replication 256).")


class PrefixHashRouter(RouterBase):
    name = "prefix-hash"
    summary = "consistent hash of the first K blocks, optional bounded load (CHWBL)"
    Options = PrefixHashOptions
    search_space = (IntKnob("prefix_blocks", 1, 64, log=True), FloatKnob("load_factor", 1.05, 4))

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._build_ring()
        self.ignores_cluster_state = self.options.load_factor is None  # strict hashing reads no load

    def _build_ring(self) -> None:
        """The ring of the routable workers: point (instance, v) hashed, owned by the instance's slot. A fixed
        fleet's instance ids are its slots, so its ring is the one hashed from worker indices."""
        points = sorted(
            (stable_hash64(("worker", instance, v)), w)
            for w, instance in zip(self.workers, self.instances)
            for v in range(self.options.virtual_nodes)
        )
        self._ring_keys = [p for p, _ in points]
        self._ring_workers = [w for _, w in points]

    def after_set_workers(self, left, joined, renewed) -> None:
        self._build_ring()

    def ring_walk(self, request: Request):
        """Workers in ring order from the request's key, each once."""
        key = stable_hash64(request.block_hashes[: self.options.prefix_blocks])
        start = bisect.bisect_left(self._ring_keys, key)
        seen: set[int] = set()
        n = len(self._ring_workers)
        for k in range(n):
            w = self._ring_workers[(start + k) % n]
            if w not in seen:
                seen.add(w)
                yield w
                if len(seen) == len(self.workers):
                    return

    def route(self, request: Request, view: ClusterView) -> int:
        walk = self.ring_walk(request)
        home = next(walk)
        factor = self.options.load_factor
        if factor is None:
            return home
        load = self.in_flight  # the router's own in-flight counts (per replica)
        total = sum(load[w] for w in self.workers)
        capacity = math.ceil(factor * (total + 1) / len(self.workers))
        if load[home] + 1 <= capacity:
            return home
        for w in walk:
            if load[w] + 1 <= capacity:
                return w
        return home
