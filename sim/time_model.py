"""How long one engine step takes on a device of speed 1.0, from the shape of the step.

The simple linear model of the core issue; its parameters live in the scenario (`time_model:`), and a calibrated
model can replace it behind the same `StepTimeModel` protocol.
"""

from __future__ import annotations

from typing import Protocol

from sim.scheduler import StepPlan


class StepTimeModel(Protocol):
    def step_seconds(self, plan: StepPlan) -> float:
        """Seconds of device time the step needs at speed 1.0 (a device of speed s takes 1/s as long)."""
        ...


class LinearStepTimeModel:
    """step_s = base_s + prefill_token_s * prefill tokens + decode_seq_s * decode sequences + context_token_s * context tokens.

    * prefill tokens: prompt tokens computed in the step (chunks included; cached tokens cost nothing here);
    * decode sequences: requests generating one token in the step;
    * context tokens: KV tokens computed before the step that its attention reads, summed over scheduled requests
      (so a hit still pays for reading its cached prefix).
    vLLM mixes prefills and decodes in one forward pass, hence one additive model rather than separate phases.
    """

    __slots__ = ("base_s", "prefill_token_s", "decode_seq_s", "context_token_s")

    def __init__(self, *, base_s: float, prefill_token_s: float, decode_seq_s: float, context_token_s: float) -> None:
        self.base_s = base_s
        self.prefill_token_s = prefill_token_s
        self.decode_seq_s = decode_seq_s
        self.context_token_s = context_token_s

    def step_seconds(self, plan: StepPlan) -> float:
        return (
            self.base_s
            + self.prefill_token_s * plan.num_prefill_tokens
            + self.decode_seq_s * plan.num_decode_seqs
            + self.context_token_s * plan.num_context_tokens
        )
