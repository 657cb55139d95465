"""The base of every configuration model (scenario sections, engine specs): unknown keys are errors, values frozen,
and no infinite or NaN number gets in (it would reach the event loop: an infinite step time never ends)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

GIB = 1 << 30
"""Bytes per GiB: what every `*-gib` option and field is multiplied by."""


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def key_value(item: str, form: str = "key=value") -> tuple[str, str]:
    """One `key=value` item as (key, value), both stripped (the value may be empty: what it may be is the caller's
    rule); a one-line ValueError naming the item and `form`, the allowed form, when it has no `=` or no key."""
    key, eq, value = (s.strip() for s in item.partition("="))
    if not eq or not key:
        raise ValueError(f"{item.strip()!r} is not {form}")
    return key, value


def key_values(text: str, form: str = "key=value,...") -> dict[str, str]:
    """A comma-separated `key=value,key=value` list as {key: value} in the order given (empty items skipped): the
    one grammar of every `k=v` list (`--slo`, `--tolerance`, router options, search spaces). A one-line ValueError
    names the item that is not `key=value` (with `form`, the allowed form) or the key given twice."""
    pairs: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, value = key_value(item, form)
        if key in pairs:
            raise ValueError(f"{key}: given twice")
        pairs[key] = value
    return pairs
