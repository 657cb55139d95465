"""Scenario files: the model that validates them, composed of each package's own section (`model:` and
`time_model:` from `sim.timing.spec`, `engine:` from the engine registry, `workload:` from `sim.workloads.spec`,
`router:` from `sim.routing.spec`) with the cluster, SLO and calibration sections defined here; and loading (the edge
where bad input is rejected)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from sim.config import GIB, ConfigModel, Loc, Problem, suggestion, validation_problems
from sim.engines.registry import ENGINES
from sim.results.cost import DeviceTime
from sim.results.records import Slo
from sim.routing.spec import RouterSpec
from sim.timing.architecture import ModelArchitecture, load_architecture
from sim.timing.hardware import HardwareProfile, hardware_profile
from sim.timing.memory import KvBudget, device_memory_bytes, vllm_kv_budget, weights_bytes
from sim.timing.spec import LinearTimeModelSpec, ModelSpec, RooflineTimeModelSpec, TimeModelSpec, known_hardware
from sim.workloads.session_spec import SessionsSpec
from sim.workloads.spec import SharedPrefixSpec

BUILTIN_SCENARIO = "service-baseline"


def _memory_limit_bytes() -> int:
    """8 GiB, or `KVSIM_MAX_MEMORY_GIB` (a number > 0) for machines that can hold bigger runs."""
    text = os.environ.get("KVSIM_MAX_MEMORY_GIB")
    if text is None:
        return 8 * 2**30
    try:
        gib = float(text)
    except ValueError:
        gib = float("nan")
    if not (math.isfinite(gib) and gib > 0):
        raise SystemExit(f"Error: KVSIM_MAX_MEMORY_GIB={text!r}: give a number of GiB > 0")
    return int(gib * 2**30)


MAX_MEMORY_BYTES = _memory_limit_bytes()
"""The most memory a single run may need by `Scenario.memory_estimate_bytes`; bigger scenarios are refused."""
# NOTE: rough, generous guesses at the sizes of the Python objects a run holds (not measured; refine with tracemalloc).
_WORKER_BYTES = 64 * 1024  # a worker, its engine, scheduler and device process
_BLOCK_BYTES = 160  # a vLLM block: its hash slot, reference count and free-queue entry
_PREFIX_BYTES = 1024
_REQUEST_BYTES = 2048  # a request, its record and summary entries
_HASH_BYTES = 64  # one block hash of a request (the tuple and its entries)
_CLIENT_BYTES = 4096  # a closed-loop client (a SimPy process)


def _gib(n: int) -> str:
    return f"{n / 2**30:.3g} GiB"


def capacity_requests(kv_cache_bytes: float, kv_bytes_per_token: float, prompt_tokens: float) -> float:
    """C: how many whole prompts one worker's KV cache holds, KV tokens per worker / prompt tokens.

    Assumes the whole KV budget is cache (no blocks held by running requests, no block rounding, no output tokens).
    The reference worker: 1 GiB / 114,688 B per token / 2,371 tokens = 3.95 prompts.
    """
    if kv_cache_bytes <= 0 or kv_bytes_per_token <= 0 or prompt_tokens <= 0:
        raise ValueError(
            f"capacity_requests needs positive inputs, got kv_cache_bytes={kv_cache_bytes}, "
            f"kv_bytes_per_token={kv_bytes_per_token}, prompt_tokens={prompt_tokens}"
        )
    return kv_cache_bytes / kv_bytes_per_token / prompt_tokens


class ScenarioError(ValueError):
    """A scenario (file or override) that cannot be run; the message names the field and what is allowed."""


def _engine_spec_type():
    """The `engine:` section's type: one of the registered engines' specs, chosen by `kind`."""
    specs = tuple(entry.Spec for entry in ENGINES.values())
    if len(specs) == 1:
        return specs[0]
    return Annotated[Union[specs], Field(discriminator="kind")]  # noqa: UP007 - a runtime tuple of types


EngineSpec = _engine_spec_type()

WorkloadSpec = Annotated[Union[SharedPrefixSpec, SessionsSpec], Field(discriminator="kind")]  # noqa: UP007
"""The `workload:` section's type, by `kind` (absent: shared-prefix, what every file meant before sessions)."""
WORKLOAD_KINDS = ("sessions", "shared-prefix")


class DeviceSpec(ConfigModel):
    name: str = Field(description="Device name (its class, e.g. gpu-24gb); calibration addresses devices by name.")
    workers: int = Field(1, ge=1, description="Workers that share this device's time.")
    speed: float = Field(1.0, gt=0, description="Relative speed: a step takes step_s / speed alone on the device.")
    cores: int = Field(1, ge=1, description="Steps the device runs in parallel at full speed (GPU: 1; a CPU: its cores).")
    sharing_efficiency: float = Field(1.0, gt=0, le=1, description="Fraction of the device left for work when several workers' steps share it.")
    host_load: float = Field(0.0, ge=0, le=4, allow_inf_nan=False, description="Cores' worth of host work (engine loop, API server, client) each stepping worker brings onto this device, competing with steps for its cores (a CPU device; 0 on a GPU, whose host work runs elsewhere). Fitted by kvsim calibrate (device.<name>.host_load).")
    idle_load: float = Field(0.0, ge=0, le=4, allow_inf_nan=False, description="Cores' worth a worker without a step in flight keeps taking on this device (a vLLM CPU worker spins on its queue; 0 on a GPU). Fitted by kvsim calibrate (device.<name>.idle_load).")
    pause_s: float = Field(0.0, ge=0, le=10, allow_inf_nan=False, description="Mean length (s) of the pauses a shared device makes (no step progresses) per unit of oversubscription at its load of the moment, (L - cores) / cores with L = k (1 + host_load) + (workers - k) idle_load for k workers stepping: exponential, a fraction of the time (pause_fraction x the oversubscription) while its load exceeds its cores; the tail of a shared CPU. Seeded by the scenario's seed. Fitted by kvsim calibrate (device.<name>.pause_s).")
    pause_fraction: float = Field(0.0, ge=0, lt=1, allow_inf_nan=False, description="Fraction of the time a shared device pauses per unit of oversubscription at its load of the moment (0: never; see pause_s). Fitted by kvsim calibrate (device.<name>.pause_fraction).")
    handoff_s: float = Field(0.0, ge=0, le=2, allow_inf_nan=False, description="Wait (s) at the start of each step of a shared device per unit of oversubscription (its load with the step's worker stepping): the hand-overs between a worker and its engine loop waiting for time slices; no progress meanwhile (0: none). Fitted by kvsim calibrate (device.<name>.handoff_s).")
    step_occupancy: float = Field(1.0, gt=0, le=1, description="Fraction of the device one step keeps busy once steps outnumber its cores: 1 = strict time slicing (k steps on one GPU each at 1/k), < 1 = concurrent kernels whose throughput saturates (MPS-like; each at 1/(1 + occupancy x (k - 1))). Fitted by kvsim calibrate (device.<name>.step_occupancy).")
    time_model: TimeModelSpec | None = Field(None, description="This device class's own step-time model (default: the scenario's).")
    hardware: str | None = Field(None, description="This device's hardware profile under a roofline time model (default: the time model's).")
    tensor_parallel: int | None = Field(None, ge=1, le=64, description="This device's tensor-parallel degree under a roofline time model (default: the time model's).")
    price_per_hour_usd: float | None = Field(None, gt=0, allow_inf_nan=False, description="US dollars for one of this device's GPUs for an hour (the device costs tensor_parallel x this); overrides its hardware profile's list price (sim/timing/hardware.yaml; `kvsim hardware`). Default: the profile's, none under a linear time model (cost columns NaN).")

    _hardware = field_validator("hardware")(known_hardware)


