"""What `kvsim tune` may change: a search space of knobs, each a float range, an integer range or a choice.

A knob names a router option (checked against the router's `parse_options`) or one of the cluster knobs
`workers` (the worker count) and `kv-gib` (KV cache per worker, GiB). The CLI text is a comma-separated list:

    key=LOW:HIGH          a float in [LOW, HIGH]           prefill_load_scale=0:16
    key=LOW:HIGH:log      the same, sampled on a log scale  scrape_interval_s=0.01:1:log   (LOW > 0)
    key=LOW..HIGH         an integer in LOW..HIGH inclusive balance_abs_threshold=0..64, workers=2..12
    key=LOW..HIGH:log     the same on a log scale           prefix_blocks=1..64:log        (LOW >= 1)
    key=a|b|c             one of the values (YAML scalars)  min_load_tie=first|fewest_processed, rebalancing=true|false

The knob types are `sim.routing.knobs`' (routers declare their default space with them); this module parses a
space, checks it against a router and turns the cluster knobs into scenario overrides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sim.config import GIB, ProblemsError, key_value, key_values, nearest
from sim.routing.knobs import SYNTAX, ChoiceKnob, FloatKnob, IntKnob, Knob, SearchSpace
from sim.routing.spec import format_value, option_value

_FORM = f"key=range or key=choices ({SYNTAX})"

CLUSTER_KNOBS = {"workers": "workers", "kv-gib": "GiB"}
"""Knobs that change the cluster rather than the router, with their units."""


def _number(key: str, text: str, kind: type) -> float | int:
    try:
        return kind(text)
    except ValueError:
        what = "a whole number" if kind is int else "a number"
        raise ValueError(f"{key}: {text!r} is not {what} ({SYNTAX})") from None


def parse_knob(item: str) -> Knob:
    """One `key=...` item (see the module docstring), or a one-line ValueError naming the key and the syntax."""
    return _knob(*key_value(item, _FORM))


def _knob(key: str, value: str) -> Knob:
    """The knob `key=value` (the text after `=`: a range or choices), or a one-line ValueError naming the key."""
    if not value:
        raise ValueError(f"{key}: no range or choices after '=' ({SYNTAX})")
    log = value.endswith(":log")
    body = value.removesuffix(":log") if log else value
    if "|" in body:
        if log:
            raise ValueError(f"{key}: a choice has no log scale ({SYNTAX})")
        texts = [v.strip() for v in body.split("|")]
        if not all(texts):
            raise ValueError(f"{key}: an empty choice in {value!r} ({SYNTAX})")
        return ChoiceKnob(key, tuple(map(option_value, texts)))
    if ".." in body:
        low, _, high = body.partition("..")
        return IntKnob(key, int(_number(key, low.strip(), int)), int(_number(key, high.strip(), int)), log)
    if ":" in body:
        parts = body.split(":")
        if len(parts) != 2:
            raise ValueError(f"{key}: {value!r} is not LOW:HIGH or LOW:HIGH:log ({SYNTAX})")
        low, high = (float(_number(key, p.strip(), float)) for p in parts)
        return FloatKnob(key, low, high, log)
    raise ValueError(f"{key}: {value!r} is a single value, not a range or choices; fix a router option in "
                     f"--router NAME:{key}={value} instead ({SYNTAX})")


def parse_space(text: str) -> SearchSpace:
    """`key=...,key=...` -> knobs in the order given; every key once."""
    knobs = tuple(_knob(key, value) for key, value in key_values(text, _FORM).items())
    if not knobs:
        raise ValueError(f"{text!r}: no knob given ({SYNTAX})")
    return knobs


def space_text(space: Sequence[Knob]) -> str:
    """The CLI text of `space` (round-trips through `parse_space`)."""
    return ",".join(k.text() for k in space)


def router_knobs(space: Sequence[Knob]) -> tuple[Knob, ...]:
    return tuple(k for k in space if k.key not in CLUSTER_KNOBS)


def check_space(space: Sequence[Knob], *, router: str, option_names: Sequence[str],
                parse_options: Callable[[dict[str, Any]], object], fixed_options: Mapping[str, Any]) -> None:
    """Every knob is a cluster knob or an option of the router, not also fixed, and every extreme (each choice) is
    a value the router accepts beside the fixed options; a one-line ValueError names the key otherwise."""
    for knob in space:
        if knob.key == "workers":
            if not isinstance(knob, (IntKnob, ChoiceKnob)) or not all(
                    isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in knob.extremes):
                raise ValueError("workers: give whole numbers >= 1, e.g. workers=2..12 or workers=4|6|8")
            continue
        if knob.key == "kv-gib":
            if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 for v in knob.extremes):
                raise ValueError("kv-gib: give GiB per worker > 0, e.g. kv-gib=0.5:8 or kv-gib=1|2|4")
            continue
        if knob.key not in option_names:
            near = nearest(knob.key, [*option_names, *CLUSTER_KNOBS])
            raise ValueError(f"{knob.key}: not an option of {router}{f'; did you mean {near}?' if near else ''} "
                             f"(options: {', '.join(option_names)}; cluster knobs: {', '.join(CLUSTER_KNOBS)})")
        if knob.key in fixed_options:
            raise ValueError(f"{knob.key}: fixed in the router spec and searched in the space; give it in one place")
        for value in knob.extremes:
            try:
                parse_options({**fixed_options, knob.key: value})
            except ProblemsError as err:  # the key is known to be an option here: say only why
                why = "; ".join(p.message if p.loc == (knob.key,) else p.text() for p in err.problems)
                shown = f"{value:g}" if isinstance(value, float) else format_value(value)
                raise ValueError(f"{knob.key}={shown} is not allowed for {router}: {why}") from None


def cluster_overrides(base_engine, params: Mapping[str, Any]) -> dict[str, Any]:
    """Scenario overrides for the cluster knobs in `params` (`kv-gib` through the engine's own capacity rule, so a
    block-count override in the scenario is replaced, not silently kept)."""
    overrides: dict[str, Any] = {}
    if "workers" in params:
        overrides["cluster.workers"] = int(params["workers"])
    if "kv-gib" in params:
        overrides.update(base_engine.capacity_overrides(kv_bytes=int(round(float(params["kv-gib"]) * GIB))))
    return overrides


def round_significant(value: float, digits: int = 4) -> float:
    """`value` to `digits` significant digits (0 stays 0)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - math.floor(math.log10(abs(value))))
