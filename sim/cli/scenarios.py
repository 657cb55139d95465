"""`kvsim scenarios`: list the built-in scenarios, and export one as a file to edit that runs from any folder."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import click
import yaml

from sim.cli.app import UsageExit, checked_out_file, main
from sim.results.report import write_atomic
from sim.scenario import SHIPPED, ScenarioError, builtin_scenario_names, builtin_scenario_path, scenarios_dir


def _shipped(ref: Any, folder: Path) -> str | None:
    """`ref`, a relative path a built-in scenario in `folder` gives, as `kvsim:PATH` when it names a file that ships
    with kvsim (None otherwise: a shipped model's name, an absolute path, a path already in that form)."""
    if not isinstance(ref, str) or ref.startswith(SHIPPED) or Path(ref).is_absolute():
        return None
    target, root = (folder / ref).resolve(), scenarios_dir().resolve()
    if not target.is_file() or not target.is_relative_to(root):
        return None
    return SHIPPED + target.relative_to(root).as_posix()


def _replace_value(text: str, key: str, old: str, new: str, indented: bool) -> str:
    """`text` with the YAML line `key: old` (top level, or indented under a section) given `new` instead, its quotes
    and comment kept."""
    indent = r"[ \t]+" if indented else ""
    pattern = re.compile(rf"^({indent}{key}:[ \t]*)(['\"]?){re.escape(old)}\2(?=[ \t]*(#.*)?$)", re.MULTILINE)
    return pattern.sub(lambda m: m.group(1) + m.group(2) + new + m.group(2), text, count=1)


def exported_text(name: str) -> str:
    """The built-in scenario `name` as text that runs from any folder: its comments kept, the files it refers to that
    ship with kvsim (`reference:`, `model.config`) written as `kvsim:PATH`. ScenarioError for an unknown name."""
    path = builtin_scenario_path(name)
    text = path.read_text(encoding="utf-8")
    data = yaml.safe_load(text)
    expected, out = dict(data), text
    shipped = _shipped(data.get("reference"), path.parent)
    if shipped is not None:
        expected["reference"] = shipped
        out = _replace_value(out, "reference", data["reference"], shipped, indented=False)
    model = data.get("model")
    shipped = _shipped(model.get("config"), path.parent) if isinstance(model, dict) else None
    if shipped is not None:
        expected["model"] = {**model, "config": shipped}
        out = _replace_value(out, "config", model["config"], shipped, indented=True)
    if yaml.safe_load(out) != expected:  # NOTE: a layout the line edit missed: the data as YAML, comments lost
        out = yaml.safe_dump(expected, sort_keys=False)
    header = (f"# Exported by `kvsim scenarios export {name}`. kvsim:PATH names a file that ships with kvsim\n"
              "# (in its scenarios folder); any other relative path is taken from this file's folder.\n")
    return header + out


def _description(path: Path) -> str:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as err:
        return f"(cannot read: {' '.join(str(err).split())})"
    return " ".join(str(data.get("description", "")).split()) if isinstance(data, dict) else ""


@main.group(invoke_without_command=True, short_help="List the built-in scenarios; export one to edit.")
@click.pass_context
def scenarios(ctx: click.Context) -> None:
    """List the built-in scenarios, a line each: its name (for `kvsim scenarios export NAME`) and description.

    To start from one: `kvsim scenarios export NAME > my.yaml`, edit my.yaml, then run any command with
    --scenario my.yaml (`kvsim run my.yaml` too).
    """
    if ctx.invoked_subcommand is not None:
        return
    names = builtin_scenario_names()
    width = max(map(len, names), default=0)
    for name in names:
        click.echo(f"{name:<{width}}  {_description(builtin_scenario_path(name))}")


@scenarios.command(name="export")
@click.argument("name")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None, metavar="FILE",
              help="Write the scenario to FILE (which must not exist yet) instead of stdout.")
def export(name: str, out_path: str | None) -> None:
    """Write the built-in scenario NAME (see `kvsim scenarios`) as YAML to edit, to stdout or --out FILE.

    The file runs from any folder: the files it refers to that ship with kvsim (its reference measurements) are
    written as kvsim:PATH, found in kvsim's scenarios folder wherever the file is.
    """
    try:
        text = exported_text(name)
    except ScenarioError as err:
        raise click.BadParameter(str(err), param_hint="NAME") from None
    if out_path is None:
        click.echo(text, nl=False)
        return
    out = checked_out_file(out_path)
    if out.exists():
        raise UsageExit(f"--out {out} exists: kvsim does not overwrite a scenario you may have edited; remove it or "
                        "give another FILE")
    write_atomic(out, text.encode())
    click.echo(f"wrote {out}", err=True)
