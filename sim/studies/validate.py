"""Comparing measured runs with kvsim's prediction of the same runs (`kvsim validate`).

For each run CSV the simulator gets the run's setup from the sidecar (engine, workers, block size and count or
SGLang's KV slots and server arguments, scheduler limits, lengths, concurrency) on top of a base scenario (time
model, devices), and the run's own requests: the same prefixes in the same order, each sent to the worker it went to
(`routing="recorded"`, isolating the engine from the router's randomness) or routed afresh by the run's router
(`routing="simulated"`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from sim.config import key_value, key_values
from sim.results.records import RunResult
from sim.results.stats import percentile
from sim.results.summary import RequestCounts
from sim.servers.run_csv import Run
from sim.studies.repeats import RepeatComparison, compare_repeats, repeat_groups
from sim.runner import run as simulate
from sim.scenario import Scenario, ScenarioError
from sim.workloads.request import is_full_hit, shareable_tokens
from sim.workloads.shared_prefix import RequestStream, SharedPrefixRequests, with_token_identity

METRICS = ("request_hit_rate", "full_hit_rate", "token_hit_rate", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms",
           "ttft_hit_p50_ms", "ttft_miss_p50_ms", "tpot_p50_ms", "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms",
           "throughput_rps")
RATE_METRICS = {"request_hit_rate", "full_hit_rate", "token_hit_rate"}


@dataclass(frozen=True, slots=True)
class Comparison:
    run: str
    metric: str
    measured: float
    predicted: float
    in_repeats: bool = False
    """The run is one of a group of repeats (`compare_runs`): the group's comparison is the one to check."""

    @property
    def error(self) -> float:
        """predicted - measured, in the metric's unit (points of a rate, ms, requests/s)."""
        return self.predicted - self.measured

    @property
    def relative_error(self) -> float:
        return self.error / self.measured if self.measured else float("nan")


def scenario_for_run(base: Scenario, run: Run, *, routing: str = "recorded") -> Scenario:
    """`base` with the run's setup; the router replays the run's assignment unless `routing="simulated"`.

    The run's engine decides the scenario's: an SGLang run switches `base` to SGLang (`Scenario.with_engine`: the
    options both engines have carry over, then the scenario's `engine_options.sglang`) and takes the sidecar's
    SGLang settings; any other run is simulated on vLLM with the sidecar's block count and limits.
    """
    s = run.setup
    kind = "sglang" if s.engine.name == "sglang" else "vllm"
    try:
        base = base.with_engine(kind)
    except ScenarioError as err:
        raise ScenarioError(f"{run.csv_path}: the base scenario cannot run on {kind}: {err}") from None
    overrides: dict[str, object] = {
        "cluster.workers": s.workers,
        "engine.block_size": s.block_size,
        "workload.prefixes": s.prefixes,
        "workload.prefix_tokens": s.prefix_tokens,
        "workload.tail_tokens": s.prompt_tokens - s.prefix_tokens,
        "workload.output_tokens": s.output_tokens,
        "workload.concurrency": s.concurrency,
        "workload.warmup_per_prefix": s.warmup_per_prefix,
        "workload.min_requests": s.requests,
        "workload.requests_per_prefix": 0,
        "seed": s.seed,
        "reference": None,
    }
    overrides.update(base.engine.overrides_for_run(s))
    if routing == "recorded":
        router = {"router.name": "recorded", "router.options": {"workers": {r.request_id: r.worker for r in run.rows}}}
    elif routing == "simulated":
        router = {"router.name": s.router, "router.options": getattr(s, "router_options", None) or {}}
    else:
        raise ValueError(f"routing must be 'recorded' or 'simulated', got {routing!r}")
    try:
        # Two steps, so that an error about the setup quotes the setup, not every request's recorded worker.
        scenario = base.with_overrides(**overrides).with_overrides(**router)
    except ScenarioError as err:
        raise ScenarioError(f"{run.csv_path}: the run's setup does not make a valid scenario: {err}") from None
    longest = max(run.rows, key=lambda r: r.prompt_tokens, default=None)
    if longest is not None and longest.prompt_tokens + s.output_tokens > scenario.max_request_tokens:
        raise ScenarioError(f"{run.csv_path}: request {longest.request_id}: prompt_tokens {longest.prompt_tokens} + "
                            f"{s.output_tokens} output tokens exceeds the {scenario.max_request_tokens} tokens a "
                            f"worker of the scenario accepts (engine.max_model_len, KV capacity)")
    return scenario


