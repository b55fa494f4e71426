"""The main job's learning curve reuses the full development-set evaluations of the checkpoints
that are the final models, and the SFT + GRPO row is the checkpoint chosen on the development games."""

import json
from pathlib import Path

from evoharness.config.base import load_config
from evoharness.config.run import RunConfig
from evoharness.files import read_jsonl
from evoharness.pipeline import chosen_rl, run_pipeline, selection_key

RUN = [
    "train_games=6",
    "dev_games=2",
    "max_steps=10",
    "eval_limit=1",
    "dev_eval_limit=2",
    "curve_games=1",
    "sft.max_steps=2",
    "sft.ckpt_every=1",
    "sft.progress=false",
    "vocab_size=300",
    "model_overrides.head_dim=16",
    "rl_screen_games=0",
    "rl.steps=2",
    "rl.ckpt_every=1",
    "rl.max_steps=4",
    "rl.grpo.reward.t_max=4",
    "rl.grpo.group_size=2",
    "rl.grpo.prompts_per_step=1",
    "rl.grpo.mini_batches=1",
    "eval_workers=1",
]


def test_curve_points_of_the_final_checkpoints_come_from_their_dev_evaluations(tmp_path):
    out = tmp_path / "run"
    cfg = load_config(RunConfig, overrides=[*RUN, f'out_dir="{out}"'])
    run_pipeline(cfg, log=lambda m: None)
    curve = json.loads((out / "curve.json").read_text())
    game = curve["game_ids"][0]
    # only the checkpoints that are not final models played the curve game on their own
    assert sorted(p.name for p in (out / "eval" / "curve").iterdir()) == ["rl_00001", "sft_00001"]
    points = {(p["stage"], p["step"]): p["success"] for p in curve["points"]}
    assert set(points) == {("sft", 1), ("sft", 2), ("sft_final", 2), ("rl", 1), ("rl", 2)}
    # RL step 1 played only the curve game, so the curve game chose (the final ones played all dev games)
    assert curve["chosen_on"] == curve["game_ids"]
    assert [p["dev_games"] for p in curve["points"] if "dev_success" in p] == [2, 2, 2]
    for key, ev in [(("sft", 2), "dev_sft"), (("rl", 2), "dev_rl_last")]:
        won = {e["task_id"]: e["won"] for e in read_jsonl(out / "eval" / ev / "episodes.jsonl")}
        assert len(won) == 2 and points[key] == 100.0 * won[game]
    # the last RL checkpoint played both panels before the choice; the report's SFT + GRPO is the choice
    last = out / "rl" / "checkpoints" / "step_0000002"
    assert last.is_dir() and (out / "eval" / "rl_last" / "summary.json").exists()
    systems = json.loads((out / "systems.json").read_text())
    assert systems == {
        "random": "random",
        "scripted_teacher": "scripted_teacher",
        "sft": "sft",
        "sft_grpo": chosen_rl(curve["points"], last)[1],
    }
    report = (out / "report.md").read_text()
    assert "| SFT + GRPO |" in report and "eval_rl_last" in report
    assert "checkpoint best on 1 development games (the curve games)" in report
    # when another model is reported, the report still says what the GRPO stage's last checkpoint did
    won = sum(e["won"] for e in read_jsonl(out / "eval" / "rl_last" / "episodes.jsonl"))
    unchosen = f"The GRPO stage's last checkpoint, not chosen, won {won}/1 valid_seen (+"
    assert (unchosen in report) == (systems["sft_grpo"] != "rl_last")
    # a rerun plays nothing again and reports the same systems
    lines: list[str] = []
    run_pipeline(cfg, log=lines.append)
    chosen = [systems["sft_grpo"]] if systems["sft_grpo"].startswith("rl_step") else []  # played after the choice
    assert [m for m in lines if m.startswith("[eval_")] == [
        f"[eval_{n}] done earlier, skipped" for n in ("random", "scripted_teacher", "sft", "rl_last", *chosen)
    ]
    assert json.loads((out / "systems.json").read_text()) == systems


def test_the_reported_rl_model_is_the_best_on_the_dev_games_rl_then_earliest_on_ties():
    last = Path("rl/checkpoints/step_8")

    def pt(stage, step, minutes, success, path):
        return dict(stage=stage, step=step, minutes=minutes, success=success, path=path)

    sft = pt("sft_final", 2000, 25.0, 90.0, "sft/checkpoints/step_2000")
    rl4, rl8 = pt("rl", 4, 29.0, 95.0, "rl/checkpoints/step_4"), pt("rl", 8, 33.0, 95.0, str(last))
    assert chosen_rl([pt("sft", 1000, 13.0, 99.0, "x"), sft, rl4, rl8], last) == (
        rl4,
        "rl_step4",
    )  # an RL tie: the earlier
    assert chosen_rl([sft, rl4, {**rl8, "success": 100.0}], last) == ({**rl8, "success": 100.0}, "rl_last")
    assert chosen_rl([{**sft, "success": 95.0}, rl4, rl8], last) == (rl4, "rl_step4")  # a tie with SFT: RL
    assert chosen_rl([{**sft, "success": 96.0}, rl4, rl8], last) == ({**sft, "success": 96.0}, "sft")
    # every candidate played the whole development set (the SFT model and the last RL checkpoint by
    # default): that set decides, not the curve's few games
    sft_d, rl8_d = {**sft, "success": 95.0, "dev_success": 88.3}, {**rl8, "success": 90.0, "dev_success": 90.0}
    assert selection_key([sft_d, rl8_d]) == "dev_success"
    assert chosen_rl([sft_d, rl8_d], last) == (rl8_d, "rl_last")
    assert chosen_rl([sft_d, {**rl8_d, "dev_success": 88.3}], last)[1] == "rl_last"  # a tie with SFT: RL
    assert chosen_rl([sft_d, {**rl8_d, "dev_success": 86.7}], last)[1] == "sft"  # SFT only when strictly better
    # a candidate without it (an intermediate checkpoint): the curve games decide, ties to RL, then the earlier
    assert selection_key([sft_d, rl4, rl8_d]) == "success"
    assert chosen_rl([sft_d, rl4, rl8_d], last) == (rl4, "rl_step4")
    assert chosen_rl([{**sft_d, "success": 96.0}, rl4, rl8_d], last) == ({**sft_d, "success": 96.0}, "sft")


def test_an_unchosen_last_rl_checkpoint_is_reported_paired_against_sft(tmp_path):
    from evoharness.pipeline import unchosen_last_rl

    def evals(name: str, won: list[bool]) -> None:
        d = tmp_path / "eval" / name
        d.mkdir(parents=True)
        d.joinpath("episodes.jsonl").write_text(
            "".join(json.dumps({"task_id": f"g{i}", "won": w}) + "\n" for i, w in enumerate(won))
        )

    evals("sft", [True, True, False, True])
    evals("rl_last", [False, True, True, False])
    evals("dev_sft", [True, False])
    evals("dev_rl_last", [True, False])
    assert unchosen_last_rl(tmp_path, "sft") == (
        " The GRPO stage's last checkpoint, not chosen, won 2/4 valid_seen (+1 / -2 against SFT, p = 1) and "
        "1/2 dev (+0 / -0 against SFT, p = 1)."
    )
    assert unchosen_last_rl(tmp_path, "rl_last") == ""  # it is the reported model
    assert unchosen_last_rl(tmp_path / "elsewhere", "sft") == ""  # never evaluated