class DeploymentSpec(ConfigModel):
    workers: int = Field(ge=1, description="Worker count this deployment is used for.")
    devices: list[DeviceSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _count(self) -> DeploymentSpec:
        total = sum(d.workers for d in self.devices)
        if total != self.workers:
            raise ValueError(f"deployment for {self.workers} workers places {total} workers on its devices")
        return self


@dataclass(frozen=True, slots=True)
class DeviceSetup:
    """A device as a roofline time model sees it: its name, hardware, the tensor-parallel degree of its workers and
    how many workers share it (each with its own copy of the weights)."""

    name: str
    hardware: HardwareProfile
    tensor_parallel: int
    workers: int


# ---------------------------------------------------------------------------------------------- P/D pools
class TransferLinkSpec(ConfigModel):
    """The KV transfer from a prefill worker to a decode worker (`sim.cluster.transfer_link.KvTransferLink`: each
    decode worker's inbound link is one FIFO queue)."""

    bandwidth_bytes_per_s: float = Field(50e9, gt=0, description="Bytes per second of one decode worker's inbound link (default 50e9: a 400 Gb/s RDMA NIC per GPU; Dynamo's mocker --kv-transfer-bandwidth says ~450e9 for intra-node NVLink).")
    latency_s: float = Field(1e-5, ge=0, description="Seconds per transfer before its bytes flow (network round trip; default 10 us).")
    overhead_s: float = Field(0.0, ge=0, description="Further seconds per transfer outside the wire (NIXL descriptor setup and completion notification; default 0).")
    layerwise: bool = Field(False, description="The connector streams each layer's KV while the prefill computes it (LMCache and Mooncake layer-wise modes; vLLM's NixlConnector does not): only the last layer's share (bytes / model.architecture.num_hidden_layers) is left to move when the decode worker asks. Needs the model's architecture.")


class PoolSpec(ConfigModel):
    """One pool of a disaggregated cluster: its workers, the device each runs on, and its engine options."""

    workers: int = Field(ge=1, description="Workers in the pool.")
    device: DeviceSpec | None = Field(None, description="The device each worker of the pool runs on (its speed, time model, hardware and TP under a roofline); default: cluster.default_device.")
    engine: dict[str, Any] = Field(default_factory=dict, description="Engine options this pool overrides (keys of the scenario's engine section, e.g. max_num_batched_tokens).")


class DisaggregationSpec(ConfigModel):
    """Prefill/decode disaggregation: a request prefills on a prefill worker (as a request of one output token),
    its prompt KV moves to a decode worker over `link`, and it decodes there (see docs/concepts/disaggregation.md)."""

    prefill: PoolSpec = Field(description="The prefill pool (workers 0..P-1 of the cluster).")
    decode: PoolSpec = Field(description="The decode pool (workers P..P+D-1).")
    link: TransferLinkSpec = Field(default_factory=TransferLinkSpec, description="The KV transfer link.")

    def pool_of(self, worker: int) -> str:
        """'prefill' or 'decode': the pool of the cluster's worker `worker`."""
        return "prefill" if worker < self.prefill.workers else "decode"


# ---------------------------------------------------------------------------------------------- autoscaling
class AutoscalerSpec(ConfigModel):
    """Which autoscaler (`policies.autoscalers.AUTOSCALERS`) and its options, as `router:` names a router."""

    name: str = Field(description="Autoscaler name (see `kvsim autoscalers` or docs/concepts/autoscalers.md).")
    options: dict[str, Any] = Field(default_factory=dict, description="The autoscaler's options (e.g. {target: 4, metric: in_flight}).")


class ProvisioningSpec(ConfigModel):
    """How long a new worker takes from the autoscaler's decision to serving (`sim.cluster.fleet`): its weights load
    (`weights_bytes / load_bandwidth_bytes_per_s`) then its engine starts (`engine_startup_s`); `delay_s` replaces
    both. The defaults are assumptions (docs/concepts/autoscaling.md), not measurements: give your own."""

    weights_bytes: int | None = Field(None, ge=0, description="Bytes of weights a new worker loads (default: the model's, from model.architecture at 2 bytes a parameter; 0 without an architecture).")
    load_bandwidth_bytes_per_s: float = Field(2e9, gt=0, description="Bytes per second the weights load at (default 2e9: a node-local NVMe or page-cached model directory read by safetensors; an assumption).")
    engine_startup_s: float = Field(30.0, ge=0, description="Seconds from weights loaded to ready: process start, KV cache profiling and allocation, CUDA graph capture (default 30; an assumption for vLLM with CUDA graphs).")
    delay_s: float | None = Field(None, ge=0, description="A fixed provisioning delay in seconds, replacing the two terms above.")


class AutoscalingSpec(ConfigModel):
    """An elastic fleet (docs/concepts/autoscaling.md): `max_workers` slots, `initial_workers` ready at time 0, and an
    autoscaler asked every `interval_s` how many workers it wants (clamped to [min_workers, max_workers])."""

    autoscaler: AutoscalerSpec = Field(description="The scaling rule: {name, options}.")
    min_workers: int = Field(1, ge=1, description="The fewest workers (ready + starting) the fleet keeps (HPA minReplicas, default 1).")
    max_workers: int = Field(ge=1, description="The most workers the fleet runs at once: its slots (devices), draining ones included.")
    initial_workers: int | None = Field(None, ge=1, description="Workers ready at time 0 (default: min_workers).")
    provisioning: ProvisioningSpec = Field(default_factory=ProvisioningSpec, description="A new worker's start-up delay.")
    cold_window_s: float = Field(60.0, gt=0, description="The timeline's cold columns count the requests sent to a worker within this many seconds of its becoming ready (default 60; the workers ready at time 0 start cold too).")
    timeline_bin_s: float | None = Field(None, gt=0, description="Seconds per timeline row (default: the autoscaler's interval).")

    @model_validator(mode="after")
    def _bounds(self) -> AutoscalingSpec:
        if self.min_workers > self.max_workers:
            raise ValueError(f"min_workers ({self.min_workers}) must be <= max_workers ({self.max_workers})")
        if not self.min_workers <= self.workers_at_start <= self.max_workers:
            raise ValueError(f"initial_workers ({self.initial_workers}) must be in [min_workers, max_workers] "
                             f"= [{self.min_workers}, {self.max_workers}]")
        return self

    @property
    def workers_at_start(self) -> int:
        return self.min_workers if self.initial_workers is None else self.initial_workers

    def provisioning_s(self, model: ModelSpec) -> float:
        """A new worker's provisioning delay for `model` (`ProvisioningSpec`)."""
        spec = self.provisioning
        if spec.delay_s is not None:
            return spec.delay_s
        weights = spec.weights_bytes
        if weights is None:
            weights = weights_bytes(model.architecture) if model.architecture is not None else 0
        return weights / spec.load_bandwidth_bytes_per_s + spec.engine_startup_s


class ClusterSpec(ConfigModel):
    workers: int = Field(ge=1, description="Number of workers.")
    deployments: list[DeploymentSpec] = Field(default_factory=list, description="Device layouts by worker count.")
    default_device: DeviceSpec = Field(
        default_factory=lambda: DeviceSpec(name="gpu"),
        description="For a worker count without a deployment: one such device per worker.",
    )
    router_hop_s: float = Field(0.0, ge=0, description="Latency the router adds to every request.")
    request_overhead_s: float = Field(0.0, ge=0, description="Per-request cost outside the engine before it queues (HTTP, tokenisation).")
    response_overhead_s: float = Field(0.0, ge=0, description="Delay from the engine emitting a token to the client seeing it (detokenise, stream).")
    reuse_breakdown: bool = Field(True, description="Book every request's reuse available and captured (summary columns reuse_available, reuse_captured): keeps every block hash ever sent, so a replay of millions of requests may turn it off.")
    disaggregation: DisaggregationSpec | None = Field(None, description="Prefill/decode pools (null: every worker prefills and decodes its own requests); workers must equal prefill.workers + decode.workers.")
    autoscaling: AutoscalingSpec | None = Field(None, description="An elastic fleet driven by an autoscaler (null: a fixed fleet of `workers`); workers, if given, must equal autoscaling.max_workers.")

    @model_validator(mode="before")
    @classmethod
    def _slots(cls, data: Any) -> Any:
        # NOTE: an autoscaled cluster is built with max_workers slots; `workers` may be left out (it is that).
        scaling = data.get("autoscaling") if isinstance(data, dict) else None
        if isinstance(scaling, dict) and "workers" not in data and isinstance(scaling.get("max_workers"), int):
            data = {**data, "workers": scaling["max_workers"]}
        return data

    @model_validator(mode="after")
    def _pools_add_up(self) -> ClusterSpec:
        scaling = self.autoscaling
        if scaling is not None:
            if self.workers != scaling.max_workers:
                raise ValueError(f"cluster.workers ({self.workers}) must equal cluster.autoscaling.max_workers "
                                 f"({scaling.max_workers}): an autoscaled cluster has max_workers slots")
            if self.disaggregation is not None:
                raise ValueError("cluster.autoscaling: not modelled with P/D pools (cluster.disaggregation); allowed: "
                                 "an aggregated cluster")
            if any(d.workers > 1 for d in self.devices()):
                raise ValueError("cluster.autoscaling: every worker needs a device of its own (a deployment for "
                                 f"{self.workers} workers shares devices); allowed: one worker per device (a "
                                 "deployment without shared devices, the default device, or --gpu)")
        pd = self.disaggregation
        if pd is not None and pd.prefill.workers + pd.decode.workers != self.workers:
            raise ValueError(f"cluster.workers ({self.workers}) must equal disaggregation.prefill.workers + "
                             f"disaggregation.decode.workers ({pd.prefill.workers} + {pd.decode.workers})")
        return self

    def devices(self) -> list[DeviceSpec]:
        if self.disaggregation is not None:
            return self.pool_devices()
        for d in self.deployments:
            if d.workers == self.workers:
                return list(d.devices)
        return [self.default_device.model_copy(update={"name": f"{self.default_device.name}-{i}"})
                for i in range(self.workers)]


    def pool_devices(self) -> list[DeviceSpec]:
        """A disaggregated cluster's devices, one per worker: the prefill pool's (named prefill-NAME-i), then the
        decode pool's (decode-NAME-i), each its pool's device or the default device."""
        pd = self.disaggregation
        out = []
        for stage, pool in (("prefill", pd.prefill), ("decode", pd.decode)):
            dev = pool.device or self.default_device
            out += [dev.model_copy(update={"name": f"{stage}-{dev.name}-{i}", "workers": 1})
                    for i in range(pool.workers)]
        return out


def _objective_ms(what: str):
    return Field(None, gt=0, allow_inf_nan=False,
                 description=f"{what} a request must not exceed to meet the SLO (ms, > 0, finite); absent: not constrained.")


class SloSpec(ConfigModel):
    """Latency objectives for goodput: `slo: {ttft_ms: 200, tpot_ms: 50, e2e_ms: 5000}`, any subset.

    A measured request meets the SLO iff it meets every objective that is set (`sim.results.records.Slo`). An
    objective left out constrains nothing; with none set (the default) every request meets the SLO, so goodput equals
    throughput, `goodput_fraction` is 1 and the summary's `slo_*_ms` columns are NaN.
    """

    ttft_ms: float | None = _objective_ms("Time to first token from send")
    tpot_ms: float | None = _objective_ms("Time per output token after the first ((last - first token) / (outputs - 1))")
    e2e_ms: float | None = _objective_ms("Time from send to the last token")

    def to_slo(self) -> Slo:
        """The value object that runs and replays count against."""
        return Slo(ttft_ms=self.ttft_ms, tpot_ms=self.tpot_ms, e2e_ms=self.e2e_ms)


class CalibrationSpec(ConfigModel):
    """Which parameters `kvsim calibrate` fits by default, and what the last fit used (written by calibrate)."""

    parameters: list[str] | None = Field(
        None,
        description="Parameters to fit: time_model.<field>, cluster.<field>_s, device.<name>.speed|sharing_efficiency|host_load|idle_load|step_occupancy|pause_s|pause_fraction|handoff_s. "
                    "Default: the time model's own (Scenario.calibration_parameters).",
    )
    fitted_on: list[str] = Field(default_factory=list, description="Measured points the fit used (workers/prefixes/concurrency: metrics).")
    held_out: list[str] = Field(default_factory=list, description="Measured points reported but not fitted.")
    fit_rms_log_error: float | None = Field(None, description="RMS of log(predicted/measured) over the fitted figures.")
    holdout_rms_log_error: float | None = Field(None, description="The same over the held-out figures.")
    model: str | None = Field(None, description="The model the fit measured, when the scenario now serves another "
                                                "(--model fills it). Default: the scenario's own.")
    hardware: list[str] = Field(default_factory=list, description=(
        "The hardware profiles the fit's devices ran on, when the scenario now runs on others (--gpu fills it). "
        "Default (empty): the scenario's own devices'."))


class Scenario(ConfigModel):
    name: str = Field(description="Scenario name.")
    description: str = Field("", description="What the scenario models.")
    seed: int = Field(0, description="Base seed; every random stream is derived from it by name.")
    model: ModelSpec
    engine: EngineSpec
    workload: WorkloadSpec
    router: RouterSpec = Field(default_factory=RouterSpec)
    cluster: ClusterSpec
    time_model: TimeModelSpec = Field(default_factory=LinearTimeModelSpec)
    engine_options: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="Options for the other engines, applied when a command switches the engine (--engine): e.g. "
                    "{sglang: {chunked_prefill_size: 2048}}. Options both engines have carry over by themselves.")
    reference: str | None = Field(
        None, description="Measured results (CSV) for this scenario, relative to the scenario file, or kvsim:PATH for "
                          "one that ships with kvsim (relative to its scenarios folder). Runs without measurements "
                          "(and a warning) when the file is missing.")
    calibration: CalibrationSpec = Field(default_factory=CalibrationSpec, description="Time-model calibration.")
    slo: SloSpec = Field(default_factory=SloSpec,
                         description="Latency objectives (ttft_ms, tpot_ms, e2e_ms) for goodput; default: none set.")

    @model_validator(mode="before")
    @classmethod
    def _default_engine_kind(cls, data: Any) -> Any:
        # NOTE: scenario files written before there were several engines have no engine.kind: they mean vLLM.
        if isinstance(data, dict) and isinstance(data.get("engine"), dict) and "kind" not in data["engine"]:
            data = {**data, "engine": {"kind": "vllm", **data["engine"]}}
        if isinstance(data, dict) and isinstance(data.get("workload"), dict) and "kind" not in data["workload"]:
            data = {**data, "workload": {"kind": "shared-prefix", **data["workload"]}}
        return data

    @property
    def has_sessions(self) -> bool:
        """Whether the workload is of kind sessions (chats, agents) rather than shared-prefix."""
        return self.workload.kind == "sessions"

    def shared_prefix_only(self, what: str) -> None:
        """Raise a ScenarioError naming `what` (an option, a command) when the workload is of kind sessions: for
        what only a shared-prefix workload has (its prefixes N, its request stream, its formula)."""
        if self.has_sessions:
            raise ScenarioError(f"{what}: the scenario {self.name!r} has a sessions workload (workload.kind: "
                                f"sessions); {what} needs a shared-prefix one (workload.kind: shared-prefix)")

    @property
    def capacity_tokens(self) -> int:
        """Token slots of one worker's KV cache that requests can use (vLLM: all blocks but the null block)."""
        return self.engine.capacity_tokens(self.model.kv_bytes_per_token)

    @property
    def max_request_tokens(self) -> int:
        """The longest request (prompt + output) a worker accepts; longer ones are rejected."""
        return self.engine.max_request_tokens(self.model.kv_bytes_per_token)

    @property
    def num_blocks(self) -> int:
        """KV blocks per worker as the engine counts them (vLLM's num_gpu_blocks, null block included)."""
        return self.engine.num_blocks(self.model.kv_bytes_per_token)

    @property
    def kv_capacity_requests(self) -> float:
        """C of the formula min(1, C/N): KV tokens per worker / mean prompt tokens (`capacity_requests`); a
        shared-prefix workload's only (`shared_prefix_only`)."""
        self.shared_prefix_only("the formula min(1, C/N)")
        return capacity_requests(self.engine.kv_cache_bytes, self.model.kv_bytes_per_token, self.workload.prompt_tokens)

    @model_validator(mode="after")
    def _engine_options(self) -> Scenario:
        # NOTE: a message starts with the location of its first culprit: the error names the file's line of it.
        for kind, options in self.engine_options.items():
            if kind not in ENGINES:
                raise ValueError(f"engine_options.{kind}: unknown engine; {suggestion(kind, sorted(ENGINES))}")
            fields = [f for f in ENGINES[kind].Spec.model_fields if f != "kind"]
            unknown = [option for option in options if option not in fields]
            if unknown:
                raise ValueError("; ".join(f"engine_options.{kind}.{option}: unknown option; "
                                           f"{suggestion(option, fields)}" for option in unknown))
        return self

    def pool_engine(self, stage: str) -> EngineSpec:
        """The engine spec of a disaggregated cluster's pool `stage` ('prefill' or 'decode'): the scenario's engine
        with the pool's overrides."""
        overrides = getattr(self.cluster.disaggregation, stage).engine
        if not overrides:
            return self.engine
        return type(self.engine).model_validate({**self.engine.model_dump(), **overrides})

    @model_validator(mode="after")
    def _pools(self) -> Scenario:
        pd = self.cluster.disaggregation
        if pd is None:
            return self
        fields = [f for f in type(self.engine).model_fields if f != "kind"]
        for stage in ("prefill", "decode"):
            unknown = [k for k in getattr(pd, stage).engine if k not in fields]
            if unknown:
                raise ValueError(f"cluster.disaggregation.{stage}.engine.{unknown[0]}: unknown option; "
                                 f"{suggestion(unknown[0], fields)}")
            if stage == "decode" and pd.link.layerwise and self.model.architecture is None:
                raise ValueError("cluster.disaggregation.link.layerwise needs model.architecture (model.config: a "
                                 "shipped model or a config.json) for the number of layers")
            if self.pool_engine(stage).block_size != self.engine.block_size:
                raise ValueError(f"cluster.disaggregation.{stage}.engine.block_size: the pools must share the "
                                 f"engine's block size ({self.engine.block_size}): KV moves block by block")
        return self

    def device_time_model(self, device: DeviceSpec) -> TimeModelSpec:
        """The time model `device` runs: its own or the scenario's; under a roofline, with the device's own
        `hardware` and `tensor_parallel` where it gives them (the one place that rule lives)."""
        spec = device.time_model or self.time_model
        if spec.kind != "roofline":
            return spec
        return spec.model_copy(update={"hardware": device.hardware or spec.hardware,
                                       "tensor_parallel": device.tensor_parallel or spec.tensor_parallel})

    @property
    def cpu_kv_bytes(self) -> int:
        """The host (CPU) KV tier per worker in bytes: `engine.cpu_kv_bytes`, 0 for an engine without one."""
        return getattr(self.engine, "cpu_kv_bytes", 0)

    @property
    def shared_kv_bytes(self) -> int:
        """The cluster-shared KV store in bytes: `engine.shared_kv_bytes` (with P/D pools the prefill pool's, whose
        store it is), 0 for an engine without one."""
        engine = self.engine if self.cluster.disaggregation is None else self.pool_engine("prefill")
        return getattr(engine, "shared_kv_bytes", 0)

    @property
    def peer_fetch(self) -> bool:
        """G2 peer fetch between the workers' host tiers (`engine.peer_fetch`), False for an engine without it."""
        return getattr(self.engine, "peer_fetch", False)

    def device_shared_link(self, device: DeviceSpec) -> tuple[float, float, float]:
        """(bandwidth bytes/s per direction, latency s, per-transfer overhead s) of `device`'s network link to the
        shared store: `engine.shared_link`; with tensor parallelism every rank moves its share of a block over its
        own NIC, so the device's rate is that many NICs' (as its host link's)."""
        engine = self.engine if self.cluster.disaggregation is None else self.pool_engine("prefill")
        link = engine.shared_link
        spec = self.device_time_model(device)
        tp = spec.tensor_parallel if spec.kind == "roofline" else 1
        return link.bandwidth * tp, link.latency_s, link.overhead_s

    def device_host_link(self, device: DeviceSpec) -> tuple[float, float]:
        """(bandwidth bytes/s per direction, latency s per copy) of `device`'s link to host memory: the time model's
        `host_link`, else its hardware profile's link x efficiency; with tensor parallelism every rank copies its
        share of a block over its own link, so the device's rate is that many links'."""
        spec = self.device_time_model(device)
        link = spec.host_link
        if spec.kind != "roofline":
            if link.bandwidth is None:
                raise ValueError("engine.cpu_kv_bytes needs time_model.host_link.bandwidth (bytes/s) under a linear "
                                 "time model (it has no hardware profile to take it from)")
            return link.bandwidth, 1e-5 if link.latency_s is None else link.latency_s
        profile = hardware_profile(spec.hardware)
        bandwidth = link.bandwidth if link.bandwidth is not None else profile.host_bandwidth * link.efficiency
        latency = link.latency_s if link.latency_s is not None else profile.host_latency
        return bandwidth * spec.tensor_parallel, latency

    @model_validator(mode="after")
    def _shared_store_is_the_prefill_pools(self) -> Scenario:
        # NOTE: with P/D pools the store is the prefill pool's (sim/cluster/disaggregated.py): decode workers receive
        # their KV from the prefill worker and do not use it (Dynamo's disagg_kvbm.sh: decode --connector nixl).
        pd = self.cluster.disaggregation
        if pd is not None and pd.decode.engine.get("shared_kv_bytes"):
            raise ValueError("cluster.disaggregation.decode.engine.shared_kv_bytes: decode workers do not use the "
                             "shared store (it is the prefill pool's); allowed: 0, or set engine.shared_kv_bytes "
                             "or cluster.disaggregation.prefill.engine.shared_kv_bytes")
        if self.cluster.disaggregation is not None and (
                self.peer_fetch or any(pd.engine.get("peer_fetch") for pd in (self.cluster.disaggregation.prefill,
                                                                              self.cluster.disaggregation.decode))):
            raise ValueError("engine.peer_fetch: not modelled with P/D pools (cluster.disaggregation); allowed: false")
        if self.cluster.autoscaling is not None and self.peer_fetch:
            raise ValueError("engine.peer_fetch: not modelled with an autoscaled fleet (cluster.autoscaling: a peer's "
                             "host tier would outlive its worker); allowed: false")
        return self

    @model_validator(mode="after")
    def _host_tier_needs_a_link(self) -> Scenario:
        if self.cpu_kv_bytes:
            for dev in self.all_devices():
                self.device_host_link(dev)
        return self

    @model_validator(mode="after")
    def _roofline_needs_architecture(self) -> Scenario:
        if self.model.architecture is None:
            for dev in self.all_devices():
                if self.device_time_model(dev).kind == "roofline":
                    raise ValueError("time_model.kind roofline needs the model's architecture: give model.config (a "
                                     "shipped model or a config.json path)")
        return self

    @property
    def calibration_parameters(self) -> list[str]:
        """What `kvsim calibrate` fits unless told: `calibration.parameters`, else by the time model's kind (linear:
        its three main coefficients; roofline: its fixed cost, compute and memory efficiency) and the per-request overhead."""
        if self.calibration.parameters is not None:
            return list(self.calibration.parameters)
        if self.time_model.kind == "linear":
            return ["cluster.request_overhead_s", "time_model.base_s", "time_model.prefill_token_s",
                    "time_model.decode_seq_s"]
        return ["cluster.request_overhead_s", "time_model.step_overhead_s", "time_model.compute_efficiency",
                "time_model.memory_efficiency"]

    def device_setups(self) -> list[DeviceSetup]:
        """Every device the scenario names (`all_devices`) that runs a roofline time model, with its hardware."""
        setups = []
        for dev in self.all_devices():
            spec = self.device_time_model(dev)
            if spec.kind == "roofline":
                setups.append(DeviceSetup(dev.name, hardware_profile(spec.hardware), spec.tensor_parallel, dev.workers))
        return setups

    @model_validator(mode="after")
    def _weights_fit(self, info: ValidationInfo) -> Scenario:
        """A roofline device must hold its workers' weights (bf16 weights / tensor_parallel each). The KV cache is not
        checked against the device's memory: `engine.kv_cache_bytes` beyond it is a what-if a planner asks. Skipped
        when the devices are about to be replaced (`load_scenario(check_devices=False)`, for --gpu): the check applies
        to the devices a run uses."""
        arch = self.model.architecture
        if arch is None or not (info.context or {}).get("check_devices", True):
            return self
        for setup in self.device_setups():
            problem = _weights_problem(arch, self.model.name, setup)
            if problem:
                raise ValueError(f"{problem}: {_ways_out(setup, own_devices=True, fits=bool)}")
        return self

    def kv_budget(self) -> KvBudget:
        """The KV cache per worker vLLM's memory rule gives on the scenario's devices (`sim.timing.memory`): the
        smallest of the devices' (kvsim gives every worker one KV size). Needs a roofline time model and the model's
        architecture."""
        if self.model.architecture is None or not self.device_setups():
            raise ScenarioError("vLLM's KV rule needs a roofline time model and the model's architecture (model.config)")
        return _kv_budget(self.model.architecture, self.device_setups(), self.engine)

    def with_hardware(self, *, model: str | None = None, hardware: str | None = None, tensor_parallel: int = 1,
                      kv_cache_bytes: int | None = None) -> Scenario:
        """The same scenario serving `model` (a shipped name or a config.json path) and/or with every worker on its
        own device of `hardware` x `tensor_parallel` under the roofline time model (its efficiency factors and
        overheads kept if the scenario already has one, else the defaults). A new model needs a roofline time model:
        a linear one was fitted to the scenario's own model.

        The KV cache per worker is `kv_cache_bytes`, or without it what vLLM would allocate on the devices used
        (`kv_budget`, `sim.timing.memory`). The weights must fit the devices used: the new ones with `hardware`, else
        the scenario's own. The calibration keeps what its fit ran on (`calibration.model`, `calibration.hardware`);
        it is dropped with a linear time model that the roofline replaces."""
        data = self.model_dump()
        data["reference"] = None  # measured with the scenario's own model and hardware
        arch, model_name = self.model.architecture, self.model.name
        if model is not None:
            model_name, arch = load_architecture(model)
            data["model"] = {"name": model_name, "kv_bytes_per_token": arch.kv_bytes_per_token,
                             "architecture": arch.model_dump()}
        if hardware is None:
            if self.time_model.kind != "roofline":
                raise ScenarioError("--model: the scenario's time model is linear, fitted to its own model; give --gpu "
                                    "too (the roofline time model on that hardware)")
            setups = self.device_setups()
        else:
            profile = hardware_profile(hardware)
            label = _gpu_label(profile, tensor_parallel)
            setups = [DeviceSetup(label, profile, tensor_parallel, 1)]
            if self.time_model.kind == "roofline":
                data["time_model"] = {**data["time_model"], "hardware": profile.name, "tensor_parallel": tensor_parallel}
                if self.calibration.fitted_on and not self.calibration.hardware:
                    data["calibration"]["hardware"] = self.fitted_hardware()
            else:
                data["time_model"] = {"kind": "roofline", "hardware": profile.name, "tensor_parallel": tensor_parallel}
                data["calibration"] = {}  # it fitted the linear time model the roofline replaces
            data["cluster"]["deployments"] = []
            data["cluster"]["default_device"] = {"name": label}
        if model is not None and data["calibration"].get("fitted_on") and self.calibration.model is None:
            data["calibration"]["model"] = self.model.name
        if arch is None:
            raise ScenarioError("--gpu: the scenario's model has no architecture for the roofline time model: give "
                                "--model NAME or CONFIG.json")
        own = hardware is None
        for setup in setups:
            problem = _weights_problem(arch, model_name, setup)
            if problem:
                fits = lambda s: _weights_problem(arch, model_name, s) is None  # noqa: E731
                raise ScenarioError(f"{problem}: {_ways_out(setup, own_devices=own, fits=fits)}")
        if kv_cache_bytes is None:
            budget = _kv_budget(arch, setups, self.engine)
            needed = self.workload.max_request_tokens * arch.kv_bytes_per_token
            if budget.kv_bytes < needed:
                setup = next(s for s in setups if _kv_budget(arch, [s], self.engine) == budget)
                fits = lambda s: _kv_budget(arch, [s], self.engine).kv_bytes >= needed  # noqa: E731
                raise ScenarioError(
                    f"{_device_text(setup)}: vLLM's memory rule leaves {_gib(max(0, budget.kv_bytes))} of KV per "
                    f"worker, less than one request's {_gib(needed)} ({budget.text()}): "
                    f"{_ways_out(setup, own_devices=own, fits=fits)}; or give --kv-gib")
            kv_cache_bytes = budget.kv_bytes
        for path, value in self.engine.capacity_overrides(kv_bytes=kv_cache_bytes).items():
            data["engine"][path.removeprefix("engine.")] = value
        what = ", ".join(f"--{k} {v}" for k, v in (("model", model), ("gpu", hardware and label)) if v)
        return validate_scenario(data, source=f"scenario {self.name!r} with {what}")

    def fitted_hardware(self) -> list[str]:
        """The hardware the time model was fitted on: `calibration.hardware`, else the scenario's own devices'."""
        return list(self.calibration.hardware) or sorted({s.hardware.name for s in self.device_setups()})

    def time_model_origin(self) -> str:
        """Where the time model's numbers come from, for a report's header: fitted to what (and on which hardware),
        the scenario's own numbers, or the defaults."""
        tm, cal = self.time_model, self.calibration
        what = "efficiencies" if tm.kind == "roofline" else "coefficients"
        if cal.fitted_on:
            of = f" of {cal.model}" if cal.model and cal.model != self.model.name else ""
            on = f" on {', '.join(self.fitted_hardware())}" if tm.kind == "roofline" else ""
            return f"{tm.kind}, {what} fitted to {len(cal.fitted_on)} measured points{of}{on}"
        default = (RooflineTimeModelSpec(kind="roofline", hardware=tm.hardware, tensor_parallel=tm.tensor_parallel)
                   if tm.kind == "roofline" else LinearTimeModelSpec())
        if tm == default:
            return f"{tm.kind}, default {what} (uncalibrated)"
        return f"{tm.kind}, the scenario's {what} (no fit recorded in calibration.fitted_on)"

    def time_model_warning(self) -> str | None:
        """One line when a roofline's fitted efficiencies are applied to hardware they were not fitted on."""
        if self.time_model.kind != "roofline" or not self.calibration.fitted_on:
            return None
        fitted = self.fitted_hardware()
        other = sorted({s.hardware.name for s in self.device_setups()} - set(fitted))
        if not other:
            return None
        return (f"the time model's efficiencies were fitted on {', '.join(fitted)} and are applied to "
                f"{', '.join(other)}: its step times there are an extrapolation (`kvsim calibrate` on measurements "
                f"from that hardware settles them)")

    def device_price(self, device: DeviceSpec) -> tuple[str | None, int, float]:
        """What `device` costs: (its hardware profile or None under a linear time model, its GPUs = the
        tensor-parallel degree, US dollars per GPU-hour: the device's own `price_per_hour_usd`, else its profile's
        list price, else NaN). The one place that rule lives."""
        spec = self.device_time_model(device)
        profile = hardware_profile(spec.hardware) if spec.kind == "roofline" else None
        gpus = spec.tensor_parallel if profile is not None else 1
        price = device.price_per_hour_usd
        if price is None:
            price = profile.price_per_hour_usd if profile is not None else math.nan
        return (profile.name if profile is not None else None), gpus, price

    def fleet_device_time(self, seconds: float) -> tuple[DeviceTime, ...]:
        """The cluster's devices (`cluster.devices()`: a fixed fleet), each provisioned for `seconds`, with its
        price: what a composition root puts in a result's `device_time`."""
        out = []
        for dev in self.cluster.devices():
            hardware, gpus, price = self.device_price(dev)
            out.append(DeviceTime(device=dev.name, hardware=hardware, gpus=gpus, price_per_hour_usd=price,
                                  seconds=seconds))
        return tuple(out)

    def fleet_usd_per_hour(self) -> float:
        """What the cluster's devices cost an hour together (NaN if any has no price): the order `kvsim plan cost`
        tries candidates in."""
        return math.fsum(t.cost_usd for t in self.fleet_device_time(3600.0))

    def all_devices(self) -> list[DeviceSpec]:
        """Every device spec the scenario names (deployments and the default device)."""
        pd = self.cluster.disaggregation
        pools = [] if pd is None else [p.device for p in (pd.prefill, pd.decode) if p.device is not None]
        return [d for dep in self.cluster.deployments for d in dep.devices] + [self.cluster.default_device] + pools

    @model_validator(mode="after")
    def _fits(self) -> Scenario:
        w = self.workload
        try:
            self.engine.check_fits(w.max_request_tokens, self.model.kv_bytes_per_token)
        except ValueError as err:
            if not self.has_sessions:
                raise
            # NOTE: a session's longest request is its context limit, or without one the bound of its history.
            bound = ("workload.context_limit_tokens" if w.context_limit_tokens is not None else
                     "without workload.context_limit_tokens, a session's history may grow to that")
            raise ValueError(f"{err} ({bound}): lower workload.context_limit_tokens or raise the engine's") from None
        return self

    @model_validator(mode="after")
    def _size(self) -> Scenario:
        self.check_size()
        return self

    def memory_estimate_bytes(self) -> dict[str, int]:
        """A rough upper estimate of the memory a run of this scenario needs, by what needs it (the biggest
        Python objects: the engines' per-block state, the requests with their block hashes, the clients)."""
        w = self.workload
        blocks = self.num_blocks if self.engine.kind == "vllm" else 0
        hashes_per_request = w.max_request_tokens // getattr(self.engine, "block_size", 1)
        if self.has_sessions:
            # NOTE: a run keeps every request's record, but only the running sessions' sequences (their hashes).
            running = w.concurrent_sessions or min(w.planned_sessions, 1024)
            requests = round(w.planned_sessions * w.mean_requests_per_session)
            return {
                f"cluster.workers={self.cluster.workers}": self.cluster.workers * _WORKER_BYTES,
                f"{blocks} KV blocks per worker (engine.kv_cache_bytes) x {self.cluster.workers} workers":
                    self.cluster.workers * blocks * _BLOCK_BYTES,
                f"{requests} requests (workload.sessions x turns)": requests * _REQUEST_BYTES,
                f"{running} running sessions' contexts (workload.concurrent_sessions, context_limit_tokens)":
                    running * 2 * hashes_per_request * _HASH_BYTES,
            }
        requests = w.planned_requests + w.warmup_per_prefix * w.prefixes
        return {
            f"cluster.workers={self.cluster.workers}": self.cluster.workers * _WORKER_BYTES,
            f"{blocks} KV blocks per worker (engine.kv_cache_bytes) x {self.cluster.workers} workers":
                self.cluster.workers * blocks * _BLOCK_BYTES,
            f"workload.prefixes={w.prefixes}": w.prefixes * _PREFIX_BYTES,
            f"{requests} requests (workload.min_requests, requests_per_prefix x prefixes)":
                requests * (_REQUEST_BYTES + hashes_per_request * _HASH_BYTES),
            f"workload.concurrency={w.concurrency}": w.concurrency * _CLIENT_BYTES,
        }

    def check_size(self) -> None:
        """Refuse, before anything runs, a scenario whose run would need more than MAX_MEMORY_BYTES (so that an
        absurd size is a one-line error within a second, not a MemoryError or a machine swapping for hours)."""
        parts = self.memory_estimate_bytes()
        total = sum(parts.values())
        if total > MAX_MEMORY_BYTES:
            culprit = max(parts, key=parts.__getitem__)
            raise ValueError(f"too big to simulate: {culprit} needs about {_gib(parts[culprit])} of memory "
                             f"({_gib(total)} in all; kvsim's limit is {_gib(MAX_MEMORY_BYTES)})")

    def with_engine(self, kind: str) -> Scenario:
        """The same scenario on another engine: the options both engines have (KV bytes, block size, model length)
        carry over, then `engine_options[kind]`, the rest take the new engine's defaults."""
        if kind not in ENGINES:
            raise ScenarioError(f"engine.kind: unknown engine {kind!r}; allowed: {', '.join(sorted(ENGINES))}")
        if kind == self.engine.kind:
            return self
        target = ENGINES[kind].Spec
        shared = {k: v for k, v in self.engine.model_dump().items() if k in target.model_fields and k != "kind"}
        data = self.model_dump()
        data["engine"] = {"kind": kind, **shared, **self.engine_options.get(kind, {})}
        return validate_scenario(data, source=f"scenario {self.name!r} on engine {kind!r}")

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


