"""The `kvsim` command group and what its commands share: the consoles, option parsers, scenario loading, number
formatting, the executor options, progress bars and the output directory check."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click
from rich.console import Console

from sim.cli.render import console  # noqa: F401 - what every command prints through (prose, tables, rows)
from sim.cli.root import main  # noqa: F401 - the group every command module registers on
from sim.config import GIB, key_values, suggestion
from sim.scenario import Scenario, ScenarioError, SloSpec, load_scenario

if TYPE_CHECKING:  # imported where used: a command that reads no reference, or draws no bar, loads neither
    from sim.studies.reference import Measurement

err_console = Console(stderr=True)


def router_names() -> list[str]:
    """The aggregated routers (what `compare` runs by default and real servers take)."""
    from policies import ROUTERS  # the CLI is a composition root: it may import policies

    return sorted(ROUTERS)


def all_router_names() -> list[str]:
    """Every router a --router option accepts: the aggregated ones, then the disaggregated ones."""
    from policies import PD_ROUTERS

    return router_names() + sorted(PD_ROUTERS)


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
    """The comma-separated names of `value`, each one of `allowed`, or a one-line error naming the unknown ones (one:
    with the nearest allowed name)."""
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in allowed]
    if unknown or not names:
        hint = suggestion(unknown[0], allowed) if len(unknown) == 1 else f"allowed: {', '.join(allowed)}"
        raise click.BadParameter(f"unknown {what} {', '.join(unknown) or repr(value)}; {hint}")
    return names


NEEDS_A_RECORDING = ("recorded",)
"""Routers that replay a recorded run's choices: they cannot route a workload of their own (only `kvsim validate
--routing recorded` uses them, through the scenario it builds)."""


def finite_float(ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    """A float option that must be a finite number (click's float type takes nan and inf)."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value}: give a finite number")
    return value


def router_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    """Comma-separated router specs `NAME` or `NAME:key=value,...` (`sim.routing.spec`), each name registered and
    each option one its router has, as their labels."""
    if value is None:
        return None
    from policies import PD_ROUTERS, ROUTERS
    from sim.routing.spec import split_router_list, split_router_spec

    try:
        labels = split_router_list(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    for label in labels:
        name, options = split_router_spec(label)
        if name not in ROUTERS and name not in PD_ROUTERS:
            raise click.BadParameter(f"unknown router {name}; {suggestion(name, all_router_names())}")
        if name in NEEDS_A_RECORDING:
            raise click.BadParameter(f"{name} replays a recorded run's choices (kvsim validate); it cannot route a "
                                     f"workload of its own; allowed: "
                                     f"{', '.join(n for n in router_names() if n not in NEEDS_A_RECORDING)}")
        try:
            (ROUTERS.get(name) or PD_ROUTERS[name]).parse_options(options)
        except ValueError as err:
            raise click.BadParameter(f"{label}: {err}") from None
    return labels


def engine_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[str] | None:
    from sim.engines.registry import ENGINES

    return None if value is None else _registered_names(value, "engine", sorted(ENGINES))


def one_engine(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    names = engine_list(ctx, param, value)
    if names is not None and len(names) != 1:
        raise click.BadParameter("give one engine")
    return names[0] if names else None


SLO_HELP = ("Latency SLO for goodput, KEY=MS,...: any of ttft_ms, tpot_ms, e2e_ms (each > 0), e.g. "
            "ttft_ms=200,tpot_ms=50. Replaces the scenario's slo block. Default: the scenario's; with none set every "
            "request meets it (goodput = throughput) and the slo_*_ms columns are NaN.")


def slo_option(ctx: click.Context, param: click.Parameter, value: str | None) -> SloSpec | None:
    """`ttft_ms=200,tpot_ms=50` as an SLO, validated by the scenario's own model; a one-line error names the key and
    the allowed keys or values."""
    if value is None:
        return None
    from pydantic import ValidationError

    allowed = ", ".join(SloSpec.model_fields)
    try:
        items = key_values(value, f"KEY=MS with KEY one of {allowed}")
    except ValueError as err:
        raise click.BadParameter(str(err)) from None
    for key, text in items.items():
        if key not in SloSpec.model_fields:
            raise click.BadParameter(f"unknown key {key!r}; {suggestion(key, SloSpec.model_fields)}")
        if not text:
            raise click.BadParameter(f"{key}: give a value in ms, as {key}=200")
    if not items:
        raise click.BadParameter(f"{value!r}: give KEY=MS,... with keys {allowed}")
    try:
        return SloSpec.model_validate(items)
    except ValidationError as err:
        first = err.errors()[0]
        key = str(first["loc"][0]) if first["loc"] else "slo"
        raise click.BadParameter(f"{key}={items.get(key, '')}: {first['msg']}; each of {allowed} is a finite "
                                 f"number of ms > 0") from None


ARRIVAL_CURVE_FORM = ("KIND:key=value,...: constant:rate_rps=R, piecewise:points=T:R/T:R/...[,interpolation=step], "
                      "diurnal:mean_rps=M,amplitude=A[,period_s=P,peak_s=S] or bursts:base_rps=B,bursts=AT:DURATION:"
                      "EXTRA/...; a bare number is a constant rate (docs/concepts/load-curves.md)")


def arrival_curve_option(ctx: click.Context, param: click.Parameter, value: str | None):
    """An arrival curve in the CLI form (`sim.workloads.arrival_curve.parse_arrival_curve`), as its spec; a one-line
    error names the field and what is allowed."""
    if value is None:
        return None
    from sim.workloads.arrival_curve import parse_arrival_curve

    try:
        return parse_arrival_curve(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def on_arrival_curve(scenario: Scenario, curve, duration_s: float | None, *, concurrency: int | None) -> Scenario:
    """`scenario` whose workload arrives at `curve` (its spec; None: the scenario's arrivals) over `duration_s`
    (None: the scenario's): a shared-prefix workload's requests, a sessions workload's session starts (`sessions`
    then comes from the span). One-line errors for a closed loop asked at the same time, or a span without a curve."""
    if curve is None and duration_s is None:
        return scenario
    if curve is not None and concurrency is not None:
        raise UsageExit("--concurrency is a closed loop and --arrival-curve an open loop: give one of them")
    w = scenario.workload
    if curve is None and w.arrival_curve is None:
        raise UsageExit("--duration-s is the span of an arrival curve: give --arrival-curve (or a scenario's "
                        "workload.arrival_curve)")
    overrides: dict[str, object] = {}
    if curve is not None:
        overrides["workload.arrival_curve"] = curve.model_dump()
        overrides.update({"workload.session_rate_per_s": None, "workload.concurrent_sessions": None}
                         if scenario.has_sessions else {"workload.arrival_rate_rps": None})
    if duration_s is not None:
        overrides["workload.duration_s"] = duration_s
        if scenario.has_sessions:
            overrides["workload.sessions"] = None
    try:
        return scenario.with_overrides(**overrides)
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None


def with_slo(scenario: Scenario, slo: SloSpec | None) -> Scenario:
    """`scenario` with its slo block replaced by `slo` (unchanged when None)."""
    return scenario if slo is None else scenario.model_copy(update={"slo": slo})


ENGINE_HELP = "Engine the workers run: vllm (v1) or sglang (see `kvsim engines`). Default: the scenario's."


def on_engine(scenario: Scenario, engine: str | None) -> Scenario:
    """`scenario` switched to `engine` (unchanged when None), or a one-line error."""
    if engine is None:
        return scenario
    try:
        return scenario.with_engine(engine)
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None


def hardware_options(command: Callable) -> Callable:
    """`--model NAME|CONFIG.json`, `--gpu NAME[xTP]` and `--kv-gib GIB`: the model served, the hardware every worker
    runs on (timed by the roofline model; see `kvsim hardware`) and the GPU KV cache per worker (parameters `model`,
    `gpu`, `kv_gib`). Load the scenario with `load_or_exit(path, gpu)` and apply them with `on_hardware`."""
    command = click.option(
        "--kv-gib", "kv_gib", type=click.FloatRange(min=0, min_open=True), callback=finite_float, default=None,
        help="GPU KV cache per worker in GiB (vLLM's --kv-cache-memory-bytes / 2^30; a what-if: not held against "
             "the device's memory). Default: the scenario's; with --model or --gpu, what vLLM would allocate on the "
             "devices: 0.92 (gpu_memory_utilization) x memory - weights / TP - activations - 2 GiB (non-torch, CUDA "
             "graphs), x TP (docs/time/models.md).")(command)
    command = click.option(
        "--gpu", "gpu", callback=_gpu_option, default=None,
        help="Put every worker on its own device of this hardware x tensor-parallel degree (e.g. H100x1, a100-80gbx4; "
             "`kvsim hardware` lists them), timed by the roofline model (the scenario's efficiency factors if it "
             "has a roofline one, with a warning when they were fitted on other hardware; else the defaults). "
             "Default: the scenario's devices.")(command)
    return click.option(
        "--model", "model", default=None,
        help="Serve this model: a shipped one (Qwen3-0.6B, Llama-3.1-8B, Llama-3.1-70B, Qwen2.5-72B) or a Hugging "
             "Face config.json; sets the KV bytes per token. Needs a roofline time model (or --gpu). "
             "Default: the scenario's.")(command)


CPU_KV_DETAIL = ("vLLM's --kv-offloading-size (its OffloadingConnector, rules of vLLM 0.33.0): prompts' full blocks "
                 "are copied there as they are computed and loaded back over the device's host link "
                 "(time_model.host_link) when the GPU no longer holds them; with --engine sglang, SGLang 0.5.23's "
                 "HiCache (--hicache-size; write policy engine.hicache_write_policy, default write_through); 0 = "
                 "none. Default: the scenario's (engine.cpu_kv_bytes).")
CPU_KV_HELP = "Host (CPU) KV tier per worker in GiB: " + CPU_KV_DETAIL


def gib_list(ctx: click.Context, param: click.Parameter, value: str | None) -> list[float] | None:
    """A comma-separated list of GiB amounts >= 0 (`--cpu-kv-gib 0,4,16`), or a one-line error."""
    if value is None:
        return None
    try:
        items = [float(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"{value!r} is not a comma-separated list of GiB, e.g. 0,4,16") from None
    if not items or any(not math.isfinite(v) or v < 0 for v in items):
        raise click.BadParameter(f"{value!r}: every value must be a number of GiB >= 0")
    return items


def on_cpu_kv(scenario: Scenario, gib: float | None) -> Scenario:
    """`scenario` with `--cpu-kv-gib` applied (unchanged without it), or a one-line error."""
    from sim.scenario import with_cpu_kv_gib

    if gib is None:
        return scenario
    try:
        return with_cpu_kv_gib(scenario, gib)
    except (ScenarioError, ValueError) as err:
        raise click.ClickException(str(err).removeprefix("Value error, ")) from None


# --- prices (--gpu-price-usd) -----------------------------------------------------------------------------------
GPU_PRICE_HELP = ("US dollars per GPU-hour for the cost columns: USD for every device, or NAME=USD,... per hardware "
                  "profile (e.g. l4=0.7,h100=4.5); overrides the profiles' list prices (`kvsim hardware`) and the "
                  "scenario's device.price_per_hour_usd. Default: those.")


def parse_gpu_price(text: str) -> float | dict[str, float]:
    """`--gpu-price-usd`: '2.5' (every device) or 'l4=0.8,h100=12' (per hardware profile); a ValueError naming the
    bad part."""
    def usd(value: str, what: str = "") -> float:
        try:
            price = float(value)
        except ValueError:
            raise ValueError(f"{what}{value!r} is not a number of US dollars per GPU-hour") from None
        if not (math.isfinite(price) and price > 0):
            raise ValueError(f"{what}{value!r} must be US dollars per GPU-hour > 0")
        return price

    if "=" not in text:
        return usd(text.strip())
    prices: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        name, eq, value = part.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"{part!r}: give USD, or NAME=USD,... with NAME a hardware profile (`kvsim hardware`)")
        prices[name.strip()] = usd(value.strip(), f"{name.strip()}: ")
    return prices


def _gpu_price_option(ctx: click.Context, param: click.Parameter, value: str | None):
    if value is None:
        return None
    try:
        return parse_gpu_price(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def gpu_price_option(command: Callable) -> Callable:
    """`--gpu-price-usd USD | NAME=USD,...` (parameter `gpu_price_usd`); apply it with `on_gpu_price` after
    `on_hardware` (--gpu replaces the devices it prices)."""
    return click.option("--gpu-price-usd", "gpu_price_usd", callback=_gpu_price_option, default=None,
                        metavar="USD|NAME=USD,...", help=GPU_PRICE_HELP)(command)


def on_gpu_price(scenario: Scenario, price: float | dict[str, float] | None) -> Scenario:
    """`scenario` with `--gpu-price-usd` applied (unchanged without it), or a one-line error."""
    from sim.scenario import with_gpu_price

    if price is None:
        return scenario
    try:
        return with_gpu_price(scenario, price)
    except (ScenarioError, ValueError) as err:
        raise click.ClickException(str(err).removeprefix("Value error, ")) from None


# --- the cluster-shared KV store (--shared-kv-gib) ----------------------------------------------------------------
SHARED_KV_HELP = ("Cluster-shared KV store in GiB, one capacity for the whole cluster (Mooncake Store, an LMCache "
                  "server, Dynamo G3; vLLM engine only): every worker writes its prompts' full blocks through to it "
                  "and loads what any worker stored over its device's network link (engine.shared_link); with "
                  "--cpu-kv-gib the tiers chain as vLLM's MultiConnector [host, shared] (docs/concepts/kv-tiers.md); "
                  "0 = none. Default: the scenario's (engine.shared_kv_bytes).")


def shared_kv_option(command: Callable) -> Callable:
    """`--shared-kv-gib GIB` (parameter `shared_kv_gib`); apply it with `on_shared_kv`."""
    return click.option("--shared-kv-gib", "shared_kv_gib", type=click.FloatRange(min=0), callback=finite_float,
                        default=None, help=SHARED_KV_HELP)(command)


def on_shared_kv(scenario: Scenario, gib: float | None) -> Scenario:
    """`scenario` with `--shared-kv-gib` applied (unchanged without it), or a one-line error."""
    from sim.scenario import with_shared_kv_gib

    if gib is None:
        return scenario
    try:
        return with_shared_kv_gib(scenario, gib)
    except (ScenarioError, ValueError) as err:
        raise click.ClickException(str(err).removeprefix("Value error, ")) from None


# --- the host tier's connector (--cpu-kv-connector) ----------------------------------------------------------------
CPU_KV_CONNECTOR_HELP = ("The connector running the host tier (--cpu-kv-gib; vLLM engine only): offloading (vLLM's "
                         "OffloadingConnector, the default) or lmcache (LMCache 0.5.6 in-process: 256-token chunks, "
                         "synchronous loads and stores; docs/concepts/kv-tiers.md). Default: the scenario's "
                         "(engine.cpu_kv_connector).")


def cpu_kv_connector_option(command: Callable) -> Callable:
    """`--cpu-kv-connector NAME` (parameter `cpu_kv_connector`); apply it with `on_cpu_kv_connector`."""
    return click.option("--cpu-kv-connector", "cpu_kv_connector", type=click.Choice(["offloading", "lmcache"]),
                        default=None, help=CPU_KV_CONNECTOR_HELP)(command)


def on_cpu_kv_connector(scenario: Scenario, name: str | None) -> Scenario:
    """`scenario` with `--cpu-kv-connector` applied (unchanged without it), or a one-line error."""
    if name is None:
        return scenario
    if "cpu_kv_connector" not in type(scenario.engine).model_fields:
        raise click.ClickException(f"--cpu-kv-connector: engine.kind {scenario.engine.kind!r} has no host tier "
                                   "connector to choose (only vllm)")
    try:
        return scenario.with_overrides(**{"engine.cpu_kv_connector": name})
    except (ScenarioError, ValueError) as err:
        raise click.ClickException(str(err).removeprefix("Value error, ")) from None


# --- G2 peer fetch (--peer-fetch) -------------------------------------------------------------------------------------
PEER_FETCH_HELP = ("Dynamo KVBM's G2 peer fetch (vLLM engine, with a host tier: --cpu-kv-gib > 0): a lookup whose "
                   "host-tier hit ends pulls the rest from the first other worker whose host tier holds it, over the "
                   "device's network link (engine.shared_link), into its own host tier, then loads it over PCIe "
                   "(docs/concepts/kv-tiers.md). Default: the scenario's (engine.peer_fetch).")


def peer_fetch_option(command: Callable) -> Callable:
    """`--peer-fetch` (parameter `peer_fetch`); apply it with `on_peer_fetch`."""
    return click.option("--peer-fetch", "peer_fetch", is_flag=True, default=False, help=PEER_FETCH_HELP)(command)


def on_peer_fetch(scenario: Scenario, peer_fetch: bool) -> Scenario:
    """`scenario` with `--peer-fetch` applied (unchanged without it), or a one-line error."""
    if not peer_fetch:
        return scenario
    if "peer_fetch" not in type(scenario.engine).model_fields:
        raise click.ClickException(f"--peer-fetch: engine.kind {scenario.engine.kind!r} has no G2 peer fetch in "
                                   "kvsim (only vllm)")
    if not scenario.cpu_kv_bytes:
        raise click.ClickException("--peer-fetch: needs a host tier to fetch into; give --cpu-kv-gib > 0")
    try:
        return scenario.with_overrides(**{"engine.peer_fetch": True})
    except (ScenarioError, ValueError) as err:
        raise click.ClickException(str(err).removeprefix("Value error, ")) from None


def shared_kv_columns(scenario: Scenario) -> dict[str, float]:
    """The summary row's `shared_kv_gib` column when `scenario` has a shared store (else none: the row keeps its
    columns)."""
    from sim.scenario import shared_kv_gib

    return {"shared_kv_gib": shared_kv_gib(scenario)} if scenario.shared_kv_bytes else {}


def _gpu_option(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, int] | None:
    from sim.timing.hardware import parse_gpu

    if value is None:
        return None
    try:
        return parse_gpu(value)
    except ValueError as err:
        raise click.BadParameter(str(err)) from None


def on_hardware(scenario: Scenario, model: str | None, gpu: tuple[str, int] | None,
                kv_gib: float | None = None) -> Scenario:
    """`scenario` with `--model` / `--gpu` / `--kv-gib` applied (unchanged without any), or a one-line error. With
    --model or --gpu and no --kv-gib the KV per worker is vLLM's rule's (`Scenario.with_hardware`); fitted
    efficiencies applied to other hardware are a one-line warning on stderr."""
    from sim.scenario import with_kv_gib

    kv_bytes = None if kv_gib is None else int(round(kv_gib * GIB))
    try:
        if model is None and gpu is None:
            return scenario if kv_gib is None else with_kv_gib(scenario, kv_gib)
        hardware, tp = gpu if gpu is not None else (None, 1)
        scenario = scenario.with_hardware(model=model, hardware=hardware, tensor_parallel=tp, kv_cache_bytes=kv_bytes)
    except (ScenarioError, ValueError) as err:
        raise click.ClickException(str(err).removeprefix("Value error, ")) from None
    warning = scenario.time_model_warning()
    if warning:
        click.echo(f"warning: {warning}", err=True)
    return scenario


def kv_origin(model: str | None, gpu: tuple[str, int] | None, kv_gib: float | None) -> str:
    """Where a command's KV per worker comes from, for its header: --kv-gib, vLLM's rule (--model/--gpu without
    --kv-gib: `on_hardware`) or the scenario."""
    if kv_gib is not None:
        return "--kv-gib"
    return "vLLM's rule" if model is not None or gpu is not None else "the scenario's"


def _hardware_text(scenario: Scenario, workers: Iterable[int] | None = None) -> str:
    """The hardware the workers run on (with the tensor-parallel degree), or the devices' names under a linear time
    model, for the scenario's worker count or each of `workers`: `h100-sxm TP2`, `rtx-3090 + rtx-4070-laptop`."""
    names: dict[str, None] = {}
    for count in workers or [scenario.cluster.workers]:
        for dev in scenario.cluster.model_copy(update={"workers": count}).devices():
            spec = scenario.device_time_model(dev)
            if spec.kind == "roofline":
                names[spec.hardware + (f" TP{spec.tensor_parallel}" if spec.tensor_parallel > 1 else "")] = None
            else:
                default = scenario.cluster.default_device.name  # its copies are named default-0, default-1, ...
                names[f"device {default if dev.name.startswith(default + '-') else dev.name}"] = None
    return " + ".join(names)


def _kv_gib(scenario: Scenario) -> float:
    """The GPU KV per worker in GiB that the engine's blocks hold (vLLM: blocks x block_size; SGLang: pages x
    page_size, x the KV bytes per token)."""
    engine = scenario.engine
    tokens_per_block = getattr(engine, "page_size", engine.block_size)
    return scenario.num_blocks * tokens_per_block * scenario.model.kv_bytes_per_token / GIB


def setup_text(scenario: Scenario, kv: str = "the scenario's", workers: Iterable[int] | None = None) -> str:
    """The setup a summary describes, for its header: model, hardware and tensor parallelism (`workers`: the worker
    counts it covers), engine, KV blocks per worker (GPU, and host tier if any) with where the GPU's come from
    (`kv_origin`), and where the time model's numbers come from (`Scenario.time_model_origin`)."""
    from sim.scenario import cpu_kv_gib

    engine = scenario.engine
    host = getattr(engine, "num_cpu_chunks", None)
    tier = (f", host KV {host(scenario.model.kv_bytes_per_token):,} blocks/worker ({cpu_kv_gib(scenario):g} GiB)"
            if host is not None and scenario.cpu_kv_bytes else "")
    if scenario.shared_kv_bytes:
        tier += (f", shared KV {engine.num_shared_chunks(scenario.model.kv_bytes_per_token):,} blocks "
                 f"({scenario.shared_kv_bytes / GIB:g} GiB for the cluster)")
    return (f"{scenario.model.name} on {_hardware_text(scenario, workers)}, {engine.kind} {engine.version}, "
            f"KV {scenario.num_blocks:,} blocks/worker ({_kv_gib(scenario):.3g} GiB, {kv}){tier}; time model "
            f"{scenario.time_model_origin()}")


def kv_rule_note(scenario: Scenario, kv: str) -> str | None:
    """The KV per worker vLLM's rule gave, how many prompts it holds and the arithmetic (`Scenario.kv_budget`), when
    it came from the rule (`kv_origin`); else None."""
    if kv != "vLLM's rule":
        return None
    budget = scenario.kv_budget()
    prompts = ("" if scenario.has_sessions else f" ({scenario.kv_capacity_requests:.1f} prompts of "
                                                 f"{scenario.workload.prompt_tokens:,.0f} tokens)")
    return (f"KV per worker: {_kv_gib(scenario):.3g} GiB = {scenario.num_blocks:,} blocks{prompts}, vLLM's "
            f"memory rule: {budget.text()} (docs/time/models.md; --kv-gib sets it)")


def workload_text(scenario: Scenario) -> str:
    """The workload a summary's title names: `N=7, concurrency=8`, or a sessions workload's style, sessions,
    groups and arrivals (`agent sessions: 40, 2 groups, 4 at once`)."""
    w = scenario.workload
    span = "" if w.duration_s is None else f" over {w.duration_s:g} s"
    if not scenario.has_sessions:
        if w.arrival_curve is not None:
            return f"N={w.prefixes}, arrivals {w.arrival_curve.text()}{span}"
        return f"N={w.prefixes}, concurrency={w.concurrency}"
    arrivals = (f"{w.concurrent_sessions} at once" if w.concurrent_sessions is not None
                else f"{w.session_rate_per_s:g}/s" if w.session_rate_per_s is not None
                else f"starts {w.arrival_curve.text()}{span}")
    count = f"{w.sessions:,}" if w.sessions is not None else f"~{w.planned_sessions:,}"
    return f"{w.style} sessions: {count}, {w.groups} group{'s' * (w.groups > 1)}, {arrivals}"


def workload_keys(scenario: Scenario) -> tuple[int, int]:
    """A summary row's `prefixes` and `concurrency`: a shared-prefix workload's N and requests in flight; a
    sessions workload's groups (its shared system prompts) and sessions at once (0: Poisson session starts)."""
    w = scenario.workload
    if not scenario.has_sessions:
        return w.prefixes, w.concurrency
    return w.groups, w.concurrent_sessions or 0


def scenario_option(uses: str = "", default: str = "the built-in service-baseline scenario") -> Callable:
    """`--scenario FILE` (parameter `scenario_path`), one spelling for every command that takes a scenario; `uses`
    says what the command takes from it, `default` which scenario it runs without one."""
    return click.option(
        "--scenario", "scenario_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
        help=f"Scenario YAML file{uses}. Default: {default} (`kvsim scenarios` lists the built-in ones, `kvsim "
             f"scenarios export NAME` writes one to edit).")


