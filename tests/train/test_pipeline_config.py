"""The main job's settings are configs/main_job.toml, which `evoharness run` loads; RunConfig's
Python defaults are the same job, so library users and the command run one configuration."""

from __future__ import annotations

import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

import evoharness.config.run as run_mod
from evoharness.config.base import ConfigError
from evoharness.config.run import MAIN_JOB_TOML, RunConfig, load_run_config


def test_the_toml_is_runconfigs_defaults():
    toml = tomllib.loads(MAIN_JOB_TOML.read_text())
    # validated on its own (no completion from RunConfig()): every main-job value is in the file
    assert RunConfig.model_validate(toml) == RunConfig()
    assert load_run_config() == RunConfig()
    assert load_run_config().model_dump_json() == RunConfig().model_dump_json()  # run_config.json, byte for byte
    # every top-level key is spelled out (TOML has no null: the unset ones are comments)
    unset = {k for k, v in RunConfig().model_dump().items() if v is None}
    assert set(toml) == set(RunConfig.model_fields) - unset
    text = MAIN_JOB_TOML.read_text()
    assert all(f"# {k} = " in text for k in unset)


def test_overrides_and_other_files_keep_the_main_jobs_other_keys(tmp_path):
    cfg = load_run_config(overrides=["sft.lr=1e-3", "dev_games=6"])
    assert cfg == RunConfig().model_copy(
        update={"sft": RunConfig().sft.model_copy(update={"lr": 1e-3}), "dev_games": 6}
    )
    job = tmp_path / "job.toml"
    job.write_text('out_dir = "runs/x"\n[rl.grpo]\ntemperature = 1.0\n')
    cfg = load_run_config(job)
    assert cfg.out_dir == "runs/x" and cfg.rl.grpo.temperature == 1.0
    assert cfg.rl.grpo.model_copy(update={"temperature": 1.5}) == RunConfig().rl.grpo and cfg.sft == RunConfig().sft


def test_a_missing_config_is_an_error_naming_its_path(tmp_path, monkeypatch):
    missing = tmp_path / "configs" / "main_job.toml"
    monkeypatch.setattr(run_mod, "MAIN_JOB_TOML", missing)
    with pytest.raises(ConfigError, match=str(missing)):
        load_run_config()
    with pytest.raises(ConfigError, match="config file not found"):
        load_run_config(tmp_path / "nope.toml")


def test_evoharness_run_loads_the_main_job_from_any_directory(tmp_path, monkeypatch):
    """`evoharness run` with no --config runs configs/main_job.toml of the checkout, whatever the
    working directory; --config FILE runs that file instead."""
    import evoharness.pipeline as pipeline
    from evoharness.cli import app

    seen = []

    def fake_run(cfg, log=print):
        seen.append(cfg)
        report = Path(cfg.out_dir) / "report.md"
        report.parent.mkdir(parents=True, exist_ok=True)
        report.write_text("# report\n")
        return report

    monkeypatch.setattr(pipeline, "run_pipeline", fake_run)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["run", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert seen[-1] == RunConfig(out_dir=str(tmp_path / "run"))
    (tmp_path / "job.toml").write_text("vocab_size = 300\n")
    res = CliRunner().invoke(app, ["run", "--config", "job.toml", "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert seen[-1].vocab_size == 300 and seen[-1].sft == RunConfig().sft
    monkeypatch.setattr(run_mod, "MAIN_JOB_TOML", tmp_path / "gone.toml")
    res = CliRunner().invoke(app, ["run"])
    assert res.exit_code == 2 and "gone.toml" in res.output


def test_the_config_imports_nothing_else_of_the_project():
    code = (
        "import sys, evoharness.config.run; print(sorted(m for m in sys.modules "
        "if m.startswith('evoharness') and not m.startswith('evoharness.config')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == ["evoharness"]


def test_one_device_key_puts_every_stages_model_there_and_the_stage_keys_are_refused(tmp_path):
    from evoharness.pipeline import model_policy, rl_config, sft_config

    cfg = load_run_config(overrides=["device=cuda:1", "dagger_rounds=1", "budget_minutes=20"])
    assert [sft_config(cfg, r).device for r in (0, 1)] == ["cuda:1", "cuda:1"]
    assert sft_config(cfg, 1).max_steps == cfg.dagger_sft_steps and sft_config(cfg, 0).max_minutes == 20 * 0.55 / 2
    assert rl_config(cfg, tmp_path).device == "cuda:1"
    assert model_policy(cfg, tmp_path / "m").device == "cuda:1"
    assert sft_config(RunConfig(), 0).device == rl_config(RunConfig(), tmp_path).device == "cpu"
    for key in ("sft.device", "rl.device"):
        with pytest.raises(ConfigError, match="with `device`"):
            load_run_config(overrides=[f"{key}=cuda"])