def _device_text(setup: DeviceSetup) -> str:
    """`device gpu-24gb (rtx-3090, 4 workers)`; a device --gpu made is its hardware: `h100-sxm TP2`."""
    tp = f" TP{setup.tensor_parallel}" if setup.tensor_parallel > 1 else ""
    if setup.name == _gpu_label(setup.hardware, setup.tensor_parallel):
        return f"{setup.hardware.name}{tp}"
    shared = f", {setup.workers} workers" if setup.workers > 1 else ""
    return f"device {setup.name} ({setup.hardware.name}{tp}{shared})"


def _gpu_label(profile: HardwareProfile, tensor_parallel: int) -> str:
    """The name of the devices --gpu makes: `h100-sxm`, `h100-sxmx2` (numbered per worker by the cluster)."""
    return profile.name + (f"x{tensor_parallel}" if tensor_parallel > 1 else "")


def _weights_problem(arch: ModelArchitecture, model_name: str, setup: DeviceSetup) -> str | None:
    """What is wrong when `setup`'s workers' weights (each worker its own copy, / tensor_parallel) exceed the
    device's memory (`sim.timing.memory.device_memory_bytes`), else None."""
    weights, memory = weights_bytes(arch), device_memory_bytes(setup.hardware)
    if setup.workers * weights / setup.tensor_parallel <= memory:
        return None
    need = f"{setup.workers} workers x {_gib(weights)}" if setup.workers > 1 else _gib(weights)
    return (f"{_device_text(setup)}: {need} of {model_name} weights / tensor_parallel {setup.tensor_parallel} do not "
            f"fit its {_gib(memory)}")


