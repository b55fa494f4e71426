"""The unseen-room panel (issue 51): bundled train games of whole floor plans (scenes) the main job
never trains, teaches, screens, runs RL or develops on. Every game list the pipeline builds from the
train split, built by the pipeline's own functions on the bundled games, is free of those scenes."""

from __future__ import annotations

import json
import tarfile

import pytest
from panels import play_panel

from evoharness.config.base import load_config
from evoharness.config.run import RunConfig, preset_path
from evoharness.envs.alfworld.games import (
    SCENE_HELDOUT_SPLIT,
    TASK_TYPES,
    count_by_type,
    discover_games,
    scene_of,
    scene_panel_path,
)
from evoharness.files import read_jsonl

# scripts/build_scene_panel.py --seed 0: the 8 floor plans no bundled train game uses, and the
# fewest more (22 bundled train games) for 20 games of every type and 2 floor plans of every room kind
SCENES = {3, 27, 204, 206, 213, 220, 221, 225, 303, 312, 419, 420}


def _configs(tmp_path):
    main = RunConfig(out_dir=str(tmp_path / "main"), threads=None)
    smoke = load_config(RunConfig, preset_path("smoke"), [f'out_dir="{tmp_path / "smoke"}"'])
    smoke = smoke.model_copy(update={"threads": None})  # the test process keeps its torch threads
    return {"main": main, "smoke": smoke}


