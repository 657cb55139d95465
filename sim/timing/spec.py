"""The `model:` and `time_model:` sections of a scenario: the served model (its KV bytes per token and
architecture), and the step-time models that price an engine step (`sim.timing.linear`, `sim.timing.roofline`,
built by `sim.timing.build`), with each device's link to host memory."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import Discriminator, Field, Tag, ValidationInfo, field_validator, model_validator

from sim.config import ConfigModel
from sim.timing.architecture import ModelArchitecture, load_architecture
from sim.timing.hardware import hardware_profile


class ModelSpec(ConfigModel):
    """The served model: its KV bytes per token (what the cache sizes from) and, for the roofline time model, its
    architecture. `config: NAME-or-PATH` (a shipped model, see `kvsim hardware`, or a Hugging Face config.json,
    relative to the scenario file) fills `architecture`, `kv_bytes_per_token` and the default `name`."""

    name: str = Field("unnamed", description="Model name, for reports only.")
    kv_bytes_per_token: int = Field(gt=0, description="KV bytes per token, all layers: layers x 2 x kv_heads x head_dim x dtype bytes.")
    architecture: ModelArchitecture | None = Field(
        None, description="Layers, heads, sizes and dtype (from `config:`); needed by the roofline time model.")
    config: str | None = Field(
        None, exclude=True, description="A shipped model (Qwen3-0.6B, Llama-3.1-8B, Llama-3.1-70B, Qwen2.5-72B) or a "
        "Hugging Face config.json path (relative to the scenario file): fills architecture, kv_bytes_per_token and the "
        "default name. Read once; a written scenario carries the architecture instead.")

    @model_validator(mode="before")
    @classmethod
    def _from_config(cls, data: Any, info: ValidationInfo) -> Any:
        if not (isinstance(data, dict) and "config" in data):
            return data
        data = dict(data)
        ref = data.pop("config")
        if ref is None:
            return data
        if "architecture" in data:
            raise ValueError("give config or architecture, not both")
        base_dir = (info.context or {}).get("base_dir")
        name, arch = load_architecture(str(ref), relative_to=base_dir)
        data.setdefault("name", name)
        data["architecture"] = arch
        data.setdefault("kv_bytes_per_token", arch.kv_bytes_per_token)
        return data

    @model_validator(mode="after")
    def _kv_bytes_agree(self) -> ModelSpec:
        arch = self.architecture
        if arch is not None and arch.kv_bytes_per_token != self.kv_bytes_per_token:
            raise ValueError(f"kv_bytes_per_token {self.kv_bytes_per_token} disagrees with the architecture's "
                             f"{arch.kv_bytes_per_token} (layers x 2 x kv_heads x head_dim x dtype bytes)")
        return self


class HostLinkSpec(ConfigModel):
    """A device's link to host memory (`sim.cluster.host_link`): it times the copies of a host KV tier
    (`engine.cpu_kv_bytes`). Each direction is one FIFO queue; a copy takes latency_s + bytes / bandwidth."""

    bandwidth: float | None = Field(
        None, gt=0, description="Bytes/s per direction per device. Default: the hardware profile's host_bandwidth x "
        "efficiency (roofline); a linear time model has no hardware and must give it.")
    efficiency: float = Field(
        0.8, gt=0, le=1, description="Fraction of the profile's host link rate a copy reaches (used only without "
        "bandwidth; PCIe's packet and DMA overheads leave about 80 percent of the link rate to large pinned copies).")
    latency_s: float | None = Field(
        None, ge=0, description="Fixed cost of each copy job (submission, DMA setup). Default: the hardware "
        "profile's host_latency (roofline), else 1e-5.")


def _host_link_field():
    return Field(default_factory=HostLinkSpec, description="The device's host link, timing a host KV tier's copies.")


class LinearTimeModelSpec(ConfigModel):
    """Step-time model at device speed 1.0 (`sim.timing.linear.LinearStepTimeModel`), fitted per setup:
    step_s = base_s + prefill_token_s x prefill tokens + decode_seq_s x decodes
           + decode_context_token_s x decode context tokens + prefill_attention_pair_s x prefill attention pairs."""

    kind: Literal["linear"] = Field("linear", description="The additive model (a time model without kind is one).")
    base_s: float = Field(0.005, ge=0, description="Fixed cost of every engine step (launch, scheduling, sampling).")
    prefill_token_s: float = Field(3.0e-5, ge=0, description="Per prompt token computed in the step (cached tokens excluded).")
    decode_seq_s: float = Field(2.0e-4, ge=0, description="Per request decoding one token in the step.")
    decode_context_token_s: float = Field(0.0, ge=0, description="Per KV token read by the step's decodes.")
    prefill_attention_pair_s: float = Field(0.0, ge=0, description="Per query-key pair of the step's prefill tokens.")
    host_link: HostLinkSpec = _host_link_field()


def _efficiency(default: float, what: str):
    return Field(default, gt=0, le=1, description=f"Fraction of the hardware's peak {what} reached (fitted by calibrate).")


def known_hardware(name: str | None) -> str | None:
    return None if name is None else hardware_profile(name).name


class RooflineTimeModelSpec(ConfigModel):
    """Step time from the model's FLOPs and bytes on a hardware profile (`sim.timing.roofline`): per step,
    max(compute, memory) of the GEMMs + max(compute, memory) of attention + all-reduces + overheads. The
    efficiency factors and overheads are the free parameters; the defaults are round, uncalibrated values."""

    kind: Literal["roofline"] = Field(description="The roofline model.")
    hardware: str = Field(description="Hardware profile (`kvsim hardware` lists them; a device's own `hardware` wins).")
    tensor_parallel: int = Field(1, ge=1, le=64, description="Devices one worker's model is split over (a device's own wins).")
    compute_efficiency: float = _efficiency(0.5, "dense bf16 FLOP/s the GEMMs")
    attention_efficiency: float | None = Field(
        None, gt=0, le=1, description="Fraction of the hardware's peak FLOP/s attention reaches. Default: "
        "compute_efficiency (one efficiency for all FLOPs: measurements at a single prompt length cannot tell the "
        "two apart, since a prompt's attention pairs grow with its tokens).")
    memory_efficiency: float = _efficiency(0.8, "memory bandwidth weight and KV reads")
    step_overhead_s: float = Field(0.002, ge=0, description="Fixed cost of every step beyond the kernels (scheduling, launches, sampling).")
    seq_overhead_s: float = Field(0.0, ge=0, description="Cost per request in the step beyond its FLOPs and bytes (input preparation, sampling).")
    host_link: HostLinkSpec = _host_link_field()

    _hardware = field_validator("hardware")(known_hardware)  # the canonical name (aliases accepted)


def _time_model_kind(data: Any) -> str:
    kind = data.get("kind", "linear") if isinstance(data, dict) else getattr(data, "kind", "linear")
    return kind if kind in ("linear", "roofline") else "unknown"


TimeModelSpec = Annotated[
    Union[Annotated[LinearTimeModelSpec, Tag("linear")], Annotated[RooflineTimeModelSpec, Tag("roofline")]],  # noqa: UP007
    Discriminator(_time_model_kind, custom_error_type="time_model_kind",
                  custom_error_message="kind must be linear or roofline"),
]
