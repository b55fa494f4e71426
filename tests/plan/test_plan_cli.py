"""`evoharness plan`, the shipped GPU configs against the hardware they name, and the refusal of
`evoharness rl` / `sft` before anything loads."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from evoharness.cli import app
from evoharness.config.base import ConfigError, load_config
from evoharness.config.rl import RLConfig
from evoharness.plan.host import host_available_gib, preflight
from evoharness.plan.layouts import LAYOUTS
from evoharness.plan.memory import GIB
from evoharness.plan.planner import plan_rl
from evoharness.plan.stage import load_stage_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
H100, H200 = 79.0, 140.4  # GiB: an H100 80GB has ~79.6 (planned with a margin), an H200 140.4

# configs/rl_qwen3_8b.toml as it was before the planner (the settings, not the comments): one 8B
# policy trained with fp32 masters, gradients and AdamW on cuda:0, its bf16 reference on cuda:1
OLD_8B_TOML = """
model_path = ""
steps = 150
data_path = "env"
max_steps = 70
device = "cuda"
dtype = "bfloat16"
ref_device = "cuda:1"
constrained = false
max_new_tokens = 512
max_prompt_tokens = 12288
eval_every = 10
eval_limit = 140
[grpo]
group_size = 8
prompts_per_step = 16
lr = 1e-6
kl_beta = 0.01
micro_batch_size = 2
"""


@pytest.fixture
def old_8b(tmp_path) -> Path:
    p = tmp_path / "rl_qwen3_8b_old.toml"
    p.write_text(OLD_8B_TOML)
    return p


@pytest.mark.parametrize("path", sorted(CONFIGS.glob("rl_*.toml")), ids=lambda p: p.name)
def test_every_shipped_rl_config_loads_as_an_rl_config(path):
    cfg = load_config(RLConfig, path)
    assert load_stage_config(path, []) == cfg


@pytest.mark.parametrize(
    "name, devices, gib, overrides",
    [
        ("rl_qwen3_0.6b_1gpu.toml", 1, H100, []),
        ("rl_qwen3_8b_lora_1gpu.toml", 1, H200, []),
        ("rl_qwen3_8b_lora_1gpu.toml", 1, H100, ["max_prompt_tokens=4096"]),  # its header's H100 line
        ("rl_qwen3_8b_fsdp_8gpu.toml", 8, H200, []),
    ],
)
def test_gpu_configs_fit_the_hardware_their_header_names(name, devices, gib, overrides):
    cfg = load_config(RLConfig, CONFIGS / name, overrides)
    assert cfg.layout in LAYOUTS  # plannable without weights
    plan = plan_rl(cfg, gib, devices)
    assert plan.fits, plan.verdict
    assert plan.needed_devices == devices


def test_the_gpu_configs_do_not_fit_smaller_hardware():
    lora = load_config(RLConfig, CONFIGS / "rl_qwen3_8b_lora_1gpu.toml")
    assert not plan_rl(lora, H100, 1).fits  # the header: an H100 needs activation checkpointing
    fsdp = load_config(RLConfig, CONFIGS / "rl_qwen3_8b_fsdp_8gpu.toml")
    assert not plan_rl(fsdp, H100, 8).fits  # the header: 8x H100 do not hold it
    assert not plan_rl(fsdp, H200, 4).fits  # eight cells, one GPU each


def test_the_old_single_device_8b_config_is_refused_with_its_numbers(old_8b):
    cfg = load_config(RLConfig, old_8b, ['layout="qwen3-8b"'])
    one = plan_rl(cfg, H200, 1)
    assert not one.fits and "2 device(s)" in one.verdict  # its reference sits on cuda:1
    two = plan_rl(cfg, H200, 2)
    assert two.verdict.startswith("does not fit: needs") and "on cuda:0" in two.verdict
    terms = {t.what: t.bytes for t in two.devices[0].owners["cell 0"].terms if t.role == "trainer"}
    P = LAYOUTS["qwen3-8b"].params()
    static = terms["parameters (fp32 masters)"] + terms["gradients (fp32)"] + terms["optimizer state (AdamW m, v)"]
    assert static == 16 * P  # the 131 GB of fp32 masters, gradients and AdamW its header counted
    assert 16 * P < two.devices[0].capacity < two.devices[0].total  # the rest (activations, KV cache) tips it over


def test_plan_cli_prints_the_table_and_the_verdict_with_its_exit_code(old_8b):
    runner = CliRunner()
    cfg = str(CONFIGS / "rl_qwen3_0.6b_1gpu.toml")
    ok = runner.invoke(app, ["plan", "--config", cfg, "--devices", "1", "--device-memory", str(H100)])
    assert ok.exit_code == 0, ok.output
    assert "verdict: fits" in ok.output and "optimizer state (AdamW m, v)" in ok.output and "assumptions:" in ok.output
    small = runner.invoke(app, ["plan", "--config", cfg, "--device-memory", "24", "--set", "grpo.micro_batch_size=4"])
    assert small.exit_code == 1 and "verdict: does not fit: needs" in small.output and "has 24.0 GiB" in small.output
    old = runner.invoke(app, ["plan", "-c", str(old_8b), "--set", 'layout="qwen3-8b"', "--device-memory", str(H200)])
    assert old.exit_code == 1 and "does not fit: needs" in old.output
    layouts = runner.invoke(app, ["plan", "--list-layouts"])
    assert layouts.exit_code == 0 and all(name in layouts.output for name in LAYOUTS)


def test_plan_cli_plans_an_sft_config_on_the_layout_it_names(tmp_path):
    toml = 'device = "cuda"\nbatch_tokens = 16384\nmicro_batch_tokens = 4096\nlayout = "qwen3-4b"\n[shard]\nranks = 4\n'
    (tmp_path / "sft.toml").write_text(toml)
    res = CliRunner().invoke(app, ["plan", "-c", str(tmp_path / "sft.toml"), "--device-memory", "79"])
    assert res.exit_code == 0, res.output
    assert "evoharness sft" in res.output and "/ 4 ranks" in res.output and "cuda:3" in res.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config", "nope.toml"], "config file not found: nope.toml"),
        (["--stage", "rl", "--set", 'layout="qwen3-9b"', "--device-memory", "80"], "unknown layout 'qwen3-9b'"),
        (["--stage", "rl", "--set", 'model_path="/nowhere"', "--device-memory", "80"], "/nowhere/config.json"),
        (["--stage", "rl", "--set", "device=cuda", "--set", 'layout="qwen3-8b"'], "pass --device-memory"),
        (["--set", "layout=qwen3-8b"], "--stage rl|sft"),
        (["--stage", "ppo"], "unknown stage 'ppo'"),
    ],
)
def test_plan_cli_bad_input_is_a_clear_error(args, message, monkeypatch):
    monkeypatch.setattr("evoharness.plan.host.cuda_memory_gib", lambda: [])  # as on a machine without GPUs
    res = CliRunner().invoke(app, ["plan", *args])
    assert res.exit_code == 2 and message in res.output, res.output


def test_no_architecture_names_both_sources():
    with pytest.raises(ValueError, match="config.json does not exist and no layout is set"):
        plan_rl(RLConfig(model_path="/nowhere"), 80.0)
    with pytest.raises(ConfigError, match="neither an RL config"):
        load_stage_config(None, ["vocab_size=300"])


def test_host_ram_is_memavailable(tmp_path):
    (tmp_path / "meminfo").write_text("MemTotal: 25165824 kB\nMemFree: 1024 kB\nMemAvailable: 20971520 kB\n")
    assert host_available_gib(str(tmp_path / "meminfo")) == 20.0


@pytest.fixture
def host_24gib(monkeypatch):
    """This project's CPU box, whatever machine runs the test: 24 GiB of available host RAM."""
    monkeypatch.setattr("evoharness.plan.host.host_available_gib", lambda: 24.0)


