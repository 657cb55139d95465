"""How much KV cache vLLM gives a worker on a device when no KV size is given: its own memory rule, with what kvsim
cannot profile estimated from the architecture.

vLLM 0.31.0 and 0.33.0 (the same arithmetic in both) size the KV cache at start-up, per GPU of a worker:

    requested = ceil(total memory x gpu_memory_utilization)        vllm/v1/worker/utils.py::request_memory
    available = requested - non_kv_cache_memory - cudagraph_estimate
                                        vllm/v1/worker/gpu_worker.py::Worker.determine_available_memory
    non_kv_cache_memory = weights + persistent non-torch memory + the activation peak of a profile run
                                        vllm/utils/mem_utils.py::memory_profiling (its docstring draws the three)

`gpu_memory_utilization` defaults to 0.92 (vllm/config/cache.py, CacheConfig), a per-instance fraction: two
instances on one GPU each ask for their share of it. The profile run is one forward pass of max_num_batched_tokens
tokens spread over up to max_num_seqs requests, then a sampler run over their logits
(vllm/v1/worker/gpu_model_runner.py::GPUModelRunner.profile_run); the CUDA-graph estimate is subtracted by default
since 0.21.0 (vllm/envs.py, VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1). A worker's KV cache is its GPUs' together:
with tensor parallelism each GPU holds its share of the KV heads, so a worker of t GPUs holds t x available.

What vLLM measures and kvsim estimates (`activation_bytes`, `NON_TORCH_RESERVE_BYTES`):

    activation peak = max_num_batched_tokens x (2 x hidden + 3 x intermediate / t) x dtype bytes
                      (the residual stream, the normed input, the MLP's gate/up output and its activation)
                    + min(max_num_seqs, max_num_batched_tokens) x vocabulary x 16 B
                      (the sampler's fp32 logits, a sorted fp32 copy and its int64 indices for top-k/top-p)
    non-torch memory and CUDA graphs = 2 GiB per GPU (an assumption, see NON_TORCH_RESERVE_BYTES)

Checked against vLLM's own log of Llama-3-8B on an H100 (vllm-project/vllm pull request 10511: 8,192-token profile,
"PyTorch activation peak memory 1.26GiB"): the estimate gives 1.27 GiB for that shape.
"""

from __future__ import annotations

from dataclasses import dataclass

from sim.config import GIB
from sim.timing.architecture import ModelArchitecture
from sim.timing.hardware import HardwareProfile

GPU_MEMORY_UTILIZATION = 0.92
"""vLLM's default `gpu_memory_utilization` (vllm/config/cache.py, CacheConfig, in 0.31.0 and 0.33.0)."""

NON_TORCH_RESERVE_BYTES = 2 * GIB
"""Per GPU, what vLLM's profiler finds beyond weights and activations: memory outside torch (CUDA libraries'
workspaces, communication buffers) and the CUDA-graph pool. vLLM measures both at start-up; kvsim cannot, and takes
2 GiB: vLLM's log of Llama-3-8B on one H100 shows 1.79 GiB outside torch (pull request 10511, before the CUDA-graph
estimate was subtracted), rounded up for the graphs."""

SAMPLER_BYTES_PER_LOGIT = 16
"""The profile's sampler run per (request, vocabulary entry): fp32 logits (4 B), a sorted fp32 copy (4 B) and its int64
indices (8 B) for top-k/top-p."""


def device_memory_bytes(profile: HardwareProfile) -> int:
    """The memory vLLM sees on a device of `profile`: the datasheet's GB read as GiB.

    NOTE: GPU memory is built in binary units, so a datasheet's "80 GB" is about 80 GiB: vLLM logs total_gpu_memory
    79.22 GiB on an 80 GB H100 (pull request 10511) and 23.55 GiB on a 24 GB card (issue 11550), within 2 % of the GiB
    reading and 6 % above the decimal one (74.5 GiB, 22.4 GiB)."""
    return int(profile.memory_bytes / 1e9 * GIB)