def positional_or_option(positional, option, argument: str, option_name: str):
    """The value of a command's positional `argument` or of its `option_name` (the spelling every command shares):
    either may be given, not both (a one-line usage error); None or () when neither is."""
    if positional and option:
        raise UsageExit(f"give {argument} or {option_name}, not both")
    return positional or option


def load_or_exit(path: str | None, gpu: tuple[str, int] | None = None, *,
                 shared_prefix: str | None = None) -> tuple[Scenario, Path]:
    """The scenario file at `path` (the built-in one for None), its router's and autoscaler's names and options
    checked too, or the error naming the file and every problem with its line. With `gpu` (--gpu) its devices are
    not checked against the model's weights: --gpu replaces them, and `on_hardware` checks the new ones. With
    `shared_prefix` (a command's name), a sessions workload is refused in one line: the command varies or measures
    what only a shared-prefix workload has (its prefixes N, its request stream, the formula min(1, C/N))."""
    from sim.runner import autoscaler_problems, router_problems

    try:
        scenario, file = load_scenario(path, checks=(router_problems, autoscaler_problems), check_devices=gpu is None)
    except ScenarioError as err:
        raise click.ClickException(str(err)) from None
    if shared_prefix is not None and scenario.has_sessions:
        raise click.ClickException(
            f"kvsim {shared_prefix}: {file.name} has a sessions workload (workload.kind: sessions); {shared_prefix} "
            f"works on a shared-prefix workload (workload.kind: shared-prefix). Run sessions with `kvsim run` or compare "
            f"routers on them with `kvsim compare`")
    return scenario, file


