"""The main job's learning curve reuses the full development-set evaluations of the checkpoints
that are the final models, and the SFT + GRPO row is the checkpoint chosen on the curve's games."""

import json

from evoharness.config import load_config
from evoharness.jsonl import read_jsonl
from evoharness.pipeline import RunConfig, run_pipeline

RUN = ["train_games=6", "dev_games=2", "max_steps=10", "eval_limit=1", "dev_eval_limit=2", "curve_games=1",
       "sft.max_steps=2", "sft.ckpt_every=1", "sft.progress=false", "vocab_size=300", "model_overrides.head_dim=16",
       "rl_screen_games=0", "rl.steps=2", "rl.ckpt_every=1", "rl.max_steps=4", "rl.grpo.group_size=2",
       "rl.grpo.prompts_per_step=1", "rl.grpo.mini_batches=1", "eval_workers=1"]


def test_curve_points_of_the_final_checkpoints_come_from_their_dev_evaluations(tmp_path):
    out = tmp_path / "run"
    run_pipeline(load_config(RunConfig, overrides=[*RUN, f'out_dir="{out}"']), log=lambda m: None)
    curve = json.loads((out / "curve.json").read_text())
    game = curve["game_ids"][0]
    # only the checkpoints that are not final models played the curve game on their own
    assert sorted(p.name for p in (out / "eval" / "curve").iterdir()) == ["rl_00001", "sft_00001"]
    points = {(p["stage"], p["step"]): p["success"] for p in curve["points"]}
    assert set(points) == {("sft", 1), ("sft", 2), ("sft_final", 2), ("rl", 1), ("rl", 2)}
    for key, ev in [(("sft", 2), "dev_sft"), (("rl", 2), "dev_rl_last")]:
        won = {e["task_id"]: e["won"] for e in read_jsonl(out / "eval" / ev / "episodes.jsonl")}
        assert len(won) == 2 and points[key] == 100.0 * won[game]
    # the last RL checkpoint played both panels before the choice; the report's SFT + GRPO is the choice
    sel = curve["rl_selected"]
    expected = {"sft_final": "sft", "rl": "rl_last" if sel["step"] == 2 else "sft_grpo"}[sel["stage"]]
    systems = json.loads((out / "systems.json").read_text())
    assert systems == {"random": "random", "scripted_teacher": "scripted_teacher", "sft": "sft", "sft_grpo": expected}
    assert (out / "eval" / "rl_last" / "summary.json").exists() and (out / "eval" / "dev_rl_last" / "summary.json").exists()
    report = (out / "report.md").read_text()
    assert "| SFT + GRPO |" in report and "eval_rl_last" in report
