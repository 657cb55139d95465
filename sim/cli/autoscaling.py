"""`--autoscaler NAME:key=value,... --min-workers N --max-workers N --timeline-bin-s S` on `kvsim run` and
`kvsim replay`: an elastic fleet (`cluster.autoscaling`, docs/concepts/autoscaling.md), and what it writes
(timeline.csv, instances.csv, timeline.png)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import click

from sim.cli.app import UsageExit, console, fmt
from sim.cli.render import Table
from sim.results.report import csv_bytes, write_atomic
from sim.scenario import Scenario, ScenarioError

AUTOSCALER_HELP = ("Autoscale the fleet: NAME or NAME:key=value,... (hpa, planner, schedule: "
                   "docs/concepts/autoscalers.md), e.g. hpa:metric=in_flight,target=4. With it --max-workers is the "
                   "fleet's slots and --workers the workers ready at time 0 (default --min-workers). Writes "
                   "DIR/timeline.csv, DIR/instances.csv and DIR/timeline.png with --out. Default: the scenario's "
                   "cluster.autoscaling, if any.")


def autoscaling_options(command: Callable) -> Callable:
    """`--autoscaler`, `--min-workers`, `--max-workers`, `--timeline-bin-s`; apply them with `on_autoscaling`."""
    for option in reversed((
        click.option("--autoscaler", "autoscaler", default=None, metavar="NAME[:k=v,...]", help=AUTOSCALER_HELP),
        click.option("--min-workers", "min_workers", type=click.IntRange(min=1), default=None,
                     help="With an autoscaler: the fewest workers (ready + starting). Default 1 (or the scenario's)."),
        click.option("--max-workers", "max_workers", type=click.IntRange(min=1), default=None,
                     help="With an autoscaler: the most workers at once, draining ones included (the slots)."),
        click.option("--timeline-bin-s", "timeline_bin_s", type=click.FloatRange(min=0, min_open=True), default=None,
                     help="With an autoscaler: seconds per row of timeline.csv. Default: the autoscaler's interval."),
    )):
        command = option(command)
    return command


def autoscaled(scenario: Scenario, autoscaler: str | None) -> bool:
    """Whether the run will be autoscaled (by `--autoscaler` or the scenario's `cluster.autoscaling`)."""
    return autoscaler is not None or scenario.cluster.autoscaling is not None


def on_autoscaling(scenario: Scenario, autoscaler: str | None, *, min_workers: int | None, max_workers: int | None,
                   initial_workers: int | None, timeline_bin_s: float | None) -> Scenario:
    """`scenario` with the autoscaling options applied (unchanged without them), its autoscaler checked against the
    registry; a one-line error otherwise."""
    from policies.autoscalers import split_autoscaler_spec
    from sim.runner import build_autoscaler
    from sim.studies.worker_profile import with_worker_rps

    current = scenario.cluster.autoscaling
    given = {"--min-workers": min_workers, "--max-workers": max_workers, "--timeline-bin-s": timeline_bin_s}
    if autoscaler is None and current is None:
        extra = [name for name, value in given.items() if value is not None]
        if extra:
            raise UsageExit(f"{extra[0]}: only with an autoscaler; give --autoscaler NAME (or a scenario with "
                            "cluster.autoscaling)")
        return scenario
    data = current.model_dump() if current is not None else {}
    if autoscaler is not None:
        try:
            name, options = split_autoscaler_spec(autoscaler)
        except ValueError as err:
            raise click.BadParameter(str(err), param_hint="--autoscaler") from None
        data["autoscaler"] = {"name": name, "options": options}
    for key, value in (("min_workers", min_workers), ("max_workers", max_workers),
                       ("initial_workers", initial_workers), ("timeline_bin_s", timeline_bin_s)):
        if value is not None:
            data[key] = value
    if "max_workers" not in data:
        raise UsageExit("--autoscaler: give --max-workers N (the most workers the fleet may run)")
    try:
        # NOTE: the planner's worker_rps, when not given, is measured on one worker of the scenario (its workload and
        # SLO), as Dynamo's pre-deployment profiling measures an engine (sim.studies.worker_profile).
        fixed = scenario if current is None else scenario.with_overrides(**{"cluster.autoscaling": None})
        spec = data["autoscaler"]
        spec["options"] = with_worker_rps(spec["name"], dict(spec.get("options") or {}), fixed)
        scaled = scenario.with_overrides(**{"cluster.autoscaling": data, "cluster.workers": data["max_workers"]})
        build_autoscaler(scaled)
    except (ScenarioError, ValueError) as err:
        raise click.ClickException(str(err).removeprefix("Value error, ")) from None
    return scaled


def show_fleet(fleet, *, max_rows: int = 24) -> None:
    """The fleet's instances and, when short enough, its timeline, as tables."""
    from sim.results.timeline import instance_rows

    instances = Table(title="worker instances (autoscaled fleet)")
    rows = instance_rows(fleet.instances)
    for col in rows[0]:
        instances.add_column(col, key=col == "slot")
    for row in rows:
        instances.add_row(*(fmt(v, ".4g") if isinstance(v, float) else str(v) for v in row.values()))
    console.print(instances)
    timeline = fleet.rows()
    if len(timeline) > max_rows:
        console.print(f"timeline: {len(timeline)} rows of {fleet.timeline.bin_s:g} s (--out DIR writes "
                      "DIR/timeline.csv and DIR/timeline.png)", highlight=False)
        return
    table = Table(title=f"timeline (rows of {fleet.timeline.bin_s:g} s)")
    columns = ("start_s", "workers_ready", "workers_starting", "workers_draining", "arrivals_rps",
               "request_hit_rate", "cold_request_hit_rate", "ttft_p90_ms")
    for col in columns:
        table.add_column(col, key=col == "start_s")
    for row in timeline:
        table.add_row(*(fmt(row[c], ".4g") if isinstance(row[c], float) else str(row[c]) for c in columns))
    console.print(table)


def fleet_files(fleet, *, title: str) -> dict[str, bytes]:
    """timeline.csv, instances.csv and timeline.png of an autoscaled run's fleet."""
    from sim.results.figures import timeline_figure
    from sim.results.timeline import INSTANCE_COLUMNS, TIMELINE_COLUMNS, instance_rows

    rows = fleet.rows()
    return {
        "timeline.csv": csv_bytes(rows, list(TIMELINE_COLUMNS)),
        "instances.csv": csv_bytes(instance_rows(fleet.instances), list(INSTANCE_COLUMNS)),
        "timeline.png": timeline_figure(rows, instances=fleet.instances, end_s=fleet.end_s, title=title),
    }


def write_fleet_files(out: Path, fleet, *, title: str) -> list[str]:
    """Write `fleet_files` into `out`; their paths."""
    written = []
    for name, data in fleet_files(fleet, title=title).items():
        write_atomic(out / name, data)
        written.append(str(out / name))
    return written
