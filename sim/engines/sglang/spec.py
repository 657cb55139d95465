"""The `engine:` section of a scenario for SGLang (`kind: sglang`): its options, defaults and capacity arithmetic.

Defaults are SGLang 0.5.23's for a generic dense model on a CUDA GPU (`python/sglang/srt/server_args.py` and
`arg_groups/`; cited in `docs/engines/sglang-0.5.23-semantics.md` §10).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from sim.config import ConfigModel
from sim.engines.sglang.evict_policy import EVICTION_POLICIES

SGLANG_VERSIONS = ("0.5.23",)

SCHEDULE_POLICIES = ("fcfs", "lpm", "dfs-weight")
"""`--schedule-policy` values kvsim reproduces (`schedule_policy.py`; SGLang also has random, lof, priority,
routing-key, hrrn and shortest-prefill-first)."""

EvictionPolicy = Literal[tuple(EVICTION_POLICIES)]  # type: ignore[valid-type]
SchedulePolicyName = Literal[SCHEDULE_POLICIES]  # type: ignore[valid-type]


class SglangEngineSpec(ConfigModel):
    """SGLang with RadixAttention (`sim/engines/sglang/`)."""

    kind: Literal["sglang"] = Field("sglang", description="Engine: SGLang (token radix tree, prefill/decode batches).")
    sglang_version: Literal[SGLANG_VERSIONS] = Field("0.5.23", description="SGLang release whose rules apply.")  # type: ignore[valid-type]
    block_size: int = Field(16, ge=1, description="Block size (tokens) of the prompt hashes that routers read (the radix tree itself works in pages of page_size).")
    page_size: int = Field(1, ge=1, description="Tokens per KV page (--page-size): matches, inserts and allocation are whole pages.")
    kv_cache_bytes: int = Field(gt=0, description="KV cache bytes per worker: max_total_num_tokens = floor(bytes / KV bytes per token), page-aligned.")
    max_total_tokens: int | None = Field(None, ge=1, description="KV slots per worker, replacing the bytes (like --max-total-tokens when it is the smaller).")
    max_model_len: int = Field(4096, ge=2, description="Context length (--context-length): a request's prompt must be shorter than min(this, KV slots) - 6.")
    chunked_prefill_size: int | None = Field(8192, ge=1, description="Prefill token budget per batch (--chunked-prefill-size; SGLang's default by GPU memory: 2048 under 20 GiB, 4096 under 60, 8192 under 160, 16384 above); null disables chunking.")
    max_prefill_tokens: int = Field(16384, ge=1, description="Prefill token cap per batch (--max-prefill-tokens).")
    max_running_requests: int | None = Field(None, ge=1, description="Requests running at once (--max-running-requests); default min(max(min(KV slots / context length x 512, 4096), 2048), KV slots / 2).")
    schedule_policy: SchedulePolicyName = Field("fcfs", description="Waiting-queue order (--schedule-policy): fcfs, lpm (longest prefix match), dfs-weight.")  # type: ignore[valid-type]
    radix_eviction_policy: EvictionPolicy = Field("lru", description="Radix-tree eviction order (--radix-eviction-policy): lru, lfu, fifo, mru, filo, priority, slru.")  # type: ignore[valid-type]
    schedule_conservativeness: float = Field(1.0, gt=0, description="Scales the initial new_token_ratio (0.7 x this, at most 1).")
    disable_overlap_schedule: bool = Field(False, description="Process each batch's result before scheduling the next (--disable-overlap-schedule); by default the next batch is scheduled while one runs.")
    ignore_eos: bool = Field(True, description="Requests are sent with ignore_eos and max_tokens = their output length (kvsim's workloads fix output lengths); false: they stop on EOS after their output length, and admission reserves max_new_tokens.")
    max_new_tokens: int | None = Field(None, ge=1, description="With ignore_eos false: the max_tokens clients send (reserved by admission); null: each request's own output length.")
    # HiCache (docs/engines/sglang-hicache.md); a group of its own
    cpu_kv_bytes: int = Field(0, ge=0, description="HiCache host (CPU) KV tier per worker in bytes (--enable-hierarchical-cache with --hicache-size = this / 1e9; kvsim --cpu-kv-gib x 2^30); 0: none. Host slots: (floor(floor(bytes / KV bytes per token) / page_size) + 1) x page_size. The tree keeps nodes on the device, the host or both, loads host hits back at admission and times its copies on the device's host link (time_model.host_link).")
    hicache_write_policy: Literal["write_through", "write_through_selective", "write_back"] = Field("write_through", description="When the device copies a node to the host (--hicache-write-policy): write_through on its first insert, write_through_selective on its second hit, write_back only when it is evicted from the device.")

    @property
    def version(self) -> str:
        return self.sglang_version

    def max_total_num_tokens(self, kv_bytes_per_token: int) -> int:
        """SGLang's `max_total_num_tokens`: KV bytes / bytes per token, page-aligned, capped by max_total_tokens."""
        n = self.kv_cache_bytes // kv_bytes_per_token if self.max_total_tokens is None else self.max_total_tokens
        return n // self.page_size * self.page_size

    def num_blocks(self, kv_bytes_per_token: int) -> int:
        """KV pages per worker."""
        return self.max_total_num_tokens(kv_bytes_per_token) // self.page_size

    def num_cpu_chunks(self, kv_bytes_per_token: int) -> int:
        """HiCache's host pages per worker (0 without a host tier): `--hicache-size`'s slots / page_size
        (`sim.engines.sglang.hiradix_cache.host_capacity_tokens`)."""
        if not self.cpu_kv_bytes:
            return 0
        from sim.engines.sglang.hiradix_cache import host_capacity_tokens

        return host_capacity_tokens(self.cpu_kv_bytes, kv_bytes_per_token, self.page_size) // self.page_size

    def capacity_tokens(self, kv_bytes_per_token: int) -> int:
        """Every slot is usable (SGLang's padding slot lies outside them)."""
        return self.max_total_num_tokens(kv_bytes_per_token)

    def running_request_limit(self, kv_bytes_per_token: int) -> int:
        """`max_running_requests` as SGLang derives it (`kv_cache_configurator.py`)."""
        n = self.max_total_num_tokens(kv_bytes_per_token)
        if self.max_running_requests is not None:
            return max(1, min(self.max_running_requests, n // 2))
        return max(1, min(max(min(int(n / self.max_model_len * 512), 4096), 2048), n // 2))

    def max_request_tokens(self, kv_bytes_per_token: int) -> int:
        """The longest prompt + output that runs whole: shorter prompts than `max_req_input_len`, and outputs that
        fit beside them (SGLang truncates longer outputs at intake)."""
        n = self.max_total_num_tokens(kv_bytes_per_token)
        return min(self.max_model_len - 1, n - 1) - self.page_size - 1

    def max_input_tokens(self, kv_bytes_per_token: int) -> int:
        """Prompts must be shorter than `max_req_input_len` = min(context length - 1, KV slots - 1) - 5; longer
        ones are aborted (`validate_input_length`, `managers/utils.py`)."""
        n = self.max_total_num_tokens(kv_bytes_per_token)
        return min(self.max_model_len - 1, n - 1) - 5 - 1

    def check_fits(self, longest_request_tokens: int, kv_bytes_per_token: int) -> None:
        n = self.max_total_num_tokens(kv_bytes_per_token)
        source = (f"engine.max_total_tokens={self.max_total_tokens}" if self.max_total_tokens is not None
                  else f"engine.kv_cache_bytes={self.kv_cache_bytes}")
        if n < 2 * self.page_size:
            raise ValueError(f"{source} gives {n} KV slots; need at least two pages of engine.page_size={self.page_size}")
        if longest_request_tokens > self.max_model_len:
            raise ValueError(f"workload prompt+output = {longest_request_tokens} tokens exceeds "
                             f"engine.max_model_len={self.max_model_len}")
        if longest_request_tokens > self.max_request_tokens(kv_bytes_per_token):
            raise ValueError(f"one request needs {longest_request_tokens} tokens but {source} gives {n} KV slots: "
                             f"raise {source.split('=')[0]}")

    def capacity_overrides(self, *, tokens: int | None = None, blocks: int | None = None,
                           kv_bytes: int | None = None) -> dict[str, object]:
        """`tokens` KV slots, `blocks` pages, or `kv_bytes`."""
        if tokens is not None:
            return {"engine.max_total_tokens": tokens}
        if blocks is not None:
            return {"engine.max_total_tokens": blocks * self.page_size}
        return {"engine.kv_cache_bytes": kv_bytes, "engine.max_total_tokens": None}

    def overrides_for_run(self, setup) -> dict[str, object]:
        """Scenario overrides (dotted paths) that give a worker a measured run's SGLang setup (`setup`: a
        `sim.servers.run_csv.RunSetup`): its KV slots (`engine.max_total_tokens` replaces the KV bytes), every server
        argument the sidecar gives, its version where kvsim has its rules."""
        overrides: dict[str, object] = {"engine.max_total_tokens": setup.kv_tokens_per_worker}
        for field in ("page_size", "max_prefill_tokens", "max_running_requests", "schedule_policy",
                      "radix_eviction_policy", "disable_overlap_schedule", "max_model_len"):
            if getattr(setup, field) is not None:
                overrides[f"engine.{field}"] = getattr(setup, field)
        if setup.chunked_prefill_size is not None:
            # SGLang: -1 (or 0) disables chunked prefill; kvsim says null.
            overrides["engine.chunked_prefill_size"] = setup.chunked_prefill_size if setup.chunked_prefill_size > 0 else None
        if setup.engine.version in SGLANG_VERSIONS:
            overrides["engine.sglang_version"] = setup.engine.version
        return overrides