def reference_measurements(scenario: Scenario, scenario_path: Path) -> list[Measurement]:
    """The scenario's measured reference: empty without one, or with a one-line warning on stderr when its file is
    missing (a copied scenario runs, without measurements); a file that is there but cannot be read is a one-line
    error."""
    from sim.studies.reference import load_reference, reference_path

    ref_path = reference_path(scenario, scenario_path)
    if ref_path is None:
        return []
    if not ref_path.exists():
        # NOTE: click.echo, not rich: a path may hold [brackets] that rich would take for markup
        click.echo(f"warning: reference: {ref_path} not found; running without measurements (give the scenario's "
                   f"reference: a path relative to it, or kvsim:PATH for a file that ships with kvsim)", err=True)
        return []
    try:
        return load_reference(ref_path)
    except (OSError, ValueError) as err:
        raise click.ClickException(f"reference: cannot read {ref_path}: {err}") from None


class UsageExit(click.ClickException):
    """A usage error printed as one line (`Error: ...`, no usage block), exit status 2."""

    exit_code = 2


def executor_options(command: Callable) -> Callable:
    """`--jobs N`, `--executor local|dask` and `--dask-scheduler ADDR`, declared here once for every command that runs
    many simulations: parameters `jobs`, `executor_kind` and `dask_scheduler`; `open_executor_or_exit` turns them
    into an executor."""
    from sim.studies.executor import EXECUTORS

    command = click.option(
        "--dask-scheduler", "dask_scheduler", default=None, metavar="ADDR",
        help="With --executor dask: the scheduler of a running Dask cluster (`dask scheduler` prints it, e.g. "
             "tcp://HOST:8786). Default: a local cluster of --jobs single-threaded worker processes.")(command)
    command = click.option(
        "--executor", "executor_kind", type=click.Choice(EXECUTORS), default="local", show_default=True,
        help="Where the simulations run: local processes (--jobs of them) or a Dask cluster. A seed gives the same "
             "results on either.")(command)
    return click.option(
        "--jobs", type=click.IntRange(min=1), default=None,
        help="Parallel processes (with --executor dask and no --dask-scheduler: local Dask workers); the results do "
             "not depend on it. Default: all cores.")(command)