def weights_bytes(arch: ModelArchitecture) -> int:
    """All the model's weights (bf16: 2 bytes a parameter); each GPU of a worker holds 1 / tensor_parallel of them."""
    return arch.num_params * arch.dtype_bytes


def activation_bytes(arch: ModelArchitecture, *, tensor_parallel: int, max_num_batched_tokens: int,
                     max_num_seqs: int) -> int:
    """The activation peak of vLLM's profile run on one GPU, estimated (module docstring): the forward pass's largest
    live tensors at an MLP, plus the sampler's over the logits of min(max_num_seqs, max_num_batched_tokens) requests."""
    mlp = arch.moe_intermediate_size * arch.num_experts_per_tok if arch.num_experts else arch.intermediate_size
    per_token = 2 * arch.hidden_size + 3 * mlp // tensor_parallel
    forward = max_num_batched_tokens * per_token * arch.dtype_bytes
    sampler = min(max_num_seqs, max_num_batched_tokens) * arch.vocab_size * SAMPLER_BYTES_PER_LOGIT
    return forward + sampler


@dataclass(frozen=True, slots=True)
class KvBudget:
    """The KV cache vLLM would give one worker on a device of `hardware`, and how (one GPU of the worker's
    `tensor_parallel`, the device shared by `workers_per_device` workers):

        per GPU = gpu_memory_utilization x device_bytes / workers_per_device - weights_bytes / tensor_parallel
                  - activation_bytes - reserve_bytes
        kv_bytes (per worker) = per GPU x tensor_parallel

    Invariant: every field is what the arithmetic used, so `text()` can show it whole."""

    hardware: str
    tensor_parallel: int
    workers_per_device: int
    device_bytes: int
    gpu_memory_utilization: float
    weights_bytes: int
    """The whole model's; each GPU holds weights_bytes / tensor_parallel."""
    activation_bytes: int
    reserve_bytes: int

    @property
    def per_gpu_bytes(self) -> int:
        requested = self.gpu_memory_utilization * self.device_bytes / self.workers_per_device
        return int(requested - self.weights_bytes / self.tensor_parallel - self.activation_bytes - self.reserve_bytes)

    @property
    def kv_bytes(self) -> int:
        return self.per_gpu_bytes * self.tensor_parallel

    def text(self) -> str:
        """The arithmetic, one line: `0.92 x 80 GiB of h100-sxm - 131 GiB weights / 2 - ... = 5.18 GiB per GPU, x 2
        GPUs`."""
        share = f" / {self.workers_per_device} workers" if self.workers_per_device > 1 else ""
        weights = f"{_gib(self.weights_bytes)} GiB weights" + (f" / {self.tensor_parallel}"
                                                                 if self.tensor_parallel > 1 else "")
        per_gpu = (f"{self.gpu_memory_utilization:g} x {_gib(self.device_bytes)} GiB of {self.hardware}{share} - "
                   f"{weights} - {_gib(self.activation_bytes)} GiB activations - {_gib(self.reserve_bytes)} GiB "
                   f"non-torch and CUDA graphs = {_gib(self.per_gpu_bytes)} GiB")
        return per_gpu + (f" per GPU, x {self.tensor_parallel} GPUs" if self.tensor_parallel > 1 else "")


def _gib(num_bytes: float) -> str:
    return f"{num_bytes / GIB:.3g}"


def vllm_kv_budget(arch: ModelArchitecture, profile: HardwareProfile, *, tensor_parallel: int = 1,
                   workers_per_device: int = 1, max_num_batched_tokens: int, max_num_seqs: int) -> KvBudget:
    """What vLLM (0.31.0, 0.33.0, default gpu_memory_utilization) would allocate for one worker's KV cache, with
    the activation peak and the non-torch memory estimated (module docstring). May be negative: nothing fits."""
    return KvBudget(
        hardware=profile.name, tensor_parallel=tensor_parallel, workers_per_device=workers_per_device,
        device_bytes=device_memory_bytes(profile), gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
        weights_bytes=weights_bytes(arch),
        activation_bytes=activation_bytes(arch, tensor_parallel=tensor_parallel,
                                          max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs),
        reserve_bytes=NON_TORCH_RESERVE_BYTES)
