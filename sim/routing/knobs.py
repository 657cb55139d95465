"""Knobs: what a search may change in a router's options, each a float range, an integer range or a choice.

Routers declare their default search space as `search_space` (a tuple of knobs, `policies.base.RouterBase`); the CLI
text of a space and its checks against a router are `sim.studies.search_space`'s. The syntax of one knob:

    key=LOW:HIGH          a float in [LOW, HIGH]           prefill_load_scale=0:16
    key=LOW:HIGH:log      the same, sampled on a log scale  scrape_interval_s=0.01:1:log   (LOW > 0)
    key=LOW..HIGH         an integer in LOW..HIGH inclusive balance_abs_threshold=0..64, workers=2..12
    key=LOW..HIGH:log     the same on a log scale           prefix_blocks=1..64:log        (LOW >= 1)
    key=a|b|c             one of the values (YAML scalars)  min_load_tie=first|fewest_processed, rebalancing=true|false
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from sim.routing.spec import format_value

SYNTAX = "key=LOW:HIGH[:log] (float), key=LOW..HIGH[:log] (integer), key=a|b|c (choice), comma-separated"

@dataclass(frozen=True, slots=True)
class FloatKnob:
    """A float option in [low, high] (log: sampled uniformly in log space, low > 0)."""

    key: str
    low: float
    high: float
    log: bool = False

    def __post_init__(self) -> None:
        if not (math.isfinite(self.low) and math.isfinite(self.high) and self.low < self.high):
            raise ValueError(f"{self.key}: need LOW < HIGH, got {self.low:g}:{self.high:g} ({SYNTAX})")
        if self.log and self.low <= 0:
            raise ValueError(f"{self.key}: a log range needs LOW > 0, got {self.low:g} ({SYNTAX})")

    @property
    def extremes(self) -> tuple[float, ...]:
        return (self.low, self.high)

    def contains(self, value: Any) -> bool:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and self.low <= value <= self.high

    def text(self) -> str:
        return f"{self.key}={self.low:g}:{self.high:g}" + (":log" if self.log else "")


@dataclass(frozen=True, slots=True)
class IntKnob:
    """An integer option in low..high, both included (log: sampled in log space, low >= 1)."""

    key: str
    low: int
    high: int
    log: bool = False

    def __post_init__(self) -> None:
        if self.low >= self.high:
            raise ValueError(f"{self.key}: need LOW < HIGH, got {self.low}..{self.high} ({SYNTAX})")
        if self.log and self.low < 1:
            raise ValueError(f"{self.key}: a log range needs LOW >= 1, got {self.low} ({SYNTAX})")

    @property
    def extremes(self) -> tuple[int, ...]:
        return (self.low, self.high)

    def contains(self, value: Any) -> bool:
        return isinstance(value, int) and not isinstance(value, bool) and self.low <= value <= self.high

    def text(self) -> str:
        return f"{self.key}={self.low}..{self.high}" + (":log" if self.log else "")


@dataclass(frozen=True, slots=True)
class ChoiceKnob:
    """One of `choices` (distinct YAML scalars: str, int, float, bool or None), in the order given."""

    key: str
    choices: tuple[Any, ...]

    def __post_init__(self) -> None:
        if len(self.choices) < 2 or len(set(map(repr, self.choices))) != len(self.choices):
            raise ValueError(f"{self.key}: give two or more distinct choices a|b|..., got "
                             f"{'|'.join(map(format_value, self.choices))} ({SYNTAX})")

    @property
    def extremes(self) -> tuple[Any, ...]:
        return self.choices

    def contains(self, value: Any) -> bool:
        return any(type(value) is type(c) and value == c for c in self.choices)

    def text(self) -> str:
        return f"{self.key}=" + "|".join(map(format_value, self.choices))


Knob = FloatKnob | IntKnob | ChoiceKnob
SearchSpace = tuple[Knob, ...]
