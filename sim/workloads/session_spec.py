"""The `workload:` section of kind `sessions`: chats and agent loops (`sim.workloads.session_workload` turns it into
sessions), and the duration distributions (seconds) their pauses are drawn from.

Every field says what it means in its description (`kvsim schema`, docs/scenarios.md); the rules that span fields
(which style takes which pause, what a context limit must hold, what subagents need) are checked here, each error
naming its field first (`think_time_s: ...`), so that the scenario loader places it on that key's line.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from sim.config import ConfigModel
from sim.workloads.arrival_curve import ArrivalCurveSpec
from sim.workloads.spec import Length, length_max, length_mean, length_min, rank_weights


class DurationSpec(ConfigModel):
    """A duration distribution in seconds (a plain number in a scenario means a fixed duration).

    fixed: `value`; exponential: `mean`; lognormal: `mean` and `sd` of the duration itself (not of its logarithm);
    uniform: in [`low`, `high`]. Exponential and lognormal draws are clipped to [`low`, `high`] (`high` absent: no
    upper clip).
    """

    kind: Literal["fixed", "exponential", "lognormal", "uniform"] = Field(description="Distribution family.")
    value: float | None = Field(None, ge=0, description="The duration (s) of kind fixed.")
    mean: float | None = Field(None, gt=0, description="Mean duration (s) of kind exponential or lognormal.")
    sd: float | None = Field(None, ge=0, description="Standard deviation (s) of kind lognormal.")
    low: float = Field(0.0, ge=0, description="Shortest duration (s): uniform's lower bound, the others' clip.")
    high: float | None = Field(None, ge=0, description="Longest duration (s): uniform's upper bound (required "
                                                       "there), the others' clip (absent: none).")

    @model_validator(mode="after")
    def _check(self) -> DurationSpec:
        needs = {"fixed": ("value",), "exponential": ("mean",), "lognormal": ("mean", "sd"), "uniform": ("high",)}
        takes = {"fixed": {"value"}, "exponential": {"mean", "low", "high"},
                 "lognormal": {"mean", "sd", "low", "high"}, "uniform": {"low", "high"}}
        missing = [name for name in needs[self.kind] if getattr(self, name) is None]
        if missing:
            raise ValueError(f"a {self.kind} duration needs {' and '.join(missing)}")
        # NOTE: by value, not by the keys given: a dumped spec (with_engine, with_overrides) gives every key.
        given = {name for name in ("value", "mean", "sd", "high") if getattr(self, name) is not None}
        extra = sorted(given - takes[self.kind] | ({"low"} - takes[self.kind] if self.low else set()))
        if extra:
            raise ValueError(f"a {self.kind} duration takes no {', '.join(extra)} (it takes "
                             f"{', '.join(sorted(takes[self.kind]))})")
        if self.high is not None and self.high < self.low:
            raise ValueError(f"high ({self.high}) must be >= low ({self.low})")
        return self


Seconds = Annotated[float, Field(ge=0)] | DurationSpec


def seconds_mean(duration: Seconds) -> float:
    """The mean of `duration` before clipping (a screen, not exact)."""
    if not isinstance(duration, DurationSpec):
        return float(duration)
    if duration.kind == "fixed":
        return duration.value
    if duration.kind == "uniform":
        return (duration.low + duration.high) / 2
    return duration.mean


def sample_seconds(duration: Seconds, rng) -> float:
    """One duration drawn with `rng` (a random.Random)."""
    if not isinstance(duration, DurationSpec):
        return float(duration)
    kind = duration.kind
    if kind == "fixed":
        return duration.value
    if kind == "uniform":
        return rng.uniform(duration.low, duration.high)
    if kind == "exponential":
        value = rng.expovariate(1 / duration.mean)
    else:
        sigma2 = math.log(1 + (duration.sd / duration.mean) ** 2)
        value = rng.lognormvariate(math.log(duration.mean) - sigma2 / 2, math.sqrt(sigma2))
    value = max(value, duration.low)
    return value if duration.high is None else min(value, duration.high)


def _length(description: str):
    return Field(description=description + " Tokens: a number, or {kind: uniform|normal|lognormal, low, high, "
                                           "mean, sd}.")


class SessionsSpec(ConfigModel):
    """A sessions workload: chats whose every turn resends the history, or agent loops that append a tool result
    and call the model again, with subagents forked from an agent's context.

    A session draws its group (its system prompt, shared with the group's other sessions), its number of turns, and
    per turn a message (chat: the user's; agent: the tool's result, turn 0's being the task), an output length and
    the pause before the next turn (chat: the user's think time; agent: the tool's latency). Its sequences are
    `sim.workloads.sequence.TokenSequence`s, so every turn's prompt is the last one's prompt and output plus the new
    message, until a context limit rewrites the history (which breaks the prefix after the system prompt).
    """

    kind: Literal["sessions"] = Field(description="The workload's kind: sessions (this one) or shared-prefix.")
    style: Literal["chat", "agent"] = Field(description=(
        "chat: a user's conversation (messages, think times); agent: a tool-calling loop (tool results, tool "
        "latencies, optional subagents)."))
    sessions: int | None = Field(None, ge=1, description=(
        "Sessions in the run (each with all its turns; subagents not counted). Required unless arrival_curve and "
        "duration_s give them."))
    session_rate_per_s: float | None = Field(None, gt=0, description=(
        "Open loop: sessions start at Poisson times at this rate (sessions/s). Give this, arrival_curve or "
        "concurrent_sessions."))
    arrival_curve: ArrivalCurveSpec | None = Field(None, description=(
        "Open loop: sessions start at Poisson times whose rate (sessions/s) follows this curve: {kind: constant|"
        "piecewise|diurnal|bursts, ...} (docs/concepts/load-curves.md). Give this, session_rate_per_s or "
        "concurrent_sessions."))
    duration_s: float | None = Field(None, gt=0, description=(
        "With arrival_curve: the sessions are those starting in [0, duration_s) (instead of sessions); their turns "
        "run on past it."))
    concurrent_sessions: int | None = Field(None, ge=1, description=(
        "Closed loop: this many sessions run at once, a new one starting when one ends. Give this, "
        "session_rate_per_s or arrival_curve."))
    groups: int = Field(1, ge=1, description=(
        "Distinct system prompts (tool schemas) G; a session draws its group by popularity and shares its system "
        "prompt with the group's other sessions."))
    popularity: Literal["uniform", "zipf"] = Field("uniform", description="How a session's group is drawn.")
    zipf_exponent: float = Field(1.0, ge=0, description="Zipf exponent s (popularity of group rank k proportional "
                                                        "to k^-s; popularity zipf).")
    system_tokens: Length = _length("Tokens of each group's system prompt (drawn once per group; 0: none).")
    turns: Length = Field(description="Turns (model calls) per session, drawn per session: a number >= 1, or "
                                      "{kind: uniform|normal|lognormal, low, high, mean, sd}.")
    user_tokens: Length = _length("Tokens each turn appends before the model is called: chat, the user's message; "
                                  "agent, the tool's result (turn 0: the task).")
    output_tokens: Length = _length("Output tokens per turn (max_tokens, EOS ignored); they are part of the next "
                                    "turn's prompt.")
    think_time_s: Seconds | None = Field(None, description=(
        "chat: the user's pause (s) from a response to the next message: a number, or {kind: fixed|exponential|"
        "lognormal|uniform, value, mean, sd, low, high}."))
    tool_latency_s: Seconds | None = Field(None, description=(
        "agent: the tool's run time (s) from a response to the next call, the same forms as think_time_s."))
    context_limit_tokens: int | None = Field(None, ge=1, description=(
        "The most tokens a turn's prompt + output may hold; a turn over it first rewrites its history "
        "(on_context_limit). Absent: none (the history grows; the engine's max_model_len must hold the longest)."))
    on_context_limit: Literal["truncate", "compact"] = Field("truncate", description=(
        "truncate: drop the oldest turns (system prompt kept) until the turn fits; compact: replace the history by a "
        "summary of compact_summary_tokens. Both break the prefix after the system prompt."))
    compact_summary_tokens: Length | None = Field(None, description=(
        "Tokens of a compaction's summary (on_context_limit compact; required there). Tokens: a number, or "
        "{kind: ..., low, high, mean, sd}."))
    subagent_probability: float = Field(0.0, ge=0, le=1, description=(
        "agent: the chance that a turn (but the last) also starts a subagent, which forks from the agent's context "
        "and returns its result into the agent's next turn (the agent waits for it)."))
    subagent_turns: Length | None = Field(None, description=(
        "agent: turns of a subagent (required with subagent_probability > 0). Tokens: a number, or "
        "{kind: ..., low, high, mean, sd}; here a count of turns."))
    subagent_result_tokens: Length | None = Field(None, description=(
        "agent: tokens of a subagent's result, its last turn's output, which the agent's next turn appends "
        "(required with subagent_probability > 0)."))

    @model_validator(mode="after")
    def _check(self) -> SessionsSpec:
        starts = [n for n in ("session_rate_per_s", "arrival_curve", "concurrent_sessions")
                  if getattr(self, n) is not None]
        if len(starts) != 1:
            raise ValueError(f"{(starts or ['session_rate_per_s'])[0]}: give one of session_rate_per_s (Poisson "
                             "session starts), arrival_curve (starts at a rate that follows a curve) or "
                             f"concurrent_sessions (a closed loop){'; got ' + ' and '.join(starts) if starts else ''}")
        if self.duration_s is not None and self.arrival_curve is None:
            raise ValueError("duration_s: used only with arrival_curve (the span of its session starts)")
        if (self.sessions is None) == (self.duration_s is None):
            raise ValueError("sessions: give sessions (how many) or, with arrival_curve, duration_s (the span of "
                             "their starts), one of them")
        gap, other = ("think_time_s", "tool_latency_s") if self.style == "chat" else ("tool_latency_s", "think_time_s")
        if getattr(self, other) is not None:
            raise ValueError(f"{other}: not a field of style {self.style}; its pause between turns is {gap}")
        if getattr(self, gap) is None:
            raise ValueError(f"{gap}: style {self.style} needs it (the pause before each next turn, seconds)")
        for name, least in (("system_tokens", 0), ("turns", 1), ("user_tokens", 1), ("output_tokens", 1)):
            if length_min(getattr(self, name)) < least:
                raise ValueError(f"{name}: must be >= {least}, got {getattr(self, name)}")
        subagent_fields = ("subagent_turns", "subagent_result_tokens")
        if self.style == "chat":
            given = [n for n in subagent_fields if getattr(self, n) is not None]
            if self.subagent_probability > 0 or given:
                raise ValueError(f"{(given or ['subagent_probability'])[0]}: subagents are of style agent, not chat")
        elif self.subagent_probability > 0:
            for name in subagent_fields:
                value = getattr(self, name)
                if value is None:
                    raise ValueError(f"{name}: subagent_probability > 0 needs it")
                if length_min(value) < 1:
                    raise ValueError(f"{name}: must be >= 1, got {value}")
        else:
            given = [n for n in subagent_fields if getattr(self, n) is not None]
            if given:
                raise ValueError(f"{given[0]}: used only with subagent_probability > 0")
        if self.on_context_limit == "compact":
            if self.compact_summary_tokens is None:
                raise ValueError("compact_summary_tokens: on_context_limit compact needs it")
            if length_min(self.compact_summary_tokens) < 1:
                raise ValueError(f"compact_summary_tokens: must be >= 1, got {self.compact_summary_tokens}")
        elif self.compact_summary_tokens is not None:
            raise ValueError("compact_summary_tokens: used only with on_context_limit compact")
        if self.context_limit_tokens is None and self.on_context_limit != "truncate":
            raise ValueError("on_context_limit: used only with context_limit_tokens")
        if self.context_limit_tokens is not None and self.context_limit_tokens < self.turn_floor_tokens:
            summary = " a summary," * (self.on_context_limit == "compact")
            raise ValueError(f"context_limit_tokens: {self.context_limit_tokens} cannot hold one turn: a system "
                             f"prompt,{summary} the newest message and an output need up to "
                             f"{self.turn_floor_tokens} tokens")
        return self

    @property
    def planned_sessions(self) -> int:
        """The sessions to expect: `sessions`, or the starts the curve expects in [0, duration_s) (rounded up; the
        drawn count is Poisson around it)."""
        if self.sessions is not None:
            return self.sessions
        return math.ceil(self.arrival_curve.curve().cumulative(self.duration_s))

    @property
    def has_subagents(self) -> bool:
        return self.style == "agent" and self.subagent_probability > 0

    @property
    def message_max_tokens(self) -> int:
        """The most tokens one turn appends before its call: a message, and after a subagent also its result."""
        result = length_max(self.subagent_result_tokens) if self.has_subagents else 0
        return length_max(self.user_tokens) + result

    @property
    def turn_floor_tokens(self) -> int:
        """The least a context limit must hold: the longest system prompt, newest message (a compaction's summary
        too) and output. A subagent's task follows a copy of its agent's context, so it needs no more."""
        summary = length_max(self.compact_summary_tokens) if self.on_context_limit == "compact" else 0
        return (length_max(self.system_tokens) + summary + self.message_max_tokens
                + max(length_max(self.output_tokens), length_max(self.subagent_result_tokens or 1)))

    @property
    def max_request_tokens(self) -> int:
        """The longest prompt + output a turn may send: the context limit, else the history's bound (every turn's
        message and output; a subagent's on top of its agent's context)."""
        if self.context_limit_tokens is not None:
            return self.context_limit_tokens
        per_turn = self.message_max_tokens + length_max(self.output_tokens)
        longest = length_max(self.system_tokens) + length_max(self.turns) * per_turn
        if self.has_subagents:
            child = length_max(self.subagent_turns) * (length_max(self.user_tokens) + max(
                length_max(self.output_tokens), length_max(self.subagent_result_tokens)))
            longest += child
        return longest

    @property
    def mean_requests_per_session(self) -> float:
        """Turns per session, subagents' included (a screen for memory estimates, not exact)."""
        turns = length_mean(self.turns)
        if self.has_subagents:
            turns += max(turns - 1, 0) * self.subagent_probability * length_mean(self.subagent_turns)
        return turns

    def popularity_weights(self) -> list[float]:
        """Probability of each group (rank order: group 0 is the most popular under Zipf)."""
        return rank_weights(self.groups, self.popularity, self.zipf_exponent)
