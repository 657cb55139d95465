"""The one place a time-model spec (`sim.timing.spec`) becomes the step-time model a device runs."""

from __future__ import annotations

from sim.engines.interface import StepTimeModel
from sim.timing.hardware import hardware_profile
from sim.timing.linear import LinearStepTimeModel
from sim.timing.roofline import RooflineStepTimeModel
from sim.timing.spec import ModelSpec, TimeModelSpec


def build_time_model(spec: TimeModelSpec, model: ModelSpec) -> StepTimeModel:
    """A device's step-time model (`Scenario.device_time_model`): the fitted linear one, or the roofline of the
    model on the spec's hardware."""
    fields = spec.model_dump(exclude={"kind", "host_link"})
    if spec.kind == "linear":
        return LinearStepTimeModel(**fields)
    del fields["hardware"], fields["tensor_parallel"]
    if fields["attention_efficiency"] is None:
        fields["attention_efficiency"] = fields["compute_efficiency"]
    return RooflineStepTimeModel(model.architecture, hardware_profile(spec.hardware),
                                 tensor_parallel=spec.tensor_parallel, **fields)