def open_executor_or_exit(kind: str, jobs: int | None, dask_scheduler: str | None):
    """The executor of `--executor`/`--dask-scheduler`/`--jobs`, or a one-line usage error (exit 2)."""
    from sim.studies.executor import open_executor

    if dask_scheduler is not None and kind != "dask":
        raise UsageExit("--dask-scheduler goes with --executor dask")
    try:
        return open_executor(kind, jobs=jobs, address=dask_scheduler)
    except (OSError, TimeoutError) as err:
        raise click.ClickException(f"--dask-scheduler {dask_scheduler}: cannot connect ({err})") from None


@contextmanager
def progress_bar(label: str, total: int | None = None) -> Iterator[Callable[..., None]]:
    """A progress bar on stderr (bar, done/total, rate, elapsed and ETA; with no total a spinner), drawn only when
    stderr is a terminal. Yields `step(advance=1, note=None, completed=None, total=None)`: advance by `advance` (or
    set `completed`, and `total` when a study learns it), show `note` beside the bar."""
    if not err_console.is_terminal:
        # NOTE: nobody watches (stderr is a file or a pipe): rich's bar would draw nothing, so neither it nor its
        # module is built (a short command's start-up).
        yield _no_step
        return
    from rich.progress import (
        BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TaskProgressColumn, TextColumn, TimeElapsedColumn,
        TimeRemainingColumn,
    )

    columns = ([TextColumn(label), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
                TextColumn("{task.fields[rate]}"),
                TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.description}")]
               if total is not None else
               [SpinnerColumn(), TextColumn(label), TimeElapsedColumn(), TextColumn("{task.description}")])
    with Progress(*columns, console=err_console, transient=True) as bar:
        task = bar.add_task("", total=total, rate="")

        def step(advance: int = 1, note: str | None = None, completed: int | None = None,
                 total: int | None = None) -> None:
            if completed is None:
                bar.advance(task, advance)
            speed = bar.tasks[0].speed
            update = {"description": note, "completed": completed, "total": total}
            bar.update(task, rate=f"{speed:.2f}/s" if speed else "", **{k: v for k, v in update.items() if v is not None})

        yield step