def _ways_out(setup: DeviceSetup, *, own_devices: bool, fits: Callable[[DeviceSetup], bool]) -> str:
    """What can be changed when `setup` cannot hold its workers: on the scenario's own devices, fewer workers on it
    (when shared), its tensor_parallel, or --gpu (every worker on a device of its own); on --gpu's devices, the
    smallest power-of-two tensor-parallel degree that `fits`."""
    if own_devices:
        fewer = "put fewer workers on it (cluster.deployments), " if setup.workers > 1 else ""
        return f"{fewer}raise its tensor_parallel, or give --gpu NAME[xTP] to put every worker on a device of its own"
    degree = next((tp for tp in (2, 4, 8, 16, 32, 64)
                   if tp > setup.tensor_parallel and fits(replace(setup, tensor_parallel=tp))), None)
    if degree is None:
        return "no tensor-parallel degree up to 64 fits it: give a bigger --gpu"
    return f"raise tensor_parallel: --gpu {setup.hardware.name}x{degree}"


def _profile_batch(engine: Any) -> tuple[int, int]:
    """The tokens and requests of vLLM's start-up profile run for `engine`: its step token budget and request cap
    (vLLM: max_num_batched_tokens, max_num_seqs; SGLang: chunked_prefill_size, max_running_requests), with vLLM's
    defaults for GPUs of 70 GiB and more (8,192 tokens, 256 requests) where the engine leaves them open."""
    tokens = getattr(engine, "max_num_batched_tokens", None) or getattr(engine, "chunked_prefill_size", None) or 8192
    seqs = getattr(engine, "max_num_seqs", None) or getattr(engine, "max_running_requests", None) or 256
    return tokens, seqs


