"""The roofline step-time model: one forward pass per step, its time from the work it does on the hardware.

A step (vLLM: prefill chunks and decodes mixed in one pass; SGLang: an extend or a decode batch) of shape

    T = prefill tokens + decodes          tokens through the layers
    S = requests in the step              one logits row each (vLLM samples each scheduled request's last token)
    A = prefill query-key pairs + decode context tokens + decodes          attention pairs (a decode sees itself)
    R = prefill context tokens (before each chunk) + decode context tokens  KV tokens read

on t tensor-parallel devices of peak dense FLOP/s F, memory bandwidth B and link bandwidth Bl takes

    dense_s = max( (2·P_active·T + 2·hidden·vocab·S) / (t·F·e_compute),  (P_read(T) + hidden·vocab)·bytes / (t·B·e_memory) )
    attn_s  = max( 4·L·H·d·A / (t·F·e_attention),                        kv_bytes_per_token·(R + T) / (t·B·e_memory) )
    comm_s  = 0 if t = 1, else 2·L·(latency + 2·(t-1)/t · T·hidden·bytes / Bl)     (two ring all-reduces per layer)
    step_s  = step_overhead_s + seq_overhead_s·S + dense_s + attn_s + comm_s

P_active: layer parameters a token multiplies through; P_read(T): layer parameters the step reads (all of a dense
model's; an MoE's touched experts); the logits matrix is read once. Each phase is a roofline of its own (GEMMs,
then attention: separate kernels run one after the other), so a mixed step pays for compute-bound prefill GEMMs and
memory-bound decode attention. The efficiency factors (fractions of the peaks, in (0, 1]) and the two overheads
are the only free parameters; `kvsim calibrate` fits them. Not modelled: activations' memory traffic, kernel
launch gaps beyond the fixed overhead, CUDA-graph padding, quantisation, speculative decoding.

A decode-only step of n requests with contexts summing to K has A = K + n and R + T = K + n, so its attention
phase is max(a, b)·(K + n) for constants a, b: consecutive decode steps (K grows by n a step) form an arithmetic
series, which `decode_steps` gives the fast-forward (`sim.engines.stretch`).
"""

from __future__ import annotations

from sim.engines.interface import StepPlan
from sim.timing.architecture import ModelArchitecture
from sim.timing.hardware import HardwareProfile


class RooflineStepTimeModel:
    """A `StepTimeModel` (`sim.engines.interface`) from a model's architecture on a hardware profile (see the module
    docstring for the formula); seconds at device speed 1.0 (a device's `speed` still divides them)."""

    __slots__ = ("step_overhead_s", "seq_overhead_s", "_token_flops_s", "_logit_flops_s", "_pair_s", "_kv_token_s",
                 "_weights_s", "_weights_s_by_tokens", "_arch", "_bytes_s", "_comm_latency_s", "_comm_token_s",
                 "_decode_attn_s")

    def __init__(self, arch: ModelArchitecture, hardware: HardwareProfile, *, tensor_parallel: int = 1,
                 compute_efficiency: float, attention_efficiency: float, memory_efficiency: float,
                 step_overhead_s: float, seq_overhead_s: float = 0.0) -> None:
        for name, e in (("compute_efficiency", compute_efficiency), ("attention_efficiency", attention_efficiency),
                        ("memory_efficiency", memory_efficiency)):
            if not 0 < e <= 1:
                raise ValueError(f"{name} must be in (0, 1], got {e}")
        t = tensor_parallel
        flops = t * hardware.peak_flops
        self._bytes_s = 1.0 / (t * hardware.memory_bandwidth * memory_efficiency)
        self.step_overhead_s = step_overhead_s
        self.seq_overhead_s = seq_overhead_s
        self._arch = arch
        self._token_flops_s = 2.0 * arch.layer_params_active / (flops * compute_efficiency)
        self._logit_flops_s = 2.0 * arch.embedding_params / (flops * compute_efficiency)
        self._pair_s = 4.0 * arch.num_hidden_layers * arch.num_attention_heads * arch.head_dim / (
            flops * attention_efficiency)
        self._kv_token_s = arch.kv_bytes_per_token * self._bytes_s
        self._decode_attn_s = max(self._pair_s, self._kv_token_s)
        # NOTE: a dense model reads the same weights whatever the step (`layer_params_read` of any token count);
        # an MoE's depend on the tokens and are computed per step (`_dense_s`).
        self._weights_s_by_tokens = bool(arch.num_experts)
        self._weights_s = (arch.layer_params_read(1) + arch.embedding_params) * arch.dtype_bytes * self._bytes_s
        if t > 1:
            self._comm_latency_s = 2 * arch.num_hidden_layers * hardware.interconnect_latency
            self._comm_token_s = (2 * arch.num_hidden_layers * 2 * (t - 1) / t * arch.hidden_size * arch.dtype_bytes
                                  / hardware.interconnect_bandwidth)
        else:
            self._comm_latency_s = self._comm_token_s = 0.0

    def _dense_s(self, num_tokens: int, num_seqs: int) -> float:
        compute = self._token_flops_s * num_tokens + self._logit_flops_s * num_seqs
        if self._weights_s_by_tokens:
            arch = self._arch
            weights = (arch.layer_params_read(num_tokens) + arch.embedding_params) * arch.dtype_bytes * self._bytes_s
        else:
            weights = self._weights_s
        return max(compute, weights)

    def _comm_s(self, num_tokens: int) -> float:
        return self._comm_latency_s + self._comm_token_s * num_tokens if self._comm_latency_s else 0.0

    def step_seconds(self, plan: StepPlan) -> float:
        tokens = plan.num_prefill_tokens + plan.num_decode_seqs
        seqs = len(plan.num_scheduled_tokens)
        pairs = plan.num_prefill_attention_pairs + plan.num_decode_context_tokens + plan.num_decode_seqs
        kv_tokens = plan.num_prefill_context_tokens + plan.num_decode_context_tokens + tokens
        attention = max(self._pair_s * pairs, self._kv_token_s * kv_tokens)
        return (self.step_overhead_s + self.seq_overhead_s * seqs + self._dense_s(tokens, seqs) + attention
                + self._comm_s(tokens))

    def decode_steps(self, num_decodes: int, context_tokens: int) -> tuple[float, float]:
        n = num_decodes
        first = (self.step_overhead_s + self.seq_overhead_s * n + self._dense_s(n, n)
                 + self._decode_attn_s * (context_tokens + n) + self._comm_s(n))
        return first, self._decode_attn_s * n
