"""The `kvsim` command group and what its commands share: the consoles, option parsers, scenario loading and number
formatting."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import click
from rich.console import Console

from sim.studies.reference import Measurement, load_reference, measured
from sim.scenario import Scenario, ScenarioError, load_scenario

# NOTE: piped output (CI logs, files) gets a wide table instead of rich's 80-column default.
console = Console() if sys.stdout.isatty() else Console(width=200)
err_console = Console(stderr=True)


def router_names() -> list[str]:
    from policies import ROUTERS  # the CLI is a composition root: it may import policies

    return sorted(ROUTERS)


def int_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        items = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of whole numbers, e.g. 2,7,12") from None
    if not items or any(v < 1 for v in items):
        raise click.BadParameter(f"{value!r}: every value must be a whole number >= 1")
    return items


def _registered_names(value: str, what: str, allowed: list[str]) -> list[str]:
    """The comma-separated names of `value`, each one of `allowed`, or a one-line error naming the unknown ones."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        raise click.BadParameter(f"unknown {what} {', '.join(unknown) or repr(value)}; allowed: {', '.join(allowed)}")
    return names


def router_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    """Comma-separated router specs `NAME` or `NAME:key=value,...` (`sim.routing.spec`), each name registered and
    each option one its router has, as their labels."""
    if value is None:
        return None
    from policies import ROUTERS
    from sim.routing.spec import split_router_list, split_router_spec

    try:
        labels = split_router_list(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    for label in labels:
        name, options = split_router_spec(label)
        if name not in ROUTERS:
            raise click.BadParameter(f"unknown router {name}; allowed: {', '.join(router_names())}")
        try:
            ROUTERS[name].parse_options(options)
        except ValueError as err:
            raise click.BadParameter(f"{label}: {err}") from None
    return labels


def engine_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    from sim.engines import ENGINES

    return None if value is None else _registered_names(value, "engine", sorted(ENGINES))


def one_engine(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    names = engine_list(ctx, param, value)
    if names is not None and len(names) != 1:
        raise click.BadParameter("give one engine")
    return names[0] if names else None


ENGINE_HELP = "Engine the workers run: vllm (v1) or sglang (see `kvsim engines`). Default: the scenario's."


def on_engine(scenario: Scenario, engine: str | None) -> Scenario:
    """`scenario` switched to `engine` (unchanged when None), or a one-line error."""
    if engine is None:
        return scenario
    try:
        return scenario.with_engine(engine)
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None


def load_or_exit(path: str | None) -> tuple[Scenario, Path]:
    try:
        return load_scenario(path)
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None


def reference_measurements(scenario: Scenario, scenario_path: Path) -> list[Measurement]:
    """The scenario's measured reference (empty without one), or a one-line error."""
    if scenario.reference is None:
        return []
    ref_path = scenario_path.parent / scenario.reference
    try:
        return load_reference(ref_path)
    except (OSError, ValueError) as err:
        raise click.ClickException(f"reference: cannot read {ref_path}: {err}") from None


def reference_for(scenario: Scenario, scenario_path: Path) -> dict[tuple[int, int, int], float]:
    return measured(reference_measurements(scenario, scenario_path), "request_hit_rate")


def fmt(value: object, spec: str = ".3f") -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else format(value, spec)
    return str(value)


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="kvsim")
def main() -> None:
    """kvsim: predict prefix-cache hit rate, TTFT and throughput of LLM serving workers under a router.

    A worker is a serving engine on a device: vLLM v1 (block prefix cache, step scheduler) or SGLang
    (RadixAttention token tree, prefill/decode batches); a scenario file (YAML) describes the model, engine,
    workload, cluster and router. Without --scenario the built-in `service-baseline` scenario (the measured
    reference experiment, on vLLM) is used.
    """
