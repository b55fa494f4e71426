"""A served model's default name comes from its path, not the generic last directory every run
writes (`final`, `step_8`): two models served side by side are told apart."""

from evoharness.runtime.gateway import model_name


def test_generic_run_directories_take_their_run_name(tmp_path):
    assert model_name(tmp_path / "smoke" / "rl" / "final") == "smoke-rl-final"
    assert model_name(tmp_path / "main" / "rl" / "checkpoints" / "step_8") == "main-rl-checkpoints-step_8"
    assert model_name(tmp_path / "sft" / "final") == f"{tmp_path.name}-sft-final"


def test_a_named_model_directory_keeps_its_name(tmp_path):
    assert model_name(tmp_path / "models" / "Qwen3-8B") == "Qwen3-8B"