def test_the_panel_is_20_games_of_each_type_from_the_held_out_scenes_and_plays():
    from evoharness.envs.alfworld import make_env
    from evoharness.pipeline import heldout_scenes

    panel = discover_games(SCENE_HELDOUT_SPLIT)
    assert len(panel) == 120 and count_by_type(panel) == dict.fromkeys(TASK_TYPES, 20)
    assert {scene_of(t.task_id) for t in panel} == SCENES == heldout_scenes(RunConfig())
    # every room kind in two floor plans or more (kitchens 1-30, living rooms, bedrooms, bathrooms)
    for kind in (0, 2, 3, 4):
        assert len({s for s in SCENES if s // 100 == kind}) >= 2
    # the build script's record, shipped inside the archive, agrees with the games
    with tarfile.open(scene_panel_path()) as tf:
        info = json.load(tf.extractfile(f"json_2.1.1/{SCENE_HELDOUT_SPLIT}/scene_heldout.json"))
    assert info["games"] == [t.task_id for t in panel] and set(info["scenes"]) == SCENES
    assert info["pack_train_games_dropped"] == 22
    # a game loads and plays on the fast engine, with a custom data path too (the panel is bundled)
    task = next(t for t in panel if t.task_type == "pick_heat_then_place_in_recep")
    first = make_env(task, engine="fast").reset()
    assert "You are in the middle of a room" in first.observation and first.admissible_commands
    assert first.goal.startswith("heat") and not first.done
    assert discover_games(SCENE_HELDOUT_SPLIT, "bundled")[0].task_id == panel[0].task_id


@pytest.mark.parametrize("preset", ["main", "smoke"])
def test_no_held_out_scene_is_trained_taught_screened_rl_or_dev(tmp_path, monkeypatch, preset):
    import evoharness.pipeline as pipeline
    from evoharness.config.rl import Branch
    from evoharness.recipes.alfworld import branch_starts, train_tasks

    cfg = _configs(tmp_path)[preset]
    train_split = discover_games(cfg.train_split)
    held = [t.task_id for t in train_split if scene_of(t.task_id) in SCENES]
    assert len(held) == 22 and sorted(pipeline.unseen_room_games(cfg)) == sorted(held)

    def clean(ids, what):
        bad = sorted(i for i in ids if scene_of(i) in SCENES)
        assert not bad, f"{preset}: {what} holds unseen-room games {bad[:3]}"

    # training and development games (collection / teacher traces and DAgger play job.train_tasks)
    job = pipeline.start_job(cfg, lambda m: None)
    clean([t.task_id for t in job.train_tasks], "training games")
    clean(job.dev_ids, "development games")
    assert len(job.dev_ids) == cfg.dev_games
    if preset == "main":  # every other train game is trained on: only the held-out scenes' games are missing
        assert len(job.train_tasks) == len(train_split) - len(held) - cfg.dev_games == 518
    assert json.loads((tmp_path / preset / "unseen_games.json").read_text())["scenes"] == sorted(SCENES)

    # RL screening: the games the SFT model would play (the evaluation itself replaced by one that loses all)
    played: list[str] = []

    def fake_evaluate(ecfg, **kw):
        played.extend(ecfg.games)
        d = tmp_path / preset / "eval" / "rl_screen"
        d.mkdir(parents=True, exist_ok=True)
        (d / "episodes.jsonl").write_text("".join(json.dumps({"task_id": g, "won": False}) + "\n" for g in ecfg.games))

    monkeypatch.setattr(pipeline, "evaluate", fake_evaluate)
    screened = pipeline.screen_rl_games(cfg, tmp_path / preset, cfg.rl_screen_games)
    assert len(played) == min(cfg.rl_screen_games, len(job.train_tasks))
    clean(played, "screened games")
    clean(screened["games"], "RL games")

    # RL: every game it may train on (no screening: the whole split less what it excludes), and a
    # held-out game named as an RL game or branch is refused
    rl_cfg = pipeline.rl_config(cfg, tmp_path / preset)
    clean([t.task_id for t in train_tasks(rl_cfg)], "RL's trainable games")
    assert set(held) <= set(rl_cfg.exclude_games)
    with pytest.raises(ValueError, match="not trainable"):
        train_tasks(rl_cfg.model_copy(update={"games": held[:1]}))
    with pytest.raises(ValueError, match="not trainable"):
        branch_starts(rl_cfg.model_copy(update={"branches": [Branch(task_id=held[0], prefix=["look"])]}))

    # without a panel nothing is held out (the previous behaviour)
    none = load_config(RunConfig, preset_path("smoke") if preset == "smoke" else None, ["unseen_split="])
    assert pipeline.heldout_scenes(none) == set() and pipeline.unseen_panel(none) == []
    assert len(pipeline.dev_split(none)[0]) == (cfg.train_games or len(train_split) - cfg.dev_games)


def test_the_teacher_wins_the_smoke_sized_panel(tmp_path):
    """The job's evaluation of the unseen-room panel, at the smoke preset's size (eval_limit 6,
    round-robin across types), with the scripted teacher."""
    from evoharness.eval.evaluate import evaluate
    from evoharness.harness.bpe import ExperienceStore
    from evoharness.pipeline import eval_config, unseen_panel

    cfg = _configs(tmp_path)["smoke"]
    games = unseen_panel(cfg)
    assert len(games) == 6 and {g.split("-")[0] for g in games} == set(TASK_TYPES)
    ExperienceStore().save(tmp_path / "experience.json")  # an empty store: the teacher starts from nothing
    ecfg = eval_config(
        cfg, tmp_path, "unseen_teacher", cfg.teacher, tmp_path / "experience.json", split=cfg.unseen_split
    )
    assert ecfg.split == SCENE_HELDOUT_SPLIT and ecfg.games == games
    s = evaluate(ecfg.model_copy(update={"workers": 1}), progress=False)
    assert s["overall"]["won"] == 6
    assert [e["task_id"] for e in read_jsonl(tmp_path / "eval" / "unseen_teacher" / "episodes.jsonl")] == games


def test_the_report_shows_the_panel_its_paired_test_and_the_seen_unseen_gap(tmp_path):
    from evoharness.eval.report import wilson_interval
    from evoharness.eval.run_report import gap_interval, paired, write_run_report
    from evoharness.pipeline import balanced_subset

    # two real systems that differ per game: an 8-step cap makes the noisy expert lose some
    noisy, expert = {"kind": "noisy_expert", "epsilon": 0.6, "seed": 1}, {"kind": "expert"}
    names = {"SFT": noisy, "SFT + GRPO": expert}
    panels = {
        "vs": ("valid_seen", balanced_subset("valid_seen", None, 4)),
        "dev": ("train", [t.task_id for t in discover_games("train") if scene_of(t.task_id) not in SCENES][:4]),
        "unseen": (SCENE_HELDOUT_SPLIT, balanced_subset(SCENE_HELDOUT_SPLIT, None, 6)),
    }
    dirs = {
        p: {n: play_panel(tmp_path, f"{p}_{n[-4:]}", games, pol, split) for n, pol in names.items()}
        for p, (split, games) in panels.items()
    }
    md = write_run_report(tmp_path / "run", dirs["vs"], dirs["dev"], [], None, [], unseen=dirs["unseen"]).read_text()
    eps = {p: {n: read_jsonl(d / "episodes.jsonl") for n, d in ds.items()} for p, ds in dirs.items()}
    u = paired(eps["unseen"]["SFT"], eps["unseen"]["SFT + GRPO"])
    assert f"| SFT + GRPO vs SFT | unseen rooms | 6 | {u['b_only']} | {u['a_only']} | {u['both']} |" in md
    assert "| SFT + GRPO vs SFT | valid_seen + dev + unseen rooms | 14 |" in md
    assert "| system | valid_seen | dev | unseen rooms | stopped early (valid_seen / dev / unseen) |" in md
    # success with Wilson intervals on both panels, and the gap between them
    won_s, won_u = (sum(e["won"] for e in eps[p]["SFT"]) for p in ("vs", "unseen"))
    (ls, hs), (lu, hu) = wilson_interval(won_s, 4), wilson_interval(won_u, 6)
    gap, lo, hi = gap_interval(won_s, 4, won_u, 6)
    assert (
        f"| SFT | {round(100 * won_s / 4, 1)}% [{ls:.1f}, {hs:.1f}] ({won_s}/4) | "
        f"{round(100 * won_u / 6, 1)}% [{lu:.1f}, {hu:.1f}] ({won_u}/6) | {gap:+.1f} [{lo:+.1f}, {hi:+.1f}] |"
    ) in md
    assert "![unseen rooms](unseen_success.png)" in md and (tmp_path / "run" / "unseen_success.png").is_file()
    # a GRPO checkpoint chosen on the development and unseen-room games together: both rows say so, and
    # only valid_seen is left for a test (no pooled row)
    curve = {
        "games": 1,
        "game_ids": panels["dev"][1][:1],
        "points": [],
        "rl_selected": {"stage": "rl", "step": 8},
        "chosen_on": panels["dev"][1] + panels["unseen"][1],
    }
    md = write_run_report(tmp_path / "run2", dirs["vs"], dirs["dev"], [], None, [], curve=curve, unseen=dirs["unseen"])
    md = md.read_text()
    assert "| SFT + GRPO vs SFT | dev (chose the checkpoint) | 4 |" in md
    assert "| SFT + GRPO vs SFT | unseen rooms (chose the checkpoint) | 6 |" in md
    assert "valid_seen + " not in md.split("### Cost of won episodes")[0]  # the success tests' table
    # chosen on the dev games alone: the unseen-room games join valid_seen in the pooled test
    curve["chosen_on"] = panels["dev"][1]
    md = write_run_report(tmp_path / "run3", dirs["vs"], dirs["dev"], [], None, [], curve=curve, unseen=dirs["unseen"])
    assert "| SFT + GRPO vs SFT | valid_seen + unseen rooms | 10 |" in md.read_text()


def test_the_checkpoint_is_chosen_on_seen_and_unseen_room_development_games_together():
    from pathlib import Path

    from evoharness.pipeline import chosen_rl, selection_key

    last = Path("rl/checkpoints/step_8")
    sft = dict(stage="sft_final", step=2000, minutes=25.0, success=90.0, path="sft/final", dev_success=95.0)
    rl = dict(stage="rl", step=8, minutes=33.0, success=90.0, path=str(last), dev_success=93.3)
    assert chosen_rl([sft, rl], last)[1] == "sft"  # the dev games alone keep SFT
    # 57/60 + 100/120 against 56/60 + 106/120: the unseen-room games turn it
    sft_m, rl_m = {**sft, "mix_success": 87.2}, {**rl, "mix_success": 90.0}
    assert selection_key([sft_m, rl_m]) == "mix_success"
    assert chosen_rl([sft_m, rl_m], last) == (rl_m, "rl_last")
    assert selection_key([sft_m, rl]) == "dev_success"  # a candidate without the panel: the dev games decide


def test_a_job_started_before_the_floor_plans_were_held_out_is_not_resumed(tmp_path):
    """Its finished stages trained on the unseen-room floor plans (an older run_config.json has no
    ``unseen_split`` to compare): the development set it wrote differs, and the rerun is refused."""
    from evoharness.pipeline import start_job

    old = RunConfig(out_dir=str(tmp_path), threads=None, unseen_split="")
    start_job(old, lambda m: None)
    (tmp_path / ".collect.done").write_text("1")
    start_job(old, lambda m: None)  # the same job resumes
    saved = json.loads((tmp_path / "run_config.json").read_text())
    del saved["unseen_split"]
    (tmp_path / "run_config.json").write_text(json.dumps(saved))
    with pytest.raises(ValueError, match="another development set"):
        start_job(old.model_copy(update={"unseen_split": SCENE_HELDOUT_SPLIT}), lambda m: None)
