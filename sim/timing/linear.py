"""How long one engine step takes on a device of speed 1.0, from the shape of the step.

vLLM runs one forward pass per step that mixes prefill chunks and decodes (chunked prefill; SGLang runs prefill and
decode batches as separate passes, each one step), so the model is one additive expression over the step's shape:

    step_s = base_s
           + prefill_token_s          x  prompt tokens computed in the step (chunks and recomputation included)
           + decode_seq_s             x  requests decoding one token
           + decode_context_token_s   x  KV tokens the decodes read (their context lengths, summed)
           + prefill_attention_pair_s x  attention pairs of the prefill tokens: a chunk of n new tokens after p
                                         computed (or cached) ones has n x (p + (n + 1) / 2)

A cached prefix costs no prefill compute but still costs attention: a hit of p tokens with an n-token tail pays
n x (p + (n + 1) / 2) pairs. The parameters live in the scenario (`time_model:`) and are fitted by
`kvsim calibrate`; a device of speed s divides the result by s.
"""

from __future__ import annotations

from sim.engines.interface import StepPlan


class LinearStepTimeModel:
    """The additive model of the module docstring (linear in each feature of the step); a `StepTimeModel`
    (`sim.engines.interface`)."""

    __slots__ = ("base_s", "prefill_token_s", "decode_seq_s", "decode_context_token_s", "prefill_attention_pair_s")

    def __init__(self, *, base_s: float, prefill_token_s: float, decode_seq_s: float,
                 decode_context_token_s: float = 0.0, prefill_attention_pair_s: float = 0.0) -> None:
        self.base_s = base_s
        self.prefill_token_s = prefill_token_s
        self.decode_seq_s = decode_seq_s
        self.decode_context_token_s = decode_context_token_s
        self.prefill_attention_pair_s = prefill_attention_pair_s

    def decode_steps(self, num_decodes: int, context_tokens: int) -> tuple[float, float]:
        first = self.base_s + self.decode_seq_s * num_decodes + self.decode_context_token_s * context_tokens
        return first, self.decode_context_token_s * num_decodes

    def step_seconds(self, plan: StepPlan) -> float:
        return (
            self.base_s
            + self.prefill_token_s * plan.num_prefill_tokens
            + self.decode_seq_s * plan.num_decode_seqs
            + self.decode_context_token_s * plan.num_decode_context_tokens
            + self.prefill_attention_pair_s * plan.num_prefill_attention_pairs
        )
