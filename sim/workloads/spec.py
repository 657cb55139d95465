"""The `workload:` section of a scenario, by `kind`: a shared-prefix workload's shape (`sim.workloads.shared_prefix`
turns it into requests) or a sessions workload's (`sim.workloads.session_workload`: chats and agent loops, see
`sim.workloads.session_spec`), and the token-length distributions they draw from."""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field, model_validator

from sim.config import ConfigModel
from sim.workloads.arrival_curve import ArrivalCurveSpec


class LengthSpec(ConfigModel):
    """A token-length distribution (a plain integer in a scenario means a fixed length).

    uniform: integers in [low, high]; normal / lognormal: mean and sd in tokens, rounded and clipped to [low, high]
    (lognormal is parameterised by the mean and sd of the length itself, not of its logarithm).
    """

    kind: Literal["uniform", "normal", "lognormal"] = Field(description="Distribution family.")
    low: int = Field(ge=1, description="Smallest length (tokens).")
    high: int = Field(ge=1, description="Largest length (tokens).")
    mean: float | None = Field(None, gt=0, description="Mean length (normal, lognormal).")
    sd: float | None = Field(None, ge=0, description="Standard deviation (normal, lognormal).")

    @model_validator(mode="after")
    def _check(self) -> LengthSpec:
        if self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        if self.kind != "uniform" and (self.mean is None or self.sd is None):
            raise ValueError(f"a {self.kind} length needs mean and sd")
        return self


Length = int | LengthSpec


def length_min(length: Length) -> int:
    return length if isinstance(length, int) else length.low


def length_mean(length: Length) -> float:
    if isinstance(length, int):
        return float(length)
    if length.kind == "uniform":
        return (length.low + length.high) / 2
    return float(min(max(length.mean, length.low), length.high))  # clipping moves it little; a screen, not exact


def length_max(length: Length) -> int:
    return length if isinstance(length, int) else length.high


def sample_length(length: Length, rng) -> int:
    """One length drawn with `rng` (a random.Random)."""
    if isinstance(length, int):
        return length
    if length.kind == "uniform":
        value = rng.randint(length.low, length.high)
    elif length.kind == "normal":
        value = round(rng.gauss(length.mean, length.sd))
    else:
        sigma2 = math.log(1 + (length.sd / length.mean) ** 2)
        value = round(rng.lognormvariate(math.log(length.mean) - sigma2 / 2, math.sqrt(sigma2)))
    return min(max(value, length.low), length.high)


