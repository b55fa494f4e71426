"""One CLI: collect, distill and sft take --config files that supply every option and --set with
several pairs; the harness recipe travels from the examples to the model `sft` writes."""

import json

from typer.testing import CliRunner

from evoharness.cli import app
from evoharness.config.recipe import read_examples_recipe, read_recipe

runner = CliRunner()


def test_collect_distill_sft_from_config_files(tmp_path, model_dir):
    traces, sft = tmp_path / "teacher.jsonl", tmp_path / "sft.jsonl"
    collect = tmp_path / "collect.toml"
    collect.write_text(
        f'split = "valid_seen"\nper_type = 1\nout = "{traces}"\nsft = "{sft}"\n[harness]\nsystem_prompt = "compact"\n'
    )
    res = runner.invoke(app, ["collect", "--config", str(collect), "--set", "max_steps=40", "batch_size=6"])
    assert res.exit_code == 0, res.output
    assert "played 6" in res.output and sft.is_file()
    assert read_examples_recipe(sft).harness.system_prompt == "compact"

    # distill: the teacher's own trajectories are valid logs; its examples get the recipe too
    distilled = tmp_path / "distilled.jsonl"
    res = runner.invoke(app, ["distill", str(traces), "--out", str(distilled), "--sft", str(tmp_path / "d_sft.jsonl")])
    assert res.exit_code == 0, res.output
    stats = json.loads(res.output[res.output.index("{") :])
    assert stats["episodes"] == 6 and stats["pairs"] > 0
    assert read_examples_recipe(tmp_path / "d_sft.jsonl").harness.kind == "bpe"

    # sft: the file supplies what used to be required options; the model carries the examples' recipe
    job = tmp_path / "sft.toml"
    job.write_text(
        f'examples = "{sft}"\nmodel_path = "{model_dir}"\nout_dir = "{tmp_path / "sft_run"}"\n'
        "threads = 1\nmax_steps = 2\nmax_prompt_tokens = 1024\nprogress = false\n"
    )
    res = runner.invoke(app, ["sft", "--config", str(job), "--no-plan-check", "--set", "batch_tokens=4096", "lr=1e-4"])
    assert res.exit_code == 0, res.output
    recipe = read_recipe(tmp_path / "sft_run" / "final")
    assert recipe.harness.system_prompt == "compact" and recipe.max_prompt_tokens == 1024
    assert json.loads((tmp_path / "sft_run" / "sft_config.json").read_text())["lr"] == 1e-4

    # sft from that model: its recipe's prompt budget is kept unless set, and said so
    res = runner.invoke(
        app,
        ["sft", "--examples", str(sft), "--model-path", str(tmp_path / "sft_run" / "final"), "--out"]
        + [str(tmp_path / "sft2"), "--no-plan-check", "--set", "max_steps=1", "threads=1", "progress=false"],
    )
    assert res.exit_code == 0, res.output
    assert "max_prompt_tokens=1024" in res.output
    assert read_recipe(tmp_path / "sft2" / "final").max_prompt_tokens == 1024


def test_user_errors_are_one_line(tmp_path):
    for args, msg in (
        (["sft", "--no-plan-check"], "examples: required"),
        (["sft", "--examples", str(tmp_path / "none.jsonl"), "--model-path", str(tmp_path)], "not found"),
        (["collect", "--set", "per_tipe=1"], "did you mean 'per_type'"),
        (["collect", "--set", "per_type=1", "stray"], "unexpected argument 'stray'"),
        (["distill"], "logs: give the agent logs"),
        (["distill", str(tmp_path / "absent.jsonl")], "logs file not found"),
        (["eval", "--env", "repo", "--set", "tasks=pack"], "did you mean"),
    ):
        res = runner.invoke(app, args)
        assert res.exit_code == 2 and msg in res.output and "Traceback" not in res.output, (args, res.output)