def test_rl_refuses_a_run_that_cannot_fit_host_ram_before_loading(old_8b, tmp_path, host_24gib):
    """The old 8B recipe moved to CPU: 8.19B x 16 B alone is over 24 GiB of RAM. The model
    directory does not exist, so anything that tried to load it would fail otherwise."""
    args = ["rl", "-c", str(old_8b), "--model-path", str(tmp_path / "absent"), "--out", str(tmp_path / "out")]
    args += ["--set", 'layout="qwen3-8b"', "--set", 'device="cpu"', "--set", "ref_device=cpu"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 2, res.output
    assert "refused before loading anything" in res.output and "--no-plan-check" in res.output
    assert "host RAM (24.0 GiB)" in res.output and "optimizer state (AdamW m, v)" in res.output
    assert not (tmp_path / "out").exists()


def test_sft_refuses_before_loading_and_no_plan_check_lets_it_start(tmp_path, host_24gib):
    examples = tmp_path / "ex.jsonl"
    examples.write_text('{"messages": [{"role": "user", "content": "hi"}], "completion": "go"}\n')
    args = ["sft", "--examples", str(examples), "--model-path", str(tmp_path / "absent"), "--out", str(tmp_path / "o")]
    refused = CliRunner().invoke(app, [*args, "--set", 'layout="qwen3-8b"'])
    assert refused.exit_code == 2 and "refused before loading anything" in refused.output
    started = CliRunner().invoke(app, [*args, "--set", 'layout="qwen3-8b"', "--no-plan-check"])
    assert started.exit_code != 0 and "refused" not in started.output  # it went on to load the absent model


def test_a_run_that_fits_passes_the_check(model_dir):
    check = preflight(RLConfig(model_path=str(model_dir)))
    assert check.plan is not None and check.plan.fits and not check.refused
    assert check.plan.devices[0].capacity == pytest.approx(host_available_gib() * GIB, rel=0.2)
    skipped = preflight(RLConfig(model_path="/nowhere"))
    assert skipped.plan is None and "no layout" in skipped.skipped  # loading reports the missing model itself


@pytest.mark.skipif(__import__("torch").version.cuda is not None, reason="a CUDA build of torch is installed")
def test_cuda_on_a_cpu_torch_is_one_line_with_the_install(tmp_path):
    from typer.testing import CliRunner

    from evoharness.cli import app

    res = CliRunner().invoke(app, ["rl", "--model-path", str(tmp_path), "--set", "device=cuda"])
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert "needs a CUDA build of torch" in res.output and "download.pytorch.org/whl/cu" in res.output


def test_version_flag():
    from typer.testing import CliRunner

    from evoharness import __version__
    from evoharness.cli import app

    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.startswith(f"evoharness {__version__} (torch ")