class SharedPrefixSpec(ConfigModel):
    """A shared-prefix workload: N prefixes with a popularity, each request a prefix + its own tail + outputs.

    The reference experiment is the special case of uniform popularity, fixed lengths and a closed loop.
    """

    kind: Literal["shared-prefix"] = Field("shared-prefix", description=(
        "The workload's kind: shared-prefix (this one; the default when a file gives no kind) or sessions."))

    prefixes: int = Field(ge=1, description="Distinct shared prefixes N.")
    popularity: Literal["uniform", "zipf", "weights"] = Field("uniform", description="How a request's prefix is drawn.")
    zipf_exponent: float = Field(1.0, ge=0, description="Zipf exponent s (popularity of rank k proportional to k^-s).")
    weights: list[float] | None = Field(None, description="Explicit relative popularity per prefix (popularity: weights).")
    prefix_tokens: Length = Field(description="Tokens of each shared prefix (drawn once per prefix if a distribution).")
    tail_tokens: Length = Field(description="Tokens of each request's unique tail (after the prefix).")
    output_tokens: Length = Field(description="Output tokens per request (max_tokens, EOS ignored).")
    min_requests: int = Field(200, ge=1, description="Measured requests = max(min_requests, requests_per_prefix x N).")
    requests_per_prefix: int = Field(20, ge=0, description="See min_requests.")
    warmup_per_prefix: int = Field(1, ge=0, description="Warm-up requests per prefix, sent one at a time first, excluded from statistics.")
    discard_first: int = Field(0, ge=0, description="Measured requests at the start also excluded from statistics (steady state).")
    concurrency: int = Field(8, ge=1, description="Closed loop: requests kept in flight (unless arrival_rate_rps is set).")
    arrival_rate_rps: float | None = Field(None, gt=0, description="Open loop: Poisson arrivals at this rate (requests/s) instead of a closed loop.")
    arrival_curve: ArrivalCurveSpec | None = Field(None, description=(
        "Open loop: Poisson arrivals whose rate follows this curve over the measured phase (time 0: after the "
        "warm-ups), instead of a closed loop or arrival_rate_rps: {kind: constant|piecewise|diurnal|bursts, ...} "
        "(docs/concepts/load-curves.md)."))
    duration_s: float | None = Field(None, gt=0, description=(
        "With arrival_curve: send the curve's arrivals in [0, duration_s) (their number replaces min_requests and "
        "requests_per_prefix). Absent: the curve's first max(min_requests, requests_per_prefix x N) arrivals."))

    @model_validator(mode="after")
    def _check(self) -> SharedPrefixSpec:
        for name, least in (("prefix_tokens", 0), ("tail_tokens", 0), ("output_tokens", 1)):
            if length_min(getattr(self, name)) < least:
                raise ValueError(f"{name} must be >= {least} tokens, got {getattr(self, name)}")
        if length_min(self.prefix_tokens) + length_min(self.tail_tokens) < 1:
            raise ValueError("a prompt needs at least one token: prefix_tokens + tail_tokens must be >= 1")
        if self.popularity == "weights":
            if self.weights is None or len(self.weights) != self.prefixes:
                raise ValueError(f"popularity 'weights' needs one weight per prefix ({self.prefixes})")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError("weights must be >= 0 with a positive sum")
        if self.arrival_curve is not None and self.arrival_rate_rps is not None:
            raise ValueError("arrival_curve: give arrival_curve or arrival_rate_rps, not both (a constant rate is "
                             "{kind: constant, rate_rps: R})")
        if self.duration_s is not None and self.arrival_curve is None:
            raise ValueError("duration_s: used only with arrival_curve (the span of its arrivals)")
        if self.duration_s is None and self.discard_first >= self.num_requests:
            raise ValueError(f"discard_first ({self.discard_first}) leaves no measured request of {self.num_requests}")
        return self

    @property
    def prompt_tokens(self) -> int:
        """Mean prompt length (tokens), rounded."""
        return round(length_mean(self.prefix_tokens) + length_mean(self.tail_tokens))

    @property
    def max_request_tokens(self) -> int:
        return length_max(self.prefix_tokens) + length_max(self.tail_tokens) + length_max(self.output_tokens)

    @property
    def num_requests(self) -> int:
        """Measured requests: max(min_requests, requests_per_prefix x N); with a curve and duration_s, the arrivals
        drawn in that span (`planned_requests` estimates them)."""
        return max(self.min_requests, self.requests_per_prefix * self.prefixes)

    @property
    def open_loop(self) -> bool:
        """Whether requests arrive on their own (arrival_rate_rps or arrival_curve) rather than from C clients."""
        return self.arrival_rate_rps is not None or self.arrival_curve is not None

    @property
    def planned_requests(self) -> int:
        """The measured requests to expect: `num_requests`, or with a curve over duration_s the arrivals it expects
        there (Λ(duration_s), rounded up; the drawn count is Poisson around it)."""
        if self.duration_s is None:
            return self.num_requests
        return math.ceil(self.arrival_curve.curve().cumulative(self.duration_s))

    def popularity_weights(self) -> list[float]:
        """Probability of each prefix id (rank order: prefix 0 is the most popular under Zipf)."""
        return rank_weights(self.prefixes, self.popularity, self.zipf_exponent, self.weights)


def rank_weights(n: int, popularity: str, zipf_exponent: float = 1.0,
                 weights: list[float] | None = None) -> list[float]:
    """Probability of each of `n` ranks: uniform, zipf (rank k proportional to (k + 1)^-s) or the given weights."""
    if popularity == "uniform":
        raw = [1.0] * n
    elif popularity == "zipf":
        raw = [(k + 1) ** -zipf_exponent for k in range(n)]
    else:
        raw = list(weights)
    total = sum(raw)
    return [w / total for w in raw]
