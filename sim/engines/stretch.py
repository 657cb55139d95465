"""The timing of a decode stretch, shared by the engines: k decode-only steps whose times form an arithmetic series.

Step j (0-based) of a stretch starting at `start_s` takes `first_step_s + j * step_growth_s` (the decodes' contexts
grow by one token per step), so the end of the first k steps, and the step in progress at any moment, follow in
closed form. What the steps do to requests and cache is the engine's (`apply`).
"""

from __future__ import annotations

import math

MIN_STEPS = 2
"""Shorter runs are stepped one at a time (a stretch of one step saves nothing)."""


class StretchTiming:
    """`num_steps` steps from `start_s`; step j takes `first_step_s + j * step_growth_s` seconds."""

    __slots__ = ("start_s", "first_step_s", "step_growth_s", "num_steps")

    def __init__(self, start_s: float, first_step_s: float, step_growth_s: float, num_steps: int) -> None:
        self.start_s = start_s
        self.first_step_s = first_step_s
        self.step_growth_s = step_growth_s
        self.num_steps = num_steps

    def elapsed_s(self, k: int) -> float:
        """Time from the start to the end of the first k steps."""
        return k * self.first_step_s + self.step_growth_s * k * (k - 1) / 2

    @property
    def duration_s(self) -> float:
        return self.elapsed_s(self.num_steps)

    def steps_started_by(self, now_s: float) -> int:
        """Steps whose start time is <= now (the step in progress included), at most `num_steps`."""
        e = now_s - self.start_s
        if e < 0:
            return 0
        a, b = self.first_step_s, self.step_growth_s
        if b > 0:
            # largest j with elapsed(j) = a j + b j (j - 1) / 2 <= e
            j = int((-(a - b / 2) + math.sqrt((a - b / 2) ** 2 + 2 * b * e)) / b)
        else:
            j = int(e / a) if a > 0 else self.num_steps
        while j > 0 and self.elapsed_s(j) > e:
            j -= 1
        while j + 1 <= self.num_steps and self.elapsed_s(j + 1) <= e:
            j += 1
        return min(j + 1, self.num_steps)
