"""The base of every configuration model (scenario sections, engine specs): unknown keys are errors, values frozen."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
