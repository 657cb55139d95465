"""Scenario files: the pydantic models that validate them, and loading (the edge where bad input is rejected)."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from sim.vllm_behaviour import DEFAULT_VLLM_VERSION, parse_version

BUILTIN_SCENARIO = "service-baseline"


class ScenarioError(ValueError):
    """A scenario (file or override) that cannot be run; the message names the field and what is allowed."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ModelSpec(_Model):
    name: str = Field("unnamed", description="Model name, for reports only.")
    kv_bytes_per_token: int = Field(gt=0, description="KV bytes per token, all layers: layers x 2 x kv_heads x head_dim x dtype bytes.")


class EngineSpec(_Model):
    kind: str = Field("vllm", description="Engine profile; only 'vllm' (v1) so far.")
    vllm_version: str = Field(DEFAULT_VLLM_VERSION, description="vLLM release whose cache/scheduler rules apply (0.10.0 to 0.33.0).")
    block_size: int = Field(16, ge=1, description="KV block size in tokens.")
    kv_cache_bytes: int = Field(gt=0, description="KV cache bytes per worker (vLLM --kv-cache-memory-bytes).")
    num_gpu_blocks_override: int | None = Field(None, ge=2, description="Use this block count (null block included) instead of the bytes.")
    max_num_batched_tokens: int = Field(8192, ge=1, description="Token budget per engine step.")
    max_num_seqs: int = Field(256, ge=1, description="Most requests running at once per worker.")
    max_model_len: int = Field(4096, ge=2, description="Longest sequence (prompt + output) in tokens.")
    free_order: Literal["tail-first", "head-first"] = Field(
        "tail-first",
        description="Order a finished request's blocks enter the free queue: vLLM's tail-first, or the naive-LRU "
                    "ablation head-first (no vLLM release does this).",
    )

    @field_validator("kind")
    @classmethod
    def _kind(cls, v: str) -> str:
        if v != "vllm":
            raise ValueError(f"engine.kind must be 'vllm', got {v!r}")
        return v

    @field_validator("vllm_version")
    @classmethod
    def _version(cls, v: str) -> str:
        parse_version(v)
        return v


class WorkloadSpec(_Model):
    """The shared-prefix workload of the reference experiment."""

    prefixes: int = Field(ge=1, description="Distinct shared prefixes N, drawn uniformly per request.")
    prefix_tokens: int = Field(ge=0, description="Tokens of each shared prefix.")
    tail_tokens: int = Field(ge=1, description="Tokens of each request's unique tail (after the prefix).")
    output_tokens: int = Field(ge=1, description="Output tokens per request (max_tokens, EOS ignored).")
    min_requests: int = Field(200, ge=1, description="Measured requests = max(min_requests, requests_per_prefix x N).")
    requests_per_prefix: int = Field(20, ge=0, description="See min_requests.")
    warmup_per_prefix: int = Field(1, ge=0, description="Warm-up requests per prefix, sent one at a time first, excluded from statistics.")
    concurrency: int = Field(8, ge=1, description="Closed loop: requests kept in flight.")

    @property
    def prompt_tokens(self) -> int:
        return self.prefix_tokens + self.tail_tokens

    @property
    def num_requests(self) -> int:
        return max(self.min_requests, self.requests_per_prefix * self.prefixes)


class RouterSpec(_Model):
    name: str = Field("random", description="Router name (see `kvsim routers`).")
    options: dict[str, Any] = Field(default_factory=dict, description="Router options, by router.")


class DeviceSpec(_Model):
    name: str = Field(description="Device name, for reports.")
    workers: int = Field(1, ge=1, description="Workers that share this device's time.")
    speed: float = Field(1.0, gt=0, description="Relative speed: a step takes step_s / speed alone on the device.")
    sharing_efficiency: float = Field(1.0, gt=0, le=1, description="Fraction of the device left for work when several workers' steps share it.")


