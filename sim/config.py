"""The base of every configuration model (scenario sections, engine specs): unknown keys are errors, values frozen,
and no infinite or NaN number gets in (it would reach the event loop: an infinite step time never ends)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

GIB = 1 << 30
"""Bytes per GiB: what every `*-gib` option and field is multiplied by."""


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
