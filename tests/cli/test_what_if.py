"""What-ifs that say what they assume: `--model`, `--gpu` and `--kv-gib` on run, sweep and plan; the KV per worker
vLLM's memory rule gives when none is given (sim/timing/memory.py); the header naming the model, hardware, TP, KV
blocks and where the time model's efficiencies come from; the warning when fitted efficiencies meet other hardware;
and --gpu rescuing a scenario whose own devices cannot hold the model, with errors that suggest only what applies."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from sim.cli import main
from sim.scenario import ScenarioError, load_scenario
from tests.support.paths import SCENARIOS

SMALL = ["--prefixes", "2", "--workers", "2", "--concurrency", "2"]


def invoke(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def flat(text: str) -> str:
    """Output with rich's title wrapping and table borders undone, for phrase matching."""
    return " ".join(text.replace("│", " ").split())


def test_done_when_llama_70b_on_two_h100s_states_the_kv_it_assumed():
    res = invoke("run", "--model", "Llama-3.1-70B", "--gpu", "H100x2", "--prefixes", "7")
    assert res.exit_code == 0, res.output
    out = flat(res.stdout)
    assert ("service-baseline: Llama-3.1-70B on h100-sxm TP2, vllm 0.31.0, KV 2,120 blocks/worker (10.4 GiB, vLLM's "
            "rule); time model roofline, efficiencies fitted to 8 measured points of Qwen3-0.6B on rtx-3090, "
            "rtx-4070-laptop; 6 workers, N=7, concurrency=8") in out
    assert ("KV per worker: 10.4 GiB = 2,120 blocks (14.3 prompts of 2,371 tokens), vLLM's memory rule: 0.92 x 80 GiB "
            "of h100-sxm - 131 GiB weights / 2 - 0.716 GiB activations - 2 GiB non-torch and CUDA graphs = 5.18 GiB "
            "per GPU, x 2 GPUs") in out
    # 14 prompts per worker against 7 prefixes: what is left to miss is each worker's first request per prefix
    hit_rate = float(out.split("request_hit_rate ")[1].split()[0])
    assert 0.75 < hit_rate <= 1
    assert res.stderr.count("\n") == 1 and res.stderr.startswith(
        "warning: the time model's efficiencies were fitted on rtx-3090, rtx-4070-laptop and are applied to h100-sxm")


def test_kv_gib_overrides_the_rule():
    res = invoke("run", "--model", "Llama-3.1-70B", "--gpu", "H100x2", "--kv-gib", "16", *SMALL)
    assert res.exit_code == 0, res.output
    out = flat(res.stdout)
    assert "KV 3,276 blocks/worker (16 GiB, --kv-gib)" in out  # 16 GiB / (16 tokens x 320 KiB)
    assert "vLLM's memory rule" not in out


def test_the_built_in_scenario_names_its_own_setup_and_warns_of_nothing():
    res = invoke("run", "--prefixes", "2", "--concurrency", "2")  # 6 workers: its deployment on both GPU classes
    assert res.exit_code == 0, res.output
    assert ("Qwen3-0.6B on rtx-3090 + rtx-4070-laptop, vllm 0.31.0, KV 585 blocks/worker (1 GiB, the scenario's); "
            "time model roofline, efficiencies fitted to 8 measured points on rtx-3090, rtx-4070-laptop") in flat(res.stdout)
    assert res.stderr == ""
    res = invoke("run", "--kv-gib", "2", *SMALL)
    assert "KV 1,170 blocks/worker (2 GiB, --kv-gib)" in flat(res.stdout) and res.stderr == ""


def test_a_linear_scenario_on_a_gpu_runs_the_default_roofline_and_says_so():
    res = invoke("run", str(SCENARIOS / "tiny-cpu.yaml"), "--model", "Qwen3-0.6B", "--gpu", "l4", *SMALL)
    assert res.exit_code == 0, res.output
    out = flat(res.stdout)
    assert "Qwen3-0.6B on l4, vllm" in out and "time model roofline, default efficiencies (uncalibrated)" in out
    assert res.stderr == ""  # its fit was of the linear model: nothing fitted is carried to the L4


@pytest.fixture
def too_big_for_its_devices(tmp_path):
    """The built-in scenario serving Llama-3.1-8B: 4 workers x 15 GiB of weights on the 24 GB card."""
    text = (SCENARIOS / "service-baseline.yaml").read_text()
    text = text.replace("  config: Qwen3-0.6B ", "  config: Llama-3.1-8B ", 1)
    text = text.replace("  kv_bytes_per_token: 114688 ", "  # ", 1).replace("reference: reference/service-baseline.csv\n", "")
    path = tmp_path / "llama.yaml"
    path.write_text(text)
    return path