def _kv_budget(arch: ModelArchitecture, setups: list[DeviceSetup], engine: Any) -> KvBudget:
    """vLLM's KV budget per worker on each of `setups`, the smallest (kvsim gives every worker one KV size)."""
    tokens, seqs = _profile_batch(engine)
    return min((vllm_kv_budget(arch, s.hardware, tensor_parallel=s.tensor_parallel, workers_per_device=s.workers,
                               max_num_batched_tokens=tokens, max_num_seqs=seqs) for s in setups),
               key=lambda b: b.kv_bytes)


Marks = dict[Loc, yaml.Mark]
"""Where each key (and list item) of a YAML file starts, by its location (`("engine", "block_size")`)."""

_LEADING_PATH = re.compile(r"[A-Za-z_][\w-]*(?:\.[\w-]+)*")


def scenario_problems(err: ValidationError) -> list[Problem]:
    """Every problem of a scenario that failed validation, located as the file writes it (`validation_problems`):
    an unknown engine or workload kind at its `kind` key, and a section's rule whose message names its field first
    (`think_time_s: ...`) at that field."""
    unknown = {}
    for e in err.errors():
        if e["type"] == "union_tag_invalid" and tuple(e["loc"]) in (("engine",), ("workload",)):
            unknown[tuple(e["loc"])] = str(e["input"].get("kind"))
    problems = []
    for problem in validation_problems(err, Scenario):
        if problem.loc == ("engine",) and ("engine",) in unknown:
            kind = unknown[("engine",)]
            problem = Problem(("engine", "kind"), f"unknown engine {kind!r}; {suggestion(kind, sorted(ENGINES))}")
        elif problem.loc == ("workload",) and ("workload",) in unknown:
            kind = unknown[("workload",)]
            problem = Problem(("workload", "kind"),
                              f"unknown workload kind {kind!r}; {suggestion(kind, WORKLOAD_KINDS)}")
        elif problem.loc == ("workload",) and (head := _FIELD_HEAD.match(problem.message)):
            problem = Problem(("workload", head.group(1)), problem.message[head.end():])
        problems.append(problem)
    return problems


