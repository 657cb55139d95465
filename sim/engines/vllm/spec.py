"""The `engine:` section of a scenario for vLLM v1 (`kind: vllm`): its options, defaults and capacity arithmetic."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from sim.config import ConfigModel
from sim.engines.vllm.behaviour import DEFAULT_VLLM_VERSION, parse_version
from sim.engines.vllm.math_utils import cdiv


class SharedLinkSpec(ConfigModel):
    """A worker's network path to the cluster-shared KV store (`sim.cluster.network_link`); the defaults are kvsim's
    assumptions for an RDMA store such as Mooncake Store (docs/concepts/kv-tiers.md, section "Defaults")."""

    bandwidth: float = Field(
        2.2e10, gt=0, allow_inf_nan=False,
        description="Bytes/s per direction of one device's NIC to the store: 2.2e10 = a 200 Gb/s RDMA NIC per GPU "
                    "at ~88 % of line rate (Mooncake's Transfer Engine reports 87 GB/s over 4 x 200 Gb/s NICs).")
    latency_s: float = Field(2e-5, ge=0, allow_inf_nan=False,
                             description="Network latency per copy (pipelined: it does not hold the NIC's queue).")
    overhead_s: float = Field(
        1e-4, ge=0, allow_inf_nan=False,
        description="Per-transfer cost that holds the NIC's queue: the store's metadata lookup or allocation and "
                    "the transfer's set-up (Mooncake: a master RPC per get/put batch).")
    store_bandwidth: float | None = Field(
        None, gt=0, allow_inf_nan=False,
        description="The store's aggregate bytes/s per direction, shared by every worker's copies (its memory "
                    "nodes' NICs); null: not a bottleneck.")


class VllmEngineSpec(ConfigModel):
    """vLLM v1 with prefix caching (`sim/engines/vllm/`); defaults are `vllm serve`'s for GPUs under 70 GiB."""

    kind: Literal["vllm"] = Field("vllm", description="Engine: vLLM v1 (block prefix cache, step scheduler).")
    vllm_version: str = Field(
        DEFAULT_VLLM_VERSION,
        description="vLLM release whose cache and scheduler rules apply: 0.10.0 to 0.33.x (what changed between them: "
                    "docs/engines/vllm-rules.md section 1; 0.27.0 and later follow the same rules). The default, "
                    "0.31.0, is the release the reference experiment ran (the built-in scenario's measurements); "
                    "kvsim is checked block for block against 0.33.0's own scheduler, whose rules 0.31.0 shares.")
    block_size: int = Field(16, ge=1, description="KV block size in tokens (also the block size of the prompt hashes routers read).")
    kv_cache_bytes: int = Field(gt=0, description="KV cache bytes per worker (vLLM --kv-cache-memory-bytes).")
    num_gpu_blocks_override: int | None = Field(None, ge=2, description="Use this block count (null block included) instead of the bytes.")
    max_num_batched_tokens: int = Field(8192, ge=1, description="Token budget per engine step.")
    max_num_seqs: int = Field(256, ge=1, description="Most requests running at once per worker.")
    max_model_len: int = Field(4096, ge=2, description="Longest sequence (prompt + output) in tokens.")
    cpu_kv_bytes: int = Field(
        0, ge=0,
        description="Host (CPU) KV tier per worker in bytes (vLLM --kv-offloading-size x 2^30: the OffloadingConnector, "
                    "rules of vLLM 0.33.0's connector whatever vllm_version says); 0: none. Prompts' full blocks are "
                    "copied there as they are computed and loaded back when the GPU no longer holds them, timed on "
                    "the device's host link (time_model.host_link).")
    cpu_eviction_policy: Literal["lru", "arc"] = Field(
        "lru", description="The host tier's eviction policy (kv_connector_extra_config eviction_policy): vLLM's "
                           "default lru (request-scoped recency), or arc (adaptive replacement: chunks seen once "
                           "vs reused, with ghost lists), both as in vLLM 0.33.0's CPU offloading manager.")
    cpu_kv_connector: Literal["offloading", "lmcache"] = Field(
        "offloading",
        description="The connector that runs the host tier (cpu_kv_bytes): vLLM's own OffloadingConnector "
                    "(offloading), or LMCache 0.5.6 in-process (lmcache: kv_connector LMCacheConnectorV1, "
                    "lmcache_chunk_tokens-token chunks, synchronous loads and stores, LRU touched on lookup hits; "
                    "cpu_kv_bytes is its max_local_cpu_size x TP; docs/engines/lmcache-0.5.6-rules.md).")
    lmcache_chunk_tokens: int = Field(
        256, ge=1, description="LMCache's chunk_size in tokens (its default 256); a multiple of block_size.")
    shared_kv_bytes: int = Field(
        0, ge=0,
        description="A cluster-shared KV store in bytes, one capacity for the whole cluster (Mooncake Store, an "
                    "LMCache server, Dynamo's G3): every worker writes its prompts' full blocks through to it and "
                    "loads what any worker stored, over its device's network link (shared_link); 0: none. With a "
                    "host tier too, the two chain as vLLM's MultiConnector [host, shared]: a request loads from the "
                    "first tier with a hit (docs/concepts/kv-tiers.md).")
    shared_eviction_policy: Literal["lru", "arc"] = Field(
        "lru", description="The shared store's eviction policy, the host tier's managers' lru or arc.")
    shared_link: SharedLinkSpec = Field(default_factory=SharedLinkSpec,
                                        description="Each device's network link to the shared store.")
    peer_fetch: bool = Field(
        False, description="Dynamo KVBM's G2 peer fetch (remote search): a lookup whose host-tier run ends pulls the "
                           "rest from the first other worker whose host tier holds it, over the device's NIC "
                           "(shared_link's bandwidth and latency), into its own host tier, then loads it over PCIe "
                           "(docs/concepts/kv-tiers.md). Needs cpu_kv_bytes > 0 (the offloading connector).")
    peer_min_blocks: int = Field(
        1, ge=1, description="The fewest prompt blocks past the local host-tier run worth asking the peers for "
                             "(KVBM's min_remote_tokens in blocks).")
    free_order: Literal["tail-first", "head-first"] = Field(
        "tail-first",
        description="Order a finished request's blocks enter the free queue: vLLM's tail-first, or the naive-LRU "
                    "ablation head-first (no vLLM release does this).",
    )

    @model_validator(mode="after")
    def _lmcache(self) -> VllmEngineSpec:
        if self.cpu_kv_connector == "lmcache":
            if self.lmcache_chunk_tokens % self.block_size:
                raise ValueError(f"engine.lmcache_chunk_tokens: {self.lmcache_chunk_tokens} is not a multiple of "
                                 f"block_size {self.block_size}")
            if self.shared_kv_bytes:
                raise ValueError("engine.cpu_kv_connector: lmcache does not chain with a shared store in kvsim "
                                 "(shared_kv_bytes); allowed with a shared store: offloading")
        return self

    @model_validator(mode="after")
    def _peer_fetch(self) -> VllmEngineSpec:
        if self.peer_fetch:
            if not self.cpu_kv_bytes or self.cpu_kv_connector != "offloading":
                raise ValueError("engine.peer_fetch: needs a host tier run by the offloading connector "
                                 "(cpu_kv_bytes > 0, cpu_kv_connector offloading)")
            if self.shared_kv_bytes:
                raise ValueError("engine.peer_fetch: not modelled with a shared store (shared_kv_bytes); allowed "
                                 "with peer_fetch: shared_kv_bytes 0")
        return self

    @field_validator("vllm_version")
    @classmethod
    def _version(cls, v: str) -> str:
        parse_version(v)
        return v

    @property
    def version(self) -> str:
        return self.vllm_version

    def num_blocks(self, kv_bytes_per_token: int) -> int:
        """vLLM's `num_gpu_blocks`, null block included: floor(kv_cache_bytes / (block_size x kv_bytes_per_token))."""
        if self.num_gpu_blocks_override is not None:
            return self.num_gpu_blocks_override
        return self.kv_cache_bytes // (self.block_size * kv_bytes_per_token)

    def num_cpu_chunks(self, kv_bytes_per_token: int) -> int:
        """The host tier's chunks (one GPU block each), as vLLM's `CPUOffloadingSpec` counts them: floor(bytes /
        block bytes rounded up to the 4 KiB page) (`CS` 106-130)."""
        block_bytes = self.block_size * kv_bytes_per_token
        return self.cpu_kv_bytes // (-(-block_bytes // 4096) * 4096)

    def num_lmcache_chunks(self, kv_bytes_per_token: int) -> int:
        """The LMCache tier's chunks: floor(bytes / chunk bytes rounded up to the 4 KiB page), as its
        `LocalCPUBackend` sizes equal objects (rules §1.6)."""
        chunk_bytes = self.lmcache_chunk_tokens * kv_bytes_per_token
        return self.cpu_kv_bytes // (-(-chunk_bytes // 4096) * 4096)

    def num_shared_chunks(self, kv_bytes_per_token: int) -> int:
        """The shared store's chunks (one GPU block each), counted as the host tier counts its own."""
        block_bytes = self.block_size * kv_bytes_per_token
        return self.shared_kv_bytes // (-(-block_bytes // 4096) * 4096)

    def capacity_tokens(self, kv_bytes_per_token: int) -> int:
        """Usable token slots: every block but the null block."""
        return (self.num_blocks(kv_bytes_per_token) - 1) * self.block_size

    def max_request_tokens(self, kv_bytes_per_token: int) -> int:
        return min(self.max_model_len, self.capacity_tokens(kv_bytes_per_token))

    def check_fits(self, longest_request_tokens: int, kv_bytes_per_token: int) -> None:
        """Raise (naming the field) if the cache cannot exist or one request of this length could never run."""
        num_blocks = self.num_blocks(kv_bytes_per_token)
        field = "num_gpu_blocks_override" if self.num_gpu_blocks_override is not None else "kv_cache_bytes"
        if num_blocks < 2:
            raise ValueError(f"engine.kv_cache_bytes={self.kv_cache_bytes} gives {num_blocks} blocks of "
                             f"{self.block_size} tokens; need >= 2")
        if longest_request_tokens > self.max_model_len:
            raise ValueError(f"workload prompt+output = {longest_request_tokens} tokens exceeds "
                             f"engine.max_model_len={self.max_model_len}")
        needed = cdiv(longest_request_tokens, self.block_size)
        if needed > num_blocks - 1:
            raise ValueError(f"one request needs {needed} blocks but a worker has {num_blocks - 1} usable: "
                             f"raise engine.{field}")

    def capacity_overrides(self, *, tokens: int | None = None, blocks: int | None = None,
                           kv_bytes: int | None = None) -> dict[str, object]:
        """Scenario overrides that set the KV capacity: `tokens` usable slots, `blocks` as vLLM counts them
        (null block included) or `kv_bytes`."""
        if tokens is not None:
            return {"engine.num_gpu_blocks_override": tokens // self.block_size + 1}
        if blocks is not None:
            return {"engine.num_gpu_blocks_override": blocks}
        return {"engine.kv_cache_bytes": kv_bytes, "engine.num_gpu_blocks_override": None}

    def overrides_for_run(self, setup) -> dict[str, object]:
        """Scenario overrides (dotted paths) that give a worker a measured run's vLLM setup (`setup`: a
        `sim.servers.run_csv.RunSetup`): its block count, the limits it gives, its version where kvsim knows it."""
        overrides: dict[str, object] = {"engine.num_gpu_blocks_override": setup.blocks_per_worker}
        for field in ("max_num_batched_tokens", "max_num_seqs", "max_model_len"):
            if getattr(setup, field) is not None:
                overrides[f"engine.{field}"] = getattr(setup, field)
        try:
            parse_version(setup.engine.version)
            if setup.engine.name == "vllm":
                overrides["engine.vllm_version"] = setup.engine.version
        except ValueError:
            pass  # an unknown version string: keep the scenario's rules
        return overrides
