"""The `kvsim` group itself, light enough that `kvsim --help` loads no command: each command's module is imported
when the command is run (or its own help shown), and the group's help lists the commands from `COMMANDS`.

A command module registers its commands on `main` (`@main.command()`) when imported; `COMMANDS` says which module
holds each command and its one-line help (tests/cli/test_cli.py checks both against the commands themselves).
"""

from __future__ import annotations

import importlib

import click

COMMANDS: dict[str, tuple[str, str]] = {
    "calibrate": ("sim.cli.calibration",
        "Fit the step-time model (and per-request overheads, device speeds) to measured latencies."),
    "compare": ("sim.cli.comparing",
        "Compare routers on one workload: every router sees the same request stream (repeat r: seed + r)."),
    "engines": ("sim.cli.simulate",
        "List the engines and their options (the `engine:` section of a scenario)."),
    "hardware": ("sim.cli.simulate",
        "List the hardware profiles (--gpu NAME[xTP], a roofline time model's `hardware`) and the shipped "
        "models (--model NAME); every number's source is in sim/timing/hardware.yaml."),
    "measure": ("sim.cli.real_servers",
        "Send real servers (vLLM or SGLang, recognised per endpoint) exactly the stream kvsim simulates, and "
        "write a run CSV + sidecar."),
    "plan": ("sim.cli.planning",
        "Plan for a target: the cheapest capacity, the best router, the cheapest fleet."),
    "replay": ("sim.cli.replaying",
        "Replay a JSONL trace and report prefix reuse, TTFT and throughput."),
    "routers": ("sim.cli.simulate",
        "List the routers: each one's summary, options with their defaults (as --router NAME:key=value,...) "
        "and what `kvsim tune` searches; with NAME..., what each option of those routers means."),
    "run": ("sim.cli.simulate",
        "Run one point of a scenario and print its summary."),
    "scenarios": ("sim.cli.scenarios",
        "List the built-in scenarios; export one to edit."),
    "schema": ("sim.cli.simulate",
        "Print the scenario file's JSON Schema (for editor completion and validation, e.g. a YAML language "
        "server's `# yaml-language-server: $schema=...`)."),
    "sweep": ("sim.cli.simulate",
        "Run a grid of points and compare the hit rate with the formula and the measurements."),
    "traces": ("sim.cli.traces",
        "List the public Mooncake traces; fetch them."),
    "tune": ("sim.cli.tuning",
        "Search a router's options for the setting that best meets an objective under constraints."),
    "validate": ("sim.cli.real_servers",
        "Simulate measured runs and compare kvsim's prediction with them."),
}
"""Command name -> (the module that registers it, its one-line help untruncated: the first sentence of its docstring
or its `short_help`)."""


class LazyGroup(click.Group):
    """A group whose commands are imported on first use (`COMMANDS`), run at the collector's pace for a command
    (`sim.cluster.collector.command_collections`)."""

    def main(self, *args, **kwargs):
        from sim.cluster.collector import command_collections

        with command_collections():
            return super().main(*args, **kwargs)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*COMMANDS, *self.commands})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(COMMANDS[cmd_name][0])
        return self.commands.get(cmd_name)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # NOTE: click.Group.format_commands with the one-line helps read from the registry (truncated the same way),
        # so that the group's help imports no command module.
        names = self.list_commands(ctx)
        if not names:
            return
        limit = formatter.width - 6 - max(map(len, names))
        rows = [(name, (self.commands.get(name) or click.Command(name, help=COMMANDS[name][1]))
                 .get_short_help_str(limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(package_name="kvsim")
def main() -> None:
    """kvsim: predict prefix-cache hit rate, TTFT and throughput of LLM serving workers under a router.

    A worker is a serving engine on a device: vLLM v1 (block prefix cache, step scheduler) or SGLang
    (RadixAttention token tree, prefill/decode batches); a scenario file (YAML) describes the model, engine,
    workload, cluster and router. Without --scenario the built-in `service-baseline` scenario (the measured
    reference experiment, on vLLM) is used; `kvsim scenarios` lists the built-in scenarios and `kvsim scenarios
    export NAME > my.yaml` writes one to edit.
    """
