"""Hardware profiles (`hardware.yaml` beside this module): peak dense bf16 FLOP/s, memory bandwidth, the
tensor-parallel link and the host link (PCIe) of each device class, every number with its source. `--gpu NAME[xTP]`
names one."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources

import yaml


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    """One device class. Peaks are the datasheet's (never a fit); a time model's efficiency factors are
    fractions of them."""

    name: str
    description: str
    peak_flops: float
    """Dense bf16 FLOP/s (tensor cores)."""
    memory_bandwidth: float
    """Bytes/s of DRAM/HBM."""
    memory_bytes: float
    interconnect_bandwidth: float
    """Bytes/s one device sends per direction to its tensor-parallel peers."""
    interconnect_latency: float
    """Seconds per all-reduce beyond the bytes (an assumption; see hardware.yaml)."""
    host_bandwidth: float
    """Bytes/s per direction between host (pinned CPU) memory and the device: the PCIe link rate, which a CPU KV
    tier's loads and stores cross (what copies reach is a fraction of it; see sim/timing/host-link.md)."""
    host_latency: float
    """Seconds per host <-> device transfer job beyond the bytes (an assumption; see hardware.yaml)."""
    aliases: tuple[str, ...] = ()
    price_per_hour_usd: float = float("nan")
    """US dollars for one GPU of this class for an hour: an on-demand list price / the instance's GPUs, or a
    documented assumption (hardware.yaml says which, with its date); NaN: no price."""


def _key(name: str) -> str:
    return re.sub(r"[-_\s]", "", name.lower())


@cache
def hardware_profiles() -> dict[str, HardwareProfile]:
    text = resources.files("sim.timing").joinpath("hardware.yaml").read_text(encoding="utf-8")
    profiles = {}
    for name, entry in yaml.safe_load(text).items():
        missing = {"peak_flops", "memory_bandwidth", "price_per_hour_usd"} - set(entry.get("sources", {}))
        if missing:
            raise RuntimeError(f"hardware.yaml: {name} cites no source for {', '.join(sorted(missing))}")
        # NOTE: every profile states its price, null included, so that a new profile cannot be free by omission.
        price = entry["price_per_hour_usd"]
        if price is not None and not float(price) > 0:
            raise RuntimeError(f"hardware.yaml: {name} price_per_hour_usd {price} must be > 0 or null")
        profiles[name] = HardwareProfile(
            name=name, description=" ".join(str(entry["description"]).split()),
            peak_flops=float(entry["peak_flops"]), memory_bandwidth=float(entry["memory_bandwidth"]),
            memory_bytes=float(entry["memory_bytes"]), interconnect_bandwidth=float(entry["interconnect_bandwidth"]),
            interconnect_latency=float(entry["interconnect_latency"]), host_bandwidth=float(entry["host_bandwidth"]),
            host_latency=float(entry["host_latency"]), aliases=tuple(map(str, entry.get("aliases", ()))),
            price_per_hour_usd=float("nan") if price is None else float(price))
    return profiles


@cache
def _by_key() -> dict[str, str]:
    index: dict[str, str] = {}
    for name, p in hardware_profiles().items():
        for alias in (name, *p.aliases):
            if _key(alias) in index and index[_key(alias)] != name:
                raise RuntimeError(f"hardware.yaml: {alias!r} names both {index[_key(alias)]} and {name}")
            index[_key(alias)] = name
    return index


def hardware_profile(name: str) -> HardwareProfile:
    """The profile named `name` or one of its aliases (case, '-' and '_' ignored); a ValueError listing the names."""
    found = _by_key().get(_key(name))
    if found is None:
        raise ValueError(f"unknown hardware {name!r}; allowed: {', '.join(hardware_profiles())}")
    return hardware_profiles()[found]


def parse_gpu(text: str) -> tuple[str, int]:
    """'H100x4' -> ('h100-sxm', 4); 'l40s' -> ('l40s', 1). The degree is tensor parallelism (1..64)."""
    m = re.fullmatch(r"\s*(.+?)(?:\s*[xX](\d+))?\s*", text)
    name, tp = (m.group(1), int(m.group(2) or 1)) if m else (text, 1)
    if not 1 <= tp <= 64:
        raise ValueError(f"{text!r}: the tensor-parallel degree after 'x' must be 1..64")
    return hardware_profile(name).name, tp
