"""The roofline step-time model, model architectures and hardware profiles (sim/timing).

Narrated: a one-layer toy model on a toy device with round numbers, each step's seconds worked out by hand from the
formula of `sim.timing.roofline`. Checked against published numbers: the shipped configs' parameter counts and KV
bytes per token. Property: the decode fast-forward's arithmetic series is the stepped model, step for step.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from sim.cli import main
from sim.engines.interface import StepPlan
from sim.runner import run
from sim.scenario import ScenarioError, load_scenario, validate_scenario
from sim.timing.architecture import ModelArchitecture, load_architecture, shipped_models
from sim.timing.hardware import HardwareProfile, hardware_profile, hardware_profiles, parse_gpu
from sim.timing.roofline import RooflineStepTimeModel
from tests.support.paths import REPO

# One layer, hidden 8, 2 query heads and 1 KV head of 4 dims, MLP 16, vocabulary 32, bf16:
#   attention projections 8 x (2 + 2 x 1) x 4 + 2 x 4 x 8 = 192, MLP 3 x 8 x 16 = 384  -> 576 per token
#   logits 32 x 8 = 256;  KV per token 1 x 2 x 1 x 4 x 2 B = 16 B
TOY = ModelArchitecture(num_hidden_layers=1, hidden_size=8, num_attention_heads=2, num_key_value_heads=1, head_dim=4,
                        intermediate_size=16, vocab_size=32, dtype_bytes=2)
# 1 MFLOP/s, 1 MB/s, a 100 kB/s link with 0.1 ms per all-reduce (and a host link the step time does not use)
DEVICE = HardwareProfile(name="toy", description="toy", peak_flops=1e6, memory_bandwidth=1e6, memory_bytes=1e9,
                         interconnect_bandwidth=1e5, interconnect_latency=1e-4, host_bandwidth=1e5, host_latency=1e-5)


def toy_model(tp: int = 1) -> RooflineStepTimeModel:
    return RooflineStepTimeModel(TOY, DEVICE, tensor_parallel=tp, compute_efficiency=1.0, attention_efficiency=1.0,
                                 memory_efficiency=1.0, step_overhead_s=0.01, seq_overhead_s=0.001)


def prefill_plan() -> StepPlan:
    """One request's first 10 prompt tokens: 10 x 11 / 2 = 55 attention pairs, nothing before them."""
    return StepPlan(num_scheduled_tokens={"r0": 10}, num_prefill_tokens=10, num_prefill_attention_pairs=55)


def test_the_toy_architecture_counts_as_drawn():
    assert (TOY.attention_params_per_layer, TOY.expert_params, TOY.layer_params_active) == (192, 384, 576)
    assert (TOY.embedding_params, TOY.kv_bytes_per_token, TOY.num_params) == (256, 16, 576 + 2 * 256)


def test_a_prefill_step_is_compute_bound_in_both_phases():
    # GEMMs: 2 x 576 x 10 + 2 x 256 x 1 = 12,032 FLOP = 12.032 ms (weights: (576 + 256) x 2 B = 1.664 ms)
    # attention: 4 x 1 x 2 x 4 x 55 = 1,760 FLOP = 1.76 ms (KV: 16 B x (0 + 10) = 0.16 ms)
    assert toy_model().step_seconds(prefill_plan()) == pytest.approx(0.01 + 0.001 + 0.012032 + 0.00176, rel=1e-12)


def test_a_decode_step_and_its_series():
    # Two decodes with contexts 10 and 20: T = S = 2, pairs = 30 + 2, KV tokens read and written = 30 + 2.
    # GEMMs: 2 x 576 x 2 + 2 x 256 x 2 = 3,328 FLOP = 3.328 ms (weights 1.664 ms); attention: max(32 us, 16 us) x 32
    plan = StepPlan(num_scheduled_tokens={"a": 1, "b": 1}, num_decode_seqs=2, num_decode_context_tokens=30)
    expected = 0.01 + 2 * 0.001 + 0.003328 + 32e-6 * 32
    model = toy_model()
    assert model.step_seconds(plan) == pytest.approx(expected, rel=1e-12)
    first, growth = model.decode_steps(2, 30)
    assert first == pytest.approx(expected, rel=1e-12)
    assert growth == pytest.approx(32e-6 * 2, rel=1e-12)  # the contexts grow by 2 tokens a step


