"""A split replay (a router that ignores the cluster, workers split by device) gives the same figures on a Dask
cluster as in forked processes: its parts are tasks, merged in the order of the worker groups."""

from __future__ import annotations

import functools

import pytest

from sim.replay import replay
from sim.scenario import builtin_scenario_path, load_scenario
from sim.studies.executor import DaskExecutor
from sim.workloads.traces import read_mooncake
from tests.support.paths import TRACES

TRACE = TRACES / "conversation_head400.jsonl"


@pytest.mark.slow
def test_a_split_replay_on_dask_matches_the_forked_split():
    base, _ = load_scenario(builtin_scenario_path("trace-replay"))
    scenario = base.with_overrides(**{"cluster.workers": 4, "router.name": "round-robin",
                                      **base.engine.capacity_overrides(tokens=200_000, blocks=None, kv_bytes=None)})
    open_trace = functools.partial(read_mooncake, TRACE, block_size=64, trace_block_tokens=512)
    forked = replay(scenario, open_trace, jobs=2)
    with DaskExecutor(jobs=2) as executor:
        on_dask = replay(scenario, open_trace, executor=executor)
    assert forked.jobs == on_dask.jobs == 2
    assert repr(forked.row()) == repr(on_dask.row())  # repr: NaN columns compare equal as text
    assert forked.workers == on_dask.workers