def stream_for_run(run: Run, *, block_size: int) -> RequestStream:
    """The run's requests in the order they were sent (warm-ups first), with its prompt lengths.

    For an SGLang run whose sidecar says how its token ids were drawn (`token_ids`: a `kvsim measure` run), the
    prompts' tokens are those ids (`with_token_identity`): SGLang matches token by token, so a tail that starts
    with the id a cached tail of its prefix starts with hits 513 tokens of 612, not 512.
    """
    maker = SharedPrefixRequests(block_size=block_size)
    rows = sorted(run.rows, key=lambda r: (not r.warmup, r.start_s, r.request_id))
    made = [maker.make(r.request_id, r.prefix_id, prefix_tokens=run.setup.prefix_tokens, prompt_tokens=r.prompt_tokens,
                       output_tokens=run.setup.output_tokens, warmup=r.warmup) for r in rows if not r.error]
    ids = run.setup.token_ids
    if run.setup.engine.name == "sglang" and ids is not None:
        made = with_token_identity(made, seed=run.setup.seed, min_token_id=ids.min, max_token_id=ids.max)
    return RequestStream(tuple(m for m in made if m.warmup), tuple(m for m in made if not m.warmup))


def _figures(*, hit: list[bool], full: list[bool], cached: list[int], prompt: list[int], ttft_ms: list[float],
             tpot_ms: list[float | None], e2e_ms: list[float], duration_s: float) -> dict[str, float]:
    """The compared figures from per-request values (measured or simulated alike): the rates from their counts
    (`RequestCounts`), the percentiles from the values. E2E is always the client's (send to last token); TPOT is the
    client's too, but with the server's clock (`ttft_source` "server") where the run recorded vLLM's generation time
    (`RunRow.tpot_ms`)."""
    counts = RequestCounts(requests=len(hit), hit_requests=sum(hit), full_hit_requests=sum(full),
                           prompt_tokens=sum(prompt), cached_tokens=sum(cached), span_s=duration_s)
    ttft = np.array(ttft_ms)
    tpot = [v for v in tpot_ms if v is not None]
    hits = np.array(hit, dtype=bool)
    return {
        "request_hit_rate": counts.request_hit_rate,
        "full_hit_rate": counts.full_hit_rate,
        "token_hit_rate": counts.prefix_reuse,
        "ttft_p50_ms": percentile(ttft, 50), "ttft_p90_ms": percentile(ttft, 90), "ttft_p99_ms": percentile(ttft, 99),
        "ttft_hit_p50_ms": percentile(ttft[hits], 50), "ttft_miss_p50_ms": percentile(ttft[~hits], 50),
        "tpot_p50_ms": percentile(tpot, 50), "e2e_p50_ms": percentile(e2e_ms, 50),
        "e2e_p90_ms": percentile(e2e_ms, 90), "e2e_p99_ms": percentile(e2e_ms, 99),
        "throughput_rps": counts.throughput_rps,
    }


def measured_figures(run: Run, *, ttft_source: str = "client") -> dict[str, float]:
    rows = run.measured
    if not rows:
        raise ValueError(f"{run.csv_path}: no completed measured requests")
    s = run.setup
    return _figures(
        hit=[r.is_hit for r in rows],
        full=[is_full_hit(r.cached_tokens, shareable_tokens(prefix_tokens=s.prefix_tokens, prompt_tokens=r.prompt_tokens,
                                                            block_size=s.block_size)) for r in rows],
        cached=[r.cached_tokens for r in rows], prompt=[r.prompt_tokens for r in rows],
        ttft_ms=[r.ttft(ttft_source) for r in rows],
        tpot_ms=[r.tpot_ms(s.output_tokens, ttft_source) for r in rows], e2e_ms=[r.e2e_ms for r in rows],
        duration_s=max(r.end_s for r in rows) - min(r.start_s for r in rows),
    )


def simulate_run(base: Scenario, run: Run, *, routing: str = "recorded") -> RunResult:
    scenario = scenario_for_run(base, run, routing=routing)
    return simulate(scenario, stream_for_run(run, block_size=scenario.engine.block_size))


def predicted_figures(base: Scenario, run: Run, *, routing: str = "recorded",
                      ttft_source: str = "client") -> dict[str, float]:
    return predicted_samples(base, run, routing=routing, ttft_source=ttft_source)[0]


