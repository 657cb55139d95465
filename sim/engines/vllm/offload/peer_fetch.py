"""Dynamo KVBM's G2 peer fetch ("remote search") for the host tier: a lookup whose local run of CPU chunks ends
asks the other workers' host tiers for the rest, pulls the first holder's contiguous run into its own host tier over
its NIC, and waits; once the pull is stored the next lookup is an ordinary host hit loaded over PCIe.

What is modelled, and where KVBM decides it (github ai-dynamo/dynamo `lib/kvbm-engine/src/leader/remote_search.rs`
at 660f802) is in docs/concepts/kv-tiers.md, "G2 peer fetch". kvsim's holders are the peers' `CpuOffloadingManager`s
themselves (completed stores only), asked in worker order: an exact indexer, where KVBM's hub samples hashes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sim.engines.interface import HostLink


@dataclass(slots=True)
class PeerFetch:
    """A worker's access to its peers' host tiers: their managers (worker order, itself excluded), its NIC, and
    the fewest chunks past the local run worth asking for (KVBM's `min_remote_tokens` in blocks, default 1)."""

    link: HostLink
    min_blocks: int = 1
    peers: list = field(default_factory=list)
    """The other workers' `CpuOffloadingManager`s in worker order (set by the cluster)."""