class DeploymentSpec(_Model):
    workers: int = Field(ge=1, description="Worker count this deployment is used for.")
    devices: list[DeviceSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _count(self) -> DeploymentSpec:
        total = sum(d.workers for d in self.devices)
        if total != self.workers:
            raise ValueError(f"deployment for {self.workers} workers places {total} workers on its devices")
        return self


class ClusterSpec(_Model):
    workers: int = Field(ge=1, description="Number of workers.")
    deployments: list[DeploymentSpec] = Field(default_factory=list, description="Device layouts by worker count.")
    default_device: DeviceSpec = Field(
        default_factory=lambda: DeviceSpec(name="gpu"),
        description="For a worker count without a deployment: one such device per worker.",
    )
    router_hop_s: float = Field(0.0, ge=0, description="Latency the router adds to every request.")

    def devices(self) -> list[DeviceSpec]:
        for d in self.deployments:
            if d.workers == self.workers:
                return list(d.devices)
        return [self.default_device.model_copy(update={"name": f"{self.default_device.name}-{i}"})
                for i in range(self.workers)]


class TimeModelSpec(_Model):
    """Linear step-time model (see `sim.time_model.LinearStepTimeModel`), at device speed 1.0."""

    base_s: float = Field(0.005, ge=0, description="Fixed cost of every engine step.")
    prefill_token_s: float = Field(3.0e-5, ge=0, description="Per prompt token computed in the step.")
    decode_seq_s: float = Field(2.0e-4, ge=0, description="Per request decoding one token in the step.")
    context_token_s: float = Field(0.0, ge=0, description="Per KV token read by the step's attention.")
    request_overhead_s: float = Field(0.0, ge=0, description="Per-request cost outside the engine (HTTP, tokenisation), before queueing.")


class Scenario(_Model):
    name: str = Field(description="Scenario name.")
    description: str = Field("", description="What the scenario models.")
    seed: int = Field(0, description="Base seed; every random stream is derived from it by name.")
    model: ModelSpec
    engine: EngineSpec
    workload: WorkloadSpec
    router: RouterSpec = Field(default_factory=RouterSpec)
    cluster: ClusterSpec
    time_model: TimeModelSpec = Field(default_factory=TimeModelSpec)
    reference: str | None = Field(None, description="Measured results (CSV) for this scenario, relative to the scenario file.")

    @property
    def num_gpu_blocks(self) -> int:
        """vLLM's block count, null block included: floor(kv_cache_bytes / (block_size x kv_bytes_per_token))."""
        if self.engine.num_gpu_blocks_override is not None:
            return self.engine.num_gpu_blocks_override
        return self.engine.kv_cache_bytes // (self.engine.block_size * self.model.kv_bytes_per_token)

    @property
    def kv_capacity_requests(self) -> float:
        """C of the formula min(1, C/N): KV tokens per worker / mean prompt tokens."""
        return self.engine.kv_cache_bytes / self.model.kv_bytes_per_token / self.workload.prompt_tokens

    @model_validator(mode="after")
    def _fits(self) -> Scenario:
        bs = self.engine.block_size
        num_blocks = self.num_gpu_blocks
        if num_blocks < 2:
            raise ValueError(
                f"engine.kv_cache_bytes={self.engine.kv_cache_bytes} gives {num_blocks} blocks of {bs} tokens; need >= 2"
            )
        longest = self.workload.prompt_tokens + self.workload.output_tokens
        if longest > self.engine.max_model_len:
            raise ValueError(f"workload prompt+output = {longest} tokens exceeds engine.max_model_len={self.engine.max_model_len}")
        needed = -(-longest // bs)
        if needed > num_blocks - 1:
            raise ValueError(
                f"one request needs {needed} blocks but a worker has {num_blocks - 1} usable: raise engine.kv_cache_bytes"
            )
        return self

    def with_overrides(self, **overrides: Any) -> Scenario:
        """A copy with dotted-path overrides, e.g. {'workload.prefixes': 7, 'cluster.workers': 3}; validated again."""
        data = self.model_dump()
        for path, value in overrides.items():
            node = data
            *parents, leaf = path.split(".")
            for p in parents:
                node = node[p]
            node[leaf] = value
        return validate_scenario(data, source=f"scenario {self.name!r} with {overrides}")


def _format_error(err: ValidationError) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) for p in first["loc"]) or "(top level)"
    msg = first["msg"].removeprefix("Value error, ")
    extra = f" (and {err.error_count() - 1} more)" if err.error_count() > 1 else ""
    return f"{loc}: {msg}{extra}"


def validate_scenario(data: Any, *, source: str) -> Scenario:
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:
        raise ScenarioError(f"{source}: {_format_error(err)}") from None


def scenarios_dir() -> Path:
    """`scenarios/` beside the packages in a checkout, else the copy a wheel installs as `sim/scenarios`."""
    checkout = Path(__file__).resolve().parent.parent / "scenarios"
    if checkout.is_dir():
        return checkout
    return Path(str(resources.files("sim"))) / "scenarios"


def builtin_scenario_path(name: str = BUILTIN_SCENARIO) -> Path:
    path = scenarios_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ScenarioError(f"no built-in scenario {name!r} in {path.parent}")
    return path


def load_scenario(path: str | Path | None = None) -> tuple[Scenario, Path]:
    """Load a scenario file (the built-in one when `path` is None); returns it with its resolved path."""
    file = builtin_scenario_path() if path is None else Path(path)
    if not file.is_file():
        raise ScenarioError(f"scenario file {str(file)!r} does not exist")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as err:
        raise ScenarioError(f"{file}: not valid YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{file}: a scenario is a YAML mapping, got {type(data).__name__}")
    return validate_scenario(data, source=str(file)), file.resolve()
