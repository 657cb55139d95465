"""Router specs as the CLI and sweep tables write them: `NAME` or `NAME:key=value,key=value`.

A comma-separated list of specs is split where a token has no `=`: `kv-aware:state=events,event_lag_s=0.5,random`
is two specs, `kv-aware` with two options and `random`. Values are YAML scalars (`0.5`, `true`, `null`, `events`).
A spec's label (its text, normalised) names its rows in `summary.csv`. `RouterSpec` is the scenario's `router:`
section, which takes either form.
"""

from __future__ import annotations

from typing import Any

import yaml
from pydantic import Field, model_validator

from sim.config import ConfigModel, key_values


class RouterSpec(ConfigModel):
    """`router: {name: kv-aware, options: {state: events}}`, or the CLI's spec text `router: "kv-aware:state=events"`."""

    name: str = Field("random", description="Router name (see `kvsim routers`).")
    options: dict[str, Any] = Field(default_factory=dict, description="Router options, by router.")

    @model_validator(mode="before")
    @classmethod
    def _from_spec_text(cls, data: Any) -> Any:
        if isinstance(data, str):
            name, options = split_router_spec(data)
            return {"name": name, "options": options}
        return data


def option_value(text: str) -> Any:
    """An option value as written in a spec: a YAML scalar (`0.5`, `true`, `null`, `first`); text otherwise."""
    try:
        value = yaml.safe_load(text)
    except yaml.YAMLError:
        return text
    return text if isinstance(value, (dict, list)) else value


def split_router_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """`NAME:k=v,k=v` -> (NAME, {k: v}); a one-line ValueError names what is malformed."""
    name, colon, rest = spec.partition(":")
    name = name.strip()
    if not name:
        raise ValueError(f"{spec!r}: a router spec starts with a router name (NAME or NAME:key=value,...)")
    try:
        options = {key: option_value(value) for key, value in key_values(rest, "key=value").items()}
    except ValueError as err:
        raise ValueError(f"{spec!r}: option {err} (NAME or NAME:key=value,...)") from None
    if colon and not options:
        raise ValueError(f"{spec!r}: nothing after ':' (give key=value options or drop the ':')")
    return name, options


def format_value(value: Any) -> str:
    """An option value as a spec writes it (the inverse of `option_value` for YAML scalars): `null`, `true`/`false`,
    numbers and text as they print."""
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def router_label(name: str, options: dict[str, Any]) -> str:
    """The canonical text of a spec (round-trips through `split_router_spec`)."""
    if not options:
        return name
    return name + ":" + ",".join(f"{k}={format_value(v)}" for k, v in options.items())


def split_router_list(text: str) -> list[str]:
    """A comma-separated list of specs -> their labels, in order (see the module docstring)."""
    groups: list[list[str]] = []
    for token in (t.strip() for t in text.split(",")):
        if not token:
            continue
        if "=" in token and ":" not in token.split("=", 1)[0]:
            if not groups:
                raise ValueError(f"{text!r}: option {token!r} comes before any router name")
            groups[-1].append(token)
        else:
            groups.append([token])
    if not groups:
        raise ValueError(f"{text!r}: no router given")
    return [router_label(*split_router_spec(",".join(g))) for g in groups]


def router_overrides(label: str, base_name: str, base_options: dict[str, Any]) -> dict[str, Any]:
    """Scenario overrides that select `label`: a bare name equal to the scenario's router keeps its options."""
    name, options = split_router_spec(label)
    if not options and name == base_name:
        options = dict(base_options)
    return {"router.name": name, "router.options": options}
