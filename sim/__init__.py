"""kvsim's mechanism: what happens inside a cluster of LLM serving workers, and how a run is composed.

The layout follows a request: `workloads` (what is sent) -> `cluster` (router in front, workers on devices) ->
`engines` (each worker's scheduler and prefix cache: vLLM v1, SGLang) -> `results` (records, summaries, reports);
`studies` compose many runs (sweep, plan, calibrate, validate, analytic screens); `servers` measure real ones.

The public API for notebooks and scripts is what this module exports (`sim.__all__`); everything else is internal
and may move.
"""

from sim.engines import ENGINES
from sim.replay import ReplayResult, replay
from sim.results.records import RequestRecord, RunResult, TtftSamples, WorkerCounters
from sim.results.summary import Summary, summarize
from sim.runner import run
from sim.scenario import Scenario, ScenarioError, load_scenario
from sim.studies import analytic
from sim.studies.plan import PlanSpec, PlanTarget, make_grid, plan, transient_requests
from sim.studies.reference import load_reference, measured
from sim.studies.sweep import run_sweep, sweep_points
from sim.workloads.shared_prefix import shared_prefix_stream
from sim.workloads.traces import read_mooncake

__all__ = [
    "ENGINES", "PlanSpec", "PlanTarget", "ReplayResult", "RequestRecord", "RunResult", "Scenario", "ScenarioError",
    "Summary", "TtftSamples", "WorkerCounters", "analytic", "load_reference", "load_scenario", "make_grid",
    "measured", "plan", "read_mooncake", "replay", "run", "run_sweep", "shared_prefix_stream", "summarize",
    "sweep_points", "transient_requests",
]