def _no_step(advance: int = 1, note: str | None = None, completed: int | None = None,
             total: int | None = None) -> None:
    """`progress_bar`'s step when no bar is drawn."""


def checked_out_dir(out_dir: str | None) -> Path | None:
    """`--out DIR` created and probed for writing before any work starts, or a one-line usage error (exit 2)."""
    from sim.results.output_set import OutDirError, check_writable

    if out_dir is None:
        return None
    out = Path(out_dir)
    try:
        check_writable(out)
    except OutDirError as err:
        raise UsageExit(str(err)) from None
    return out


def checked_out_file(path: str | None, option: str = "--out") -> Path | None:
    """A file option's folder created and probed for writing before any work starts, or a one-line usage error."""
    from sim.results.output_set import OutDirError, check_writable

    if path is None:
        return None
    file = Path(path)
    try:
        check_writable(file.parent, f"{option} {file}: folder {file.parent}")
    except OutDirError as err:
        raise UsageExit(str(err)) from None
    return file


def hit_rates_legend(request: str = "request hit rate", token: str = "token hit rate") -> str:
    """What the two hit rates count, for the legend of every table that shows both (under the names its columns or
    rows give them): a request that finds one shared block of a long prompt counts fully in the first and little in
    the second."""
    return f"{request}: share of requests with any cached prefix token; {token}: cached / prompt tokens"