_FIELD_HEAD = re.compile(r"([a-z_]+): ")


def _where(problem: Problem, marks: Marks) -> yaml.Mark | None:
    """The mark of the deepest key of `problem.loc` that the file has (a missing key: its section's). A problem of
    the whole scenario whose message starts with a location (`engine_options.sglang: ...`) is placed there."""
    loc = problem.loc
    if not loc:
        head = _LEADING_PATH.match(problem.message)
        loc = tuple(int(p) if p.isdigit() else p for p in head.group().split(".")) if head else ()
    return next((marks[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in marks), None)


def format_problems(source: str, problems: Sequence[Problem], marks: Marks | None = None) -> str:
    """The error text for `problems` of the input `source` (a file, or what a scenario was made from): one problem
    on one line, `FILE:LINE:COLUMN: where: why` when `marks` place it; several as a line naming `source` and how
    many, then each on its own indented line, in the file's order."""
    placed = [(_where(p, marks or {}), p) for p in problems]
    if len(placed) == 1:
        mark, problem = placed[0]
        return f"{_at(source, mark)}: {problem.text()}"
    placed.sort(key=lambda mp: (mp[0] is None, (mp[0].line, mp[0].column) if mp[0] else (0, 0)))
    lines = [f"{source}: {len(placed)} problems"]
    lines += [f"  {_at(source, mark) + ': ' if mark else ''}{problem.text()}" for mark, problem in placed]
    return "\n".join(lines)


def _at(source: str, mark: yaml.Mark | None) -> str:
    return source if mark is None else f"{source}:{mark.line + 1}:{mark.column + 1}"


def validate_scenario(data: Any, *, source: str, base_dir: Path | None = None, marks: Marks | None = None,
                      checks: Sequence[Callable[[Any], list[Problem]]] = (), check_devices: bool = True) -> Scenario:
    """`data` as a Scenario; a relative `model.config` path is taken from `base_dir` (the scenario file's). A
    ScenarioError lists every problem (`format_problems`), with the line of each when `marks` (the file's) are
    given, those of `checks` included: each is given `data` and returns what the model cannot see (a router's
    options: the router registry is above this layer) or nothing. Without `check_devices` the devices are not
    checked against the weights (a command is about to replace them: --gpu)."""
    problems = [p for check in checks for p in check(data)]
    try:
        scenario = Scenario.model_validate(data, context={"base_dir": base_dir, "check_devices": check_devices})
    except ValidationError as err:
        problems = scenario_problems(err) + problems
    if problems:
        raise ScenarioError(format_problems(source, problems, marks))
    return scenario


def scenarios_dir() -> Path:
    """`scenarios/` beside the packages in a checkout, else the copy a wheel installs as `sim/scenarios`."""
    checkout = Path(__file__).resolve().parent.parent / "scenarios"
    if checkout.is_dir():
        return checkout
    return Path(str(resources.files("sim"))) / "scenarios"


def builtin_scenario_names() -> list[str]:
    """The built-in scenarios, by name (their files' stems in `scenarios_dir()`), sorted."""
    return sorted(p.stem for p in scenarios_dir().glob("*.yaml"))


def builtin_scenario_path(name: str = BUILTIN_SCENARIO) -> Path:
    path = scenarios_dir() / f"{name}.yaml"
    if not path.is_file():
        raise ScenarioError(f"no built-in scenario {name!r}; allowed: {', '.join(builtin_scenario_names())}")
    return path


SHIPPED = "kvsim:"
"""The prefix of a path a scenario gives (`reference:`, `model.config`) to a file that ships with kvsim, relative to
the installed scenarios folder: `kvsim:reference/service-baseline.csv`. A scenario exported from a built-in one
(`kvsim scenarios export`) refers to its files so, and runs from any folder."""


def scenario_file_path(ref: str, base_dir: Path) -> Path:
    """The file a scenario's path `ref` names: `kvsim:REL` is REL in `scenarios_dir()` (see SHIPPED); any other
    relative path is taken from `base_dir`, the scenario file's folder."""
    if ref.startswith(SHIPPED):
        return scenarios_dir() / ref.removeprefix(SHIPPED)
    return base_dir / Path(ref).expanduser()


class _ScenarioLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that gives one key twice (PyYAML keeps the last silently), and
    reading the floats of YAML 1.2 that YAML 1.1 reads as text (`50.4e9`, `1e-3`: no dot, or no exponent sign) as
    numbers.

    NOTE: PyYAML implements YAML 1.1, whose floats need a dot and a signed exponent (`50.4e+9`); YAML 1.2, which
    most other tools read, does not. Only floats are taken from 1.2: `yes`/`no` stay booleans. Files that ship with
    kvsim write floats the 1.1 way, so that any YAML tool reads them as numbers (tests/scenario/test_schema.py)."""

    def construct_mapping(self, node, deep=False):
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


_ScenarioLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"))


def read_yaml(text: str) -> tuple[Any, Marks]:
    """A scenario file's text as data (`_ScenarioLoader`) and the marks of its keys; yaml.YAMLError if not YAML."""
    loader = _ScenarioLoader(text)
    try:
        node = loader.get_single_node()
        data = None if node is None else loader.construct_document(node)
    finally:
        loader.dispose()
    marks: Marks = {}
    _mark_keys(node, (), marks, set())
    return data, marks


def _mark_keys(node: yaml.Node | None, loc: Loc, marks: Marks, entered: set[int]) -> None:
    if node is None or id(node) in entered:  # an alias may refer back to a node it is inside
        return
    entered = entered | {id(node)}
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                marks.setdefault((*loc, key_node.value), key_node.start_mark)
                _mark_keys(value_node, (*loc, key_node.value), marks, entered)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            marks.setdefault((*loc, i), item.start_mark)
            _mark_keys(item, (*loc, i), marks, entered)


def load_scenario(path: str | Path | None = None, *, checks: Sequence[Callable[[Any], list[Problem]]] = (),
                  check_devices: bool = True) -> tuple[Scenario, Path]:
    """Load a scenario file (the built-in one when `path` is None); returns it with its resolved path. A
    ScenarioError names the file and every problem, each with its line; `checks` and `check_devices` as
    `validate_scenario`'s (without it the devices need not hold the model's weights: for --gpu, which replaces
    them)."""
    file = builtin_scenario_path() if path is None else Path(path)
    if not file.is_file():
        raise ScenarioError(f"scenario file {str(file)!r} does not exist")
    try:
        data, marks = read_yaml(file.read_text(encoding="utf-8"))
    except UnicodeDecodeError as err:
        raise ScenarioError(f"{file}: not a UTF-8 text file (byte {err.start}: {err.reason})") from None
    except yaml.MarkedYAMLError as err:
        raise ScenarioError(f"{_at(str(file), err.problem_mark)}: not valid YAML: {err.problem}") from None
    except yaml.YAMLError as err:
        raise ScenarioError(f"{file}: not valid YAML ({' '.join(str(err).split())})") from None
    if not isinstance(data, dict):
        raise ScenarioError(f"{file}: a scenario is a YAML mapping, got {type(data).__name__}")
    model = data.get("model")
    if isinstance(model, dict) and isinstance(model.get("config"), str) and model["config"].startswith(SHIPPED):
        # NOTE: the model spec reads its config relative to the scenario's folder; a shipped one is resolved here
        data = {**data, "model": {**model, "config": str(scenario_file_path(model["config"], file.parent))}}
    scenario = validate_scenario(data, source=str(file), base_dir=file.resolve().parent, marks=marks, checks=checks,
                                 check_devices=check_devices)
    return scenario, file.resolve()


def _with_engine_kv_gib(scenario: Scenario, gib: float, *, option: str, field: str, tier: str,
                        engines: str) -> Scenario:
    """`scenario` with the engine's `field` set to `gib` GiB in bytes; `gib` 0 leaves an engine without the field
    unchanged. `option` names the input in errors, `tier` the KV tier and `engines` which engines model it."""
    if gib < 0 or not math.isfinite(gib):
        raise ScenarioError(f"{option} must be a number of GiB >= 0, got {gib!r}")
    if field not in type(scenario.engine).model_fields:
        if gib == 0:
            return scenario
        raise ScenarioError(f"{option}: engine.kind {scenario.engine.kind!r} has no {tier} in kvsim ({engines})")
    return scenario.with_overrides(**{f"engine.{field}": int(round(gib * GIB))})


def with_cpu_kv_gib(scenario: Scenario, gib: float) -> Scenario:
    """`scenario` with a host (CPU) KV tier of `gib` GiB per worker (vLLM --kv-offloading-size, SGLang HiCache's
    --hicache-size in GiB; 0: none)."""
    return _with_engine_kv_gib(scenario, gib, option="cpu_kv_gib", field="cpu_kv_bytes", tier="host KV tier",
                               engines="vllm: its OffloadingConnector; sglang: HiCache")


def with_gpu_price(scenario: Scenario, price: float | dict[str, float]) -> Scenario:
    """`scenario` with a price per GPU-hour (US dollars) on its devices: `price` for every device, or per hardware
    profile (`{"l4": 0.8}`: the devices on that hardware; the others keep theirs). A price of a profile that no
    device runs is an error naming the profiles used, so a typo is not silently ignored."""
    prices = price if isinstance(price, dict) else None
    if prices is not None:
        try:
            names = {hardware_profile(name).name: usd for name, usd in prices.items()}
        except ValueError as err:
            raise ScenarioError(f"gpu_price_usd: {err}") from None
    for usd in (prices.values() if prices is not None else (price,)):
        if not (isinstance(usd, (int, float)) and math.isfinite(usd) and usd > 0):
            raise ScenarioError(f"gpu_price_usd must be US dollars per GPU-hour > 0, got {usd!r}")
    data = scenario.model_dump()
    cluster = data["cluster"]
    devices = [cluster["default_device"], *(d for dep in cluster["deployments"] for d in dep["devices"])]
    if cluster.get("disaggregation"):
        devices += [p["device"] for p in (cluster["disaggregation"]["prefill"], cluster["disaggregation"]["decode"])
                    if p.get("device")]
    used = set()
    for dev in devices:
        hardware = scenario.device_price(DeviceSpec.model_validate(dev))[0]
        if prices is None:
            dev["price_per_hour_usd"] = float(price)
        elif hardware in names:
            dev["price_per_hour_usd"] = float(names[hardware])
        used.add(hardware)
    if prices is not None and (unused := sorted(set(names) - used)):
        on = ", ".join(sorted(h for h in used if h)) or "none (a linear time model: give one price)"
        raise ScenarioError(f"gpu_price_usd: no device runs on {', '.join(unused)}; the devices' hardware: {on}")
    return validate_scenario(data, source=f"scenario {scenario.name!r} with gpu_price_usd")


def with_pools(scenario: Scenario, prefill_workers: int, decode_workers: int) -> Scenario:
    """`scenario` as a disaggregated cluster of `prefill_workers` + `decode_workers` (its pools' devices, engine
    overrides and link kept when it already has them)."""
    if prefill_workers < 1 or decode_workers < 1:
        raise ScenarioError(f"prefill_workers and decode_workers must be >= 1, got {prefill_workers} and "
                            f"{decode_workers}")
    pd = scenario.cluster.disaggregation
    data = {} if pd is None else pd.model_dump()
    data.setdefault("prefill", {})["workers"] = prefill_workers
    data.setdefault("decode", {})["workers"] = decode_workers
    return scenario.with_overrides(**{"cluster.workers": prefill_workers + decode_workers,
                                      "cluster.disaggregation": data})


def with_shared_kv_gib(scenario: Scenario, gib: float) -> Scenario:
    """`scenario` with a cluster-shared KV store of `gib` GiB for the whole cluster (0: none)."""
    # NOTE: SGLang's HiCache storage backends (its L3: Mooncake, 3FS, file) are not modelled.
    return _with_engine_kv_gib(scenario, gib, option="shared_kv_gib", field="shared_kv_bytes",
                               tier="cluster-shared KV tier", engines="only vllm")


def shared_kv_gib(scenario: Scenario) -> float:
    """The scenario's cluster-shared KV store in GiB (0 when it has none)."""
    return scenario.shared_kv_bytes / GIB


def with_kv_gib(scenario: Scenario, gib: float) -> Scenario:
    """`scenario` with `gib` GiB of GPU KV cache per worker (vLLM --kv-cache-memory-bytes / 2^30), through the
    engine's own capacity rule (a block-count override is replaced)."""
    if gib <= 0 or not math.isfinite(gib):
        raise ScenarioError(f"kv_gib must be a number of GiB > 0, got {gib!r}")
    return scenario.with_overrides(**scenario.engine.capacity_overrides(kv_bytes=int(round(gib * GIB))))


def cpu_kv_gib(scenario: Scenario) -> float:
    """The scenario's host KV tier per worker in GiB (0 when it has none)."""
    return scenario.cpu_kv_bytes / GIB
