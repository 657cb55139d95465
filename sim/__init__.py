"""kvsim's mechanism: what happens inside a cluster of LLM serving workers, and how a run is composed.

The layout follows a request: `workloads` (what is sent) -> `routing` (the router interface; the routers themselves
are the `policies` package) -> `cluster` (workers on devices) -> `engines` (each worker's scheduler and prefix cache:
vLLM v1, SGLang) priced by `timing` -> `results` (records, summaries, reports); `scenario` composes each package's
configuration section; `runner` and `replay` compose a run; `studies` compose many runs (sweep, plan, calibrate,
validate, analytic screens); `servers` measure real ones; `cli` is the command line. Each package imports only the
packages below it in the layering, top to bottom: cli, studies, servers, replay, runner, policies | cluster,
scenario, results, routing, timing, engines, workloads, config | csv_fields (pyproject.toml `[tool.importlinter]`,
checked by tests/test_layering.py).

The public API for notebooks and scripts is what this module exports (`sim.__all__`), plus the trace replay
`sim.replay.replay` (its module shares its name); everything else is internal and may move.
"""

# NOTE: resolved on first use (PEP 562), so that `import sim.replay` does not load scipy and matplotlib.
_EXPORTS = {
    "ENGINES": "sim.engines.registry", "ReplayResult": "sim.replay",
    "RequestRecord": "sim.results.records", "RunResult": "sim.results.records", "TtftSamples": "sim.results.records",
    "WorkerCounters": "sim.results.records", "Slo": "sim.results.records",
    "Summary": "sim.results.summary", "summarize": "sim.results.summary",
    "run": "sim.runner", "Scenario": "sim.scenario", "ScenarioError": "sim.scenario", "load_scenario": "sim.scenario",
    "analytic": "sim.studies.analytic", "aggregate_routers": "sim.studies.compare", "pareto_front": "sim.results.stats",
    "PlanSpec": "sim.studies.plan", "PlanTarget": "sim.studies.plan",
    "make_grid": "sim.studies.plan", "plan": "sim.studies.plan", "transient_requests": "sim.studies.plan",
    "load_reference": "sim.studies.reference", "measured": "sim.studies.reference",
    "run_sweep": "sim.studies.sweep", "sweep_points": "sim.studies.sweep",
    "parse_space": "sim.studies.search_space", "tune": "sim.studies.tune", "TuneResult": "sim.studies.tune",
    "shared_prefix_stream": "sim.workloads.shared_prefix", "read_mooncake": "sim.workloads.traces",
    "parse_arrival_curve": "sim.workloads.arrival_curve", "arrival_times_s": "sim.workloads.arrival_curve",
    "warp_trace": "sim.workloads.arrival_curve", "trace_mean_rps": "sim.workloads.arrival_curve",
}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'sim' has no attribute {name!r}")
    import importlib

    imported = importlib.import_module(module)
    value = imported if name == "analytic" else getattr(imported, name)  # analytic is a module, the rest names
    globals()[name] = value
    return value


__all__ = sorted(_EXPORTS)