def test_gpu_rescues_a_scenario_whose_own_devices_do_not_fit(too_big_for_its_devices):
    res = CliRunner().invoke(main, ["run", str(too_big_for_its_devices), *SMALL])
    assert res.exit_code == 1 and res.output.count("\n") == 1
    assert ("device gpu-24gb (rtx-3090, 4 workers): 4 workers x 15 GiB of Llama-3.1-8B weights / tensor_parallel 1 do "
            "not fit its 24 GiB: put fewer workers on it (cluster.deployments), raise its tensor_parallel, or give "
            "--gpu NAME[xTP] to put every worker on a device of its own") in res.output
    assert "(top level)" not in res.output
    res = invoke("run", str(too_big_for_its_devices), "--gpu", "rtx-3090", *SMALL)
    assert res.exit_code == 0, res.output
    assert "Llama-3.1-8B on rtx-3090, vllm 0.31.0" in flat(res.stdout)
    with pytest.raises(ScenarioError, match="put fewer workers on it"):
        load_scenario(too_big_for_its_devices)
    unchecked, _ = load_scenario(too_big_for_its_devices, check_devices=False)
    assert unchecked.with_hardware(hardware="h100-sxm").model.name == "Llama-3.1-8B"


@pytest.mark.parametrize(("args", "message"), [
    (["--model", "Llama-3.1-70B", "--gpu", "l4x4"],
     "l4 TP4: 131 GiB of Llama-3.1-70B weights / tensor_parallel 4 do not fit its 24 GiB: raise tensor_parallel: "
     "--gpu l4x8"),
    (["--model", "Llama-3.1-8B", "--gpu", "rtx-4060-laptopx2"],
     "rtx-4060-laptop TP2: vLLM's memory rule leaves 0 GiB of KV per worker, less than one request's 0.297 GiB (0.92 "
     "x 8 GiB of rtx-4060-laptop - 15 GiB weights / 2 - 0.603 GiB activations - 2 GiB non-torch and CUDA graphs = "
     "-2.72 GiB per GPU, x 2 GPUs): raise tensor_parallel: --gpu rtx-4060-laptopx4; or give --kv-gib"),
])
def test_a_gpu_too_small_suggests_only_what_applies(args, message):
    res = CliRunner().invoke(main, ["run", *args, *SMALL])
    assert res.exit_code == 1 and res.output.count("\n") == 1, res.output
    assert message in res.output
    assert "fewer workers" not in res.output and "(top level)" not in res.output  # --gpu: one device per worker


def test_kv_gib_and_vary_kv_gib_are_one_or_the_other():
    res = CliRunner().invoke(main, ["plan", "capacity", "--vary", "kv-gib", "--target-hit-rate", "0.5", "--kv-gib", "4"])
    assert res.exit_code == 2 and "--kv-gib fixes the GPU KV per worker; --vary kv-gib searches it: give one" in res.output


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_kv_gib_must_be_a_positive_number(value):
    res = CliRunner().invoke(main, ["run", "--kv-gib", value, "--prefixes", "2"])
    assert res.exit_code == 2 and "Traceback" not in res.output and "--kv-gib" in res.output


def test_sweep_and_plan_headers_name_the_setup():
    res = invoke("sweep", "--model", "Llama-3.1-8B", "--gpu", "H100", *SMALL, "--jobs", "1")
    assert res.exit_code == 0, res.output
    out = flat(res.stdout)
    assert "service-baseline: Llama-3.1-8B on h100-sxm, vllm 0.31.0, KV 28,650 blocks/worker (56 GiB, vLLM's rule)" in out
    assert "KV per worker: 56 GiB = 28,650 blocks" in out
    res = invoke("plan", "capacity", "--vary", "kv-gib", "--target-hit-rate", "0.5", "--model", "Qwen3-0.6B", "--gpu",
                 "H100", "--prefixes", "2", "--workers", "2", "--max", "1", "--repeats", "2", "--horizon", "50",
                 "--jobs", "1")
    assert res.exit_code == 0, res.output
    assert "Qwen3-0.6B on h100-sxm, vllm 0.31.0, KV" in flat(res.stdout) and "varied); time model" in flat(res.stdout)


def test_what_the_fit_ran_on_travels_with_the_scenario():
    base, _ = load_scenario()
    moved = base.with_hardware(model="Llama-3.1-8B", hardware="a100-80gb")
    assert moved.calibration.hardware == ["rtx-3090", "rtx-4070-laptop"] and moved.calibration.model == "Qwen3-0.6B"
    assert moved.time_model_origin() == ("roofline, efficiencies fitted to 8 measured points of Qwen3-0.6B on "
                                         "rtx-3090, rtx-4070-laptop")
    assert "applied to a100-80gb" in moved.time_model_warning()
    # moved again, it still names the hardware of the fit, not the A100's
    assert moved.with_hardware(hardware="h100-sxm").calibration.hardware == ["rtx-3090", "rtx-4070-laptop"]
    assert base.time_model_warning() is None
    same = base.with_hardware(model="Qwen3-0.6B")  # the scenario's own devices: the rule, smallest device (rtx-3090 / 4)
    assert same.engine.kv_cache_bytes == same.kv_budget().kv_bytes and same.time_model_warning() is None
    assert same.kv_budget().workers_per_device == 4 and same.kv_budget().hardware == "rtx-3090"