def predicted_samples(base: Scenario, run: Run, *, routing: str = "recorded",
                      ttft_source: str = "client") -> tuple[dict[str, float], dict[str, np.ndarray]]:
    """The simulated run's figures, and its per-request TTFT and E2E (ms) for intervals of their percentiles."""
    result = simulate_run(base, run, routing=routing)
    records = result.measured
    ttft_ms = [(r.ttft_s if ttft_source == "client" else r.engine_ttft_s) * 1000 for r in records]
    e2e_ms = [r.e2e_s * 1000 for r in records]
    figures = _figures(
        hit=[r.is_hit for r in records], full=[r.is_full_hit for r in records],
        cached=[r.cached_tokens for r in records], prompt=[r.prompt_tokens for r in records],
        ttft_ms=ttft_ms, tpot_ms=[None if r.tpot_s is None else r.tpot_s * 1000 for r in records], e2e_ms=e2e_ms,
        duration_s=max(r.finished_s for r in records) - min(r.sent_s for r in records),
    )
    return figures, {"ttft": np.array(ttft_ms), "e2e": np.array(e2e_ms)}


def _check_source(ttft_source: str) -> None:
    if ttft_source not in ("client", "server"):
        raise ValueError(f"ttft_source must be 'client' or 'server', got {ttft_source!r}")


def _comparisons(name: str, measured: dict[str, float], predicted: dict[str, float], *,
                 in_repeats: bool = False) -> list[Comparison]:
    return [Comparison(name, m, measured[m], predicted[m], in_repeats) for m in METRICS
            if not (math.isnan(measured[m]) and math.isnan(predicted[m]))]


def compare(base: Scenario, run: Run, *, routing: str = "recorded", ttft_source: str = "client") -> list[Comparison]:
    """Measured vs predicted figures of one run. `ttft_source`: "client" (as timed by the client) or "server"
    (vLLM's queue time + time to first token, compared with the simulated engine queue + prefill)."""
    _check_source(ttft_source)
    measured = measured_figures(run, ttft_source=ttft_source)
    predicted = predicted_figures(base, run, routing=routing, ttft_source=ttft_source)
    return _comparisons(run.name, measured, predicted)


def compare_runs(base: Scenario, runs: list[Run], *, routing: str = "recorded", ttft_source: str = "client",
                 ) -> tuple[list[Comparison], list[RepeatComparison]]:
    """Every run compared (each simulated once), and every group of repeats (runs of one setup) compared as a group:
    the measured figure's range over the repeats against the predicted one (`sim.studies.repeats`)."""
    _check_source(ttft_source)
    groups = repeat_groups(runs)
    grouped_files = {r.csv_path for g in groups for r in g}
    per_run: list[Comparison] = []
    measured: dict[str, dict[str, float]] = {}
    predicted: dict[str, tuple[dict[str, float], dict[str, np.ndarray]]] = {}
    for run in runs:  # keyed by file: repeats in different directories may share a name
        key = str(run.csv_path)
        measured[key] = measured_figures(run, ttft_source=ttft_source)
        predicted[key] = predicted_samples(base, run, routing=routing, ttft_source=ttft_source)
        per_run += _comparisons(run.name, measured[key], predicted[key][0], in_repeats=run.csv_path in grouped_files)
    grouped = [c for group in groups for c in compare_repeats(group, measured, predicted, metrics=METRICS)]
    return per_run, grouped


@dataclass(frozen=True, slots=True)
class Tolerance:
    metric: str
    limit: float
    relative: bool

    @classmethod
    def parse(cls, text: str) -> Tolerance:
        """'request_hit_rate=0.03' (absolute, in the metric's unit) or 'ttft_p50_ms=25%' (relative)."""
        return cls._of(*key_value(text, cls.FORM))

    @classmethod
    def parse_list(cls, text: str) -> list[Tolerance]:
        """Comma-separated tolerances, 'request_hit_rate=0.03,ttft_p50_ms=25%', each metric once."""
        return [cls._of(metric, value) for metric, value in key_values(text, cls.FORM).items()]

    FORM = f"METRIC=LIMIT with METRIC one of {', '.join(METRICS)}"

    @classmethod
    def _of(cls, metric: str, value: str) -> Tolerance:
        if metric not in METRICS:
            raise ValueError(f"{metric}={value}: expected {cls.FORM}")
        relative = value.endswith("%")
        try:
            limit = float(value.rstrip("%"))
        except ValueError:
            raise ValueError(f"{metric}={value}: the limit must be a number, optionally with %") from None
        if not limit >= 0:
            raise ValueError(f"{metric}={value}: the limit must be a number >= 0")
        return cls(metric, limit / 100 if relative else limit, relative)

    def violated_by(self, c: Comparison | RepeatComparison) -> bool:
        if c.metric != self.metric:
            return False
        error = c.relative_error if self.relative else c.error
        return math.isnan(error) or abs(error) > self.limit