def test_memory_bound_gemms_cost_the_weights_once_whatever_the_batch():
    slow_memory = HardwareProfile(name="m", description="m", peak_flops=1e9, memory_bandwidth=1e4, memory_bytes=1e9,
                                  interconnect_bandwidth=1e5, interconnect_latency=0.0, host_bandwidth=1e5,
                                  host_latency=0.0)
    model = RooflineStepTimeModel(TOY, slow_memory, compute_efficiency=1.0, attention_efficiency=1.0,
                                  memory_efficiency=0.5, step_overhead_s=0.0)
    weights_s = (576 + 256) * 2 / (1e4 * 0.5)
    one = model.decode_steps(1, 0)[0]
    eight = model.decode_steps(8, 0)[0]
    kv_s = 16 / (1e4 * 0.5)  # a decode's own KV write, at context 0
    assert one == pytest.approx(weights_s + kv_s, rel=1e-12)
    assert eight == pytest.approx(weights_s + 8 * kv_s, rel=1e-12)


def test_tensor_parallelism_splits_the_work_and_adds_two_all_reduces_per_layer():
    # t = 2: FLOPs and bytes halve; 2 x 1 layer x (0.1 ms + 2 x (1/2) x 10 tokens x 8 x 2 B / 100 kB/s)
    comm = 2 * (1e-4 + 10 * 8 * 2 / 1e5)
    expected = 0.01 + 0.001 + (0.012032 + 0.00176) / 2 + comm
    assert toy_model(tp=2).step_seconds(prefill_plan()) == pytest.approx(expected, rel=1e-12)


def test_an_moe_reads_only_the_experts_its_tokens_reach():
    moe = TOY.model_copy(update={"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 4})
    # one expert: 3 x 8 x 4 = 96; a token multiplies through 192 + 2 x 96; one token reads 2 experts, 4+ read all 8
    assert (moe.expert_params, moe.layer_params_active) == (96, 192 + 2 * 96)
    assert [moe.layer_params_read(t) for t in (1, 2, 4, 100)] == [192 + 2 * 96, 192 + 4 * 96, 192 + 8 * 96] + [192 + 8 * 96]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 64), context=st.integers(0, 50_000), steps=st.integers(1, 40),
       tp=st.sampled_from([1, 2, 8]))
def test_the_decode_series_is_the_stepped_model(n, context, steps, tp):
    model = RooflineStepTimeModel(load_architecture("Llama-3.1-8B")[1], hardware_profile("h100"), tensor_parallel=tp,
                                  compute_efficiency=0.6, attention_efficiency=0.4, memory_efficiency=0.8,
                                  step_overhead_s=0.002, seq_overhead_s=1e-5)
    first, growth = model.decode_steps(n, context)
    for j in range(steps):
        plan = StepPlan(num_scheduled_tokens=dict.fromkeys(range(n), 1), num_decode_seqs=n,
                        num_decode_context_tokens=context + j * n)
        assert model.step_seconds(plan) == pytest.approx(first + j * growth, rel=1e-9)


# ------------------------------------------------------------------------------------------------ shipped data
@pytest.mark.parametrize(("name", "params_b", "kv_bytes"), [
    ("Qwen3-0.6B", 0.596, 114_688),     # Qwen3 model card: 0.6 B (0.44 B non-embedding)
    ("Llama-3.1-8B", 8.03, 131_072),    # Meta: 8.03 B
    ("Llama-3.1-70B", 70.55, 327_680),  # Meta: 70.6 B
    ("Qwen2.5-72B", 72.7, 327_680),     # Qwen2.5 card: 72.7 B (biases, ~0.01 %, not counted)
])
def test_shipped_configs_match_the_published_sizes(name, params_b, kv_bytes):
    _, arch = load_architecture(name)
    assert arch.num_params / 1e9 == pytest.approx(params_b, rel=0.005)
    assert arch.kv_bytes_per_token == kv_bytes


def test_the_built_in_scenarios_kv_bytes_are_qwen3_0_6b():
    scenario, _ = load_scenario()
    assert scenario.model.kv_bytes_per_token == load_architecture("qwen3-0.6b")[1].kv_bytes_per_token
    assert shipped_models() == ["Llama-3.1-70B", "Llama-3.1-8B", "Qwen2.5-72B", "Qwen3-0.6B"]


def test_every_hardware_number_cites_a_source():
    import yaml

    data = yaml.safe_load((REPO / "sim" / "timing" / "hardware.yaml").read_text())
    numbers = ("peak_flops", "memory_bandwidth", "memory_bytes", "interconnect_bandwidth", "interconnect_latency",
               "host_bandwidth", "host_latency")
    for name, entry in data.items():
        for field in numbers:
            assert str(entry["sources"].get(field, "")).strip(), f"{name}.{field} has no source"
            assert "MEASURED_BELOW" not in str(entry["sources"][field]), f"{name}.{field}: placeholder source"
    assert {"a100-40gb", "a100-80gb", "h100-sxm", "h200", "l40s", "l4", "rtx-4090", "rtx-4060-laptop",
            "xeon-amx-core"} <= set(hardware_profiles())


