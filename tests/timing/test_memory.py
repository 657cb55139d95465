"""vLLM's KV memory rule (sim/timing/memory.py): what a worker's KV cache is when no size is given.

Narrated: the toy model of test_roofline on a 10 GB device, every term worked out by hand. Checked against vLLM's own
start-up log (pull request 10511: Llama-3-8B on an H100, 8,192-token profile, activation peak 1.26 GiB, weights 14.96
GiB, 79.22 GiB of device memory). Then the shipped models on the Done-when setup: Llama-3.1-70B on two H100s.
"""

from __future__ import annotations

import pytest

from sim.config import GIB
from sim.timing.architecture import load_architecture
from sim.timing.hardware import hardware_profile
from sim.timing.memory import (
    GPU_MEMORY_UTILIZATION, NON_TORCH_RESERVE_BYTES, activation_bytes, device_memory_bytes, vllm_kv_budget,
    weights_bytes,
)
from tests.timing.test_roofline import DEVICE, TOY


def test_vllm_defaults_are_the_ones_cited():
    # vllm/config/cache.py CacheConfig.gpu_memory_utilization (0.31.0 and 0.33.0); the reserve is kvsim's assumption
    assert GPU_MEMORY_UTILIZATION == 0.92
    assert NON_TORCH_RESERVE_BYTES == 2 * GIB


def test_the_toy_budget_term_by_term():
    # The toy: hidden 8, MLP 16, vocabulary 32, bf16, 576 x 1 + 2 x 256 = 1,088 parameters -> 2,176 bytes of weights.
    assert weights_bytes(TOY) == 2 * TOY.num_params == 2_176
    # Profile of 100 tokens over min(4, 100) = 4 requests, TP 2:
    #   forward 100 x (2 x 8 + 3 x 16 / 2) x 2 B = 100 x 40 x 2 = 8,000;  sampler 4 x 32 x 16 B = 2,048
    assert activation_bytes(TOY, tensor_parallel=2, max_num_batched_tokens=100, max_num_seqs=4) == 10_048
    # DEVICE says 1e9 bytes: "1 GB", read as 1 GiB. Shared by 2 workers, TP 2, per GPU:
    #   0.92 x 1 GiB / 2 - 2,176 / 2 - 10,048 - 2 GiB = 0.46 GiB - 11,136 - 2 GiB < 0: nothing fits
    budget = vllm_kv_budget(TOY, DEVICE, tensor_parallel=2, workers_per_device=2, max_num_batched_tokens=100,
                            max_num_seqs=4)
    assert device_memory_bytes(DEVICE) == GIB
    assert budget.per_gpu_bytes == int(0.92 * GIB / 2 - 1_088 - 10_048 - 2 * GIB) < 0
    assert budget.kv_bytes == 2 * budget.per_gpu_bytes
    assert budget.text() == ("0.92 x 1 GiB of toy / 2 workers - 2.03e-06 GiB weights / 2 - 9.36e-06 GiB activations - "
                             "2 GiB non-torch and CUDA graphs = -1.54 GiB per GPU, x 2 GPUs")


def test_the_activation_estimate_matches_vllms_own_log():
    # vllm-project/vllm pull request 10511, Llama-3-8B on an H100: "PyTorch activation peak memory 1.26GiB" with
    # an 8,192-token profile (same architecture as the shipped Llama-3.1-8B), "model weights take 14.96GiB"
    _, arch = load_architecture("Llama-3.1-8B")
    peak = activation_bytes(arch, tensor_parallel=1, max_num_batched_tokens=8192, max_num_seqs=256)
    assert peak / GIB == pytest.approx(1.26, abs=0.02)
    assert weights_bytes(arch) / GIB == pytest.approx(14.96, abs=0.01)
    # "total_gpu_memory 79.22GiB" on the 80 GB H100: the GiB reading is within 1 %
    assert device_memory_bytes(hardware_profile("H100")) / GIB == pytest.approx(79.22, rel=0.01)


def test_llama_70b_on_two_h100s_holds_about_fourteen_prompts_of_the_reference():
    _, arch = load_architecture("Llama-3.1-70B")
    budget = vllm_kv_budget(arch, hardware_profile("H100"), tensor_parallel=2, max_num_batched_tokens=2048,
                            max_num_seqs=256)
    # 0.92 x 80 GiB = 73.6; 131.4 GiB of weights / 2 = 65.7; 0.72 GiB of activations; 2 GiB: 5.18 GiB per GPU
    assert budget.per_gpu_bytes / GIB == pytest.approx(5.18, abs=0.01)
    assert budget.kv_bytes / GIB == pytest.approx(10.35, abs=0.01)
    prompts = budget.kv_bytes / arch.kv_bytes_per_token / 2371  # 320 KiB per token, 2,371-token prompts
    assert 14 < prompts < 15
    assert budget.text() == ("0.92 x 80 GiB of h100-sxm - 131 GiB weights / 2 - 0.716 GiB activations - 2 GiB "
                             "non-torch and CUDA graphs = 5.18 GiB per GPU, x 2 GPUs")


def test_a_shared_device_is_split_and_tensor_parallelism_adds_kv():
    _, arch = load_architecture("Qwen3-0.6B")
    rtx = hardware_profile("rtx-3090")
    alone = vllm_kv_budget(arch, rtx, max_num_batched_tokens=2048, max_num_seqs=256)
    shared = vllm_kv_budget(arch, rtx, workers_per_device=4, max_num_batched_tokens=2048, max_num_seqs=256)
    # each of 4 workers asks for a quarter of 0.92 x 24 GiB, then loads its own weights and profiles its own run
    assert alone.per_gpu_bytes - shared.per_gpu_bytes == pytest.approx(0.92 * 24 * GIB * 3 / 4, abs=1)
    _, big = load_architecture("Llama-3.1-70B")
    h100 = hardware_profile("H100")
    by_tp = {tp: vllm_kv_budget(big, h100, tensor_parallel=tp, max_num_batched_tokens=2048, max_num_seqs=256).kv_bytes
             for tp in (2, 4, 8)}
    assert by_tp[2] < by_tp[4] < by_tp[8]