SHARED_FIRST_BLOCK = ("a trace whose requests share their first block has a request hit rate near 1 however low its "
                      "reuse: every request of the Mooncake conversation trace starts with block 0 (one 512-token "
                      "prefix shared by all, a system prompt's worth), so only the first request each worker serves "
                      "misses (request hit rate >= 1 - 8/12,031 = 0.9993 on 8 workers, beside reuse of 0.11 to 0.36 "
                      "depending on the router)")
"""Why a trace's request hit rate and its prefix reuse part (docs/concepts/hit-rate.md#two-hit-rates-on-a-trace)."""


def capacity_text(capacity_requests: float) -> str:
    """C of the formula min(1, C/N), named with its unit (concurrency is never C)."""
    return f"C = {capacity_requests:.2f} prompts per worker (KV tokens per worker / prompt tokens)"


def fmt(value: object, spec: str = ".3f") -> str:
    if isinstance(value, float):
        return "-" if math.isnan(value) else format(value, spec)
    return str(value)


# ---------------------------------------------------------------------------------------------- P/D pools
PD_HELP = ("Prefill/decode disaggregation: {what} (cluster.disaggregation; give both --prefill-workers and "
           "--decode-workers; the cluster then has P + D workers, and an aggregated --router routes each pool, a "
           "disaggregated one such as dynamo-disagg both; see `kvsim routers`). Default: the scenario's.")


def pd_options(command):
    """`--prefill-workers P --decode-workers D` (each a whole number >= 1, both or neither)."""
    command = click.option("--decode-workers", "decode_workers", type=click.IntRange(min=1), default=None,
                           help=PD_HELP.format(what="workers of the decode pool"))(command)
    return click.option("--prefill-workers", "prefill_workers", type=click.IntRange(min=1), default=None,
                        help=PD_HELP.format(what="workers of the prefill pool"))(command)


def on_pd(scenario: Scenario, prefill_workers: int | None, decode_workers: int | None) -> Scenario:
    """`scenario` with `--prefill-workers/--decode-workers` applied (unchanged without them), or a one-line error."""
    from sim.scenario import with_pools

    if prefill_workers is None and decode_workers is None:
        return scenario
    if prefill_workers is None or decode_workers is None:
        missing = "--prefill-workers" if prefill_workers is None else "--decode-workers"
        raise click.UsageError(f"{missing}: give both --prefill-workers and --decode-workers")
    try:
        return with_pools(scenario, prefill_workers, decode_workers)
    except (ScenarioError, ValueError) as err:
        raise click.ClickException(str(err).removeprefix("Value error, ")) from None