@pytest.mark.parametrize(("text", "expected"), [
    ("H100x1", ("h100-sxm", 1)), ("h100", ("h100-sxm", 1)), ("A100-80GBx4", ("a100-80gb", 4)),
    ("rtx-4090x2", ("rtx-4090", 2)), ("L40S", ("l40s", 1)),
    # the built-in scenario's device classes: its 24 GB-class GPU is an RTX 3090, its laptops RTX 4070 Laptop GPUs
    ("gpu-24gb", ("rtx-3090", 1)), ("laptop-8gb", ("rtx-4070-laptop", 1)),
])
def test_gpu_names_and_aliases(text, expected):
    assert parse_gpu(text) == expected


def test_the_hardware_listing_shows_each_profiles_host_link():
    # PCI-SIG per-direction link rates: Gen4 x8 15.75, Gen4 x16 31.5, Gen5 x16 63 GB/s
    names = ("rtx-4060-laptop", "rtx-4070-laptop", "rtx-4090", "l4", "a100-80gb", "h100-sxm", "h200")
    assert [hardware_profile(n).host_bandwidth for n in names] == [15.75e9, 15.75e9, 31.5e9, 31.5e9, 31.5e9, 63e9, 63e9]
    assert {p.host_latency for p in hardware_profiles().values()} == {10e-6}  # the assumption, everywhere
    result = CliRunner().invoke(main, ["hardware"], env={"COLUMNS": "250"})
    assert result.exit_code == 0, result.output
    assert "host link GB/s" in result.output
    row = next(line for line in result.output.splitlines() if line.startswith("h100-sxm "))
    assert row.split()[4:6] == ["450", "63"]  # the TP link, then the host link


def test_an_unknown_gpu_lists_the_profiles():
    with pytest.raises(ValueError, match=r"unknown hardware 'B200'; allowed: rtx-4060-laptop, rtx-4070-laptop, rtx-4090, rtx-3090, l4"):
        parse_gpu("B200x8")


# ------------------------------------------------------------------------------------------------ scenarios, CLI
def _roofline_data(**time_model):
    scenario, _ = load_scenario()
    data = scenario.model_dump()
    data["time_model"] = {"kind": "roofline", "hardware": "l4", **time_model}
    data["cluster"]["deployments"] = []
    return data


def test_a_roofline_needs_the_models_architecture():
    data = _roofline_data()
    data["model"] = {"name": "x", "kv_bytes_per_token": 114688}
    with pytest.raises(ScenarioError, match="roofline needs the model's architecture: give model.config"):
        validate_scenario(data, source="s")


def test_a_config_whose_kv_bytes_disagree_is_refused():
    data = _roofline_data()
    data["model"] = {"config": "Qwen3-0.6B", "kv_bytes_per_token": 1000}
    with pytest.raises(ScenarioError, match=r"model: kv_bytes_per_token 1000 disagrees with the architecture's 114688"):
        validate_scenario(data, source="s")


def test_a_bad_efficiency_and_an_unknown_hardware_name_their_fields():
    data = _roofline_data(compute_efficiency=1.5)
    data["model"] = {"config": "Qwen3-0.6B"}
    with pytest.raises(ScenarioError, match=r"^s: time_model\.compute_efficiency: Input should be less than or equal to 1"):
        validate_scenario(data, source="s")
    data = _roofline_data(hardware="tpu-v5")
    data["model"] = {"config": "Qwen3-0.6B"}
    with pytest.raises(ScenarioError, match=r"^s: time_model.hardware: unknown hardware 'tpu-v5'; allowed: "):
        validate_scenario(data, source="s")
    data["time_model"] = {"kind": "quadratic"}
    with pytest.raises(ScenarioError, match=r"^s: time_model: kind must be linear or roofline"):
        validate_scenario(data, source="s")


def test_a_relative_config_path_is_read_from_the_scenario_file(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(json.loads(
        (REPO / "sim" / "timing" / "models" / "Qwen3-0.6B.json").read_text())))
    text = (REPO / "scenarios" / "service-baseline.yaml").read_text()
    assert "  config: Qwen3-0.6B " in text
    text = text.replace("  config: Qwen3-0.6B ", "  config: m/config.json ", 1)
    (tmp_path / "s.yaml").write_text(text.replace("reference: reference/service-baseline.csv\n", ""))
    loaded, _ = load_scenario(tmp_path / "s.yaml")
    assert loaded.model.name == "m" and loaded.model.architecture == load_architecture("Qwen3-0.6B")[1]


def test_weights_that_do_not_fit_the_device_are_refused_with_the_way_out():
    scenario, _ = load_scenario()
    # NOTE: 80 GB of HBM read as 80 GiB (sim.timing.memory.device_memory_bytes); the way out is the smallest degree
    with pytest.raises(ScenarioError, match=r"h100-sxm: 131 GiB of Llama-3.1-70B weights / tensor_parallel 1 do not "
                                            r"fit its 80 GiB: raise tensor_parallel: --gpu h100-sxmx2$"):
        scenario.with_hardware(model="Llama-3.1-70B", hardware="h100-sxm")
    assert scenario.with_hardware(model="Llama-3.1-70B", hardware="h100-sxm", tensor_parallel=2).model.architecture


@pytest.mark.parametrize("model", ["Qwen3-0.6B", "Llama-3.1-8B"])
def test_kvsim_run_with_model_and_gpu(model):
    result = CliRunner().invoke(main, ["run", "--model", model, "--gpu", "H100x1", "--prefixes", "2", "--concurrency",
                                       "2", "--workers", "2"])
    assert result.exit_code == 0, result.output
    assert f"{model} on h100-sxm" in " ".join(result.output.split())


def test_kvsim_run_with_a_model_that_does_not_fit_is_one_line():
    result = CliRunner().invoke(main, ["run", "--model", "Qwen2.5-72B", "--gpu", "H100x1", "--prefixes", "2"])
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert result.output.startswith("Error: ") and result.output.count("\n") == 1
    assert "raise tensor_parallel: --gpu h100-sxmx2" in result.output


@pytest.mark.parametrize(("args", "message"), [
    (["--gpu", "B200"], "Invalid value for '--gpu': unknown hardware 'B200'; allowed:"),
    (["--gpu", "h100x0"], "the tensor-parallel degree after 'x' must be 1..64"),
    (["--model", "no-such-model"], "model config 'no-such-model': neither a shipped model"),
])
def test_bad_model_and_gpu_options_are_one_line(args, message):
    result = CliRunner().invoke(main, ["run", "--prefixes", "2", *args])
    assert result.exit_code in (1, 2) and "Traceback" not in result.output
    assert message in result.output


def test_a_model_alone_on_a_linear_time_model_asks_for_the_gpu():
    result = CliRunner().invoke(main, ["run", str(REPO / "scenarios" / "tiny-cpu.yaml"), "--prefixes", "2",
                                       "--model", "Llama-3.1-8B"])
    assert result.exit_code == 1
    assert "the scenario's time model is linear, fitted to its own model; give --gpu too" in result.output


def test_a_model_alone_keeps_a_roofline_scenarios_hardware(tmp_path):
    scenario, _ = load_scenario()
    with pytest.raises(ScenarioError, match=r"device gpu-24gb \(rtx-3090, 4 workers\): 4 workers x 15 GiB of "
                                            r"Llama-3.1-8B weights / tensor_parallel 1 do not fit its 24 GiB: put "
                                            r"fewer workers on it"):
        scenario.with_hardware(model="Llama-3.1-8B")
    config = json.loads((REPO / "sim" / "timing" / "models" / "Qwen3-0.6B.json").read_text())
    (tmp_path / "half.json").write_text(json.dumps({**config, "num_hidden_layers": 14}))
    smaller = scenario.with_hardware(model=str(tmp_path / "half.json"))
    assert smaller.model.name == "half" and smaller.model.kv_bytes_per_token == 114_688 // 2
    assert smaller.time_model == scenario.time_model and smaller.cluster.deployments == scenario.cluster.deployments
    assert smaller.reference is None


def test_bigger_hardware_is_faster_and_tensor_parallelism_helps_a_big_model():
    scenario, _ = load_scenario()
    point = {"workload.prefixes": 2, "workload.concurrency": 4, "cluster.workers": 2}
    p50 = {}
    for gpu, tp in (("l4", 1), ("h100-sxm", 1), ("h100-sxm", 2), ("h100-sxm", 4)):
        s = scenario.with_hardware(model="Llama-3.1-8B", hardware=gpu, tensor_parallel=tp).with_overrides(**point)
        records = run(s).measured
        p50[(gpu, tp)] = sorted(r.ttft_s for r in records)[len(records) // 2]
    assert p50[("l4", 1)] > 3 * p50[("h100-sxm", 1)]
    assert p50[("h100-sxm", 1)] > p50[("h100-sxm", 2)] > p50[("h100-sxm", 4)]
