"""The RL loop end to end on real games with a real (micro) Qwen3 model:
metrics, checkpoints, and exact resume after a crash mid-step."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from evoharness.config.rl import RLConfig
from evoharness.envs.alfworld.games import discover_games
from evoharness.recipes import alfworld as rl_mod
from evoharness.recipes.rl import train_rl
from evoharness.train import step as train_step


def _cfg(model_dir, out, steps):
    cfg = RLConfig(
        model_path=str(model_dir),
        out_dir=str(out),
        steps=steps,
        max_steps=4,
        max_new_tokens=12,
        max_prompt_tokens=512,
        decode_threads=1,
        seed=3,
    )
    cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.grpo.lr = 2, 2, 1e-3
    cfg.grpo.temperature, cfg.grpo.micro_batch_size = 1.0, 8
    return cfg


def _strip(rec):
    return {k: v for k, v in rec.items() if not k.startswith("timing_s")}


def test_rl_runs_logs_and_resumes_exactly(model_dir, tmp_path, monkeypatch):
    ref = train_rl(_cfg(model_dir, tmp_path / "a", 3), progress=False)
    metrics = [json.loads(ln) for ln in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for key in (
        "success",
        "reward",
        "reward/total",
        "reward/invalid",
        "train/kl",
        "train/clip_fraction",
        "train/grad_norm",
        "harness/recall_per_episode",
        "timing_s/gen",
        "timing_s/env",
        "timing_s/train",
        "adv/signal_groups",
        "adv/std_floor_groups",
    ):
        assert key in metrics[0], key
    assert metrics[0]["train/n_tokens"] > 0
    assert metrics[-1]["policy_version"] == 3
    assert (ref / "experience.json").is_file()
    report = (tmp_path / "a" / "report.md").read_text()
    assert "Advantage std floor: acted in" in report
    assert "3 steps. Training success" in report and (tmp_path / "a" / "rl_curves.png").stat().st_size > 1000

    # Crash inside step 3, after its rollout and before its update.
    real_step, calls = train_step.run_updates, []

    def crashing(*a, **kw):
        calls.append(1)
        if len(calls) == 3:  # step 3's update
            raise RuntimeError("killed mid-step")
        return real_step(*a, **kw)

    monkeypatch.setattr(train_step, "run_updates", crashing)
    with pytest.raises(RuntimeError, match="killed mid-step"):
        train_rl(_cfg(model_dir, tmp_path / "b", 3), progress=False)
    before = [json.loads(ln) for ln in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in before] == [1, 2]  # completed steps are kept
    monkeypatch.setattr(train_step, "run_updates", real_step)
    resumed = train_rl(_cfg(model_dir, tmp_path / "b", 3), progress=False)

    after = [json.loads(ln) for ln in (tmp_path / "b" / "metrics.jsonl").read_text().splitlines()]
    assert [_strip(m) for m in after] == [_strip(m) for m in metrics]
    wa, wb = load_file(str(ref / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert json.loads((ref / "experience.json").read_text()) == json.loads((resumed / "experience.json").read_text())


def test_resume_refuses_another_runs_checkpoints(model_dir, tmp_path):
    """Fault 7's kind (review): rerunning `rl` into an out dir that holds another run's checkpoints
    (another learning rate, model or recipe) trained on from them silently; now it names the
    difference. Extending the same run (more steps) still resumes."""
    train_rl(_cfg(model_dir, tmp_path / "a", 1), progress=False)
    other = _cfg(model_dir, tmp_path / "a", 1)
    other.grpo.lr = 5e-4
    with pytest.raises(ValueError, match=r"grpo.lr: 0.001 -> 0.0005"):
        train_rl(other, progress=False)
    train_rl(_cfg(model_dir, tmp_path / "a", 2), progress=False)
    steps = [json.loads(ln)["step"] for ln in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]


def test_rl_needs_a_model():
    with pytest.raises(ValueError, match="model_path"):
        train_rl(RLConfig(model_path=""), progress=False)


def test_task_type_filter_and_spread_evaluation():
    tasks = discover_games("valid_seen")
    picked = rl_mod.select_tasks(tasks, ["pick_and_place_simple", "look_at_obj_in_light"])
    assert len(picked) == 35 + 13 and {t.task_type for t in picked} == {"pick_and_place_simple", "look_at_obj_in_light"}
    assert rl_mod.select_tasks(tasks, None) == tasks
    with pytest.raises(ValueError, match="pick_and_place"):
        rl_mod.select_tasks(tasks, ["pick_and_place"])  # a typo must not train on nothing
    spread = rl_mod.spread(tasks, 12)
    assert len(spread) == 12 and len({t.task_type for t in spread}) == 6
    assert rl_mod.spread(tasks, None) == tasks
    look = rl_mod.select_tasks(tasks, ["look_at_obj_in_light"])
    cfg = RLConfig(split="valid_seen", task_types=["look_at_obj_in_light"], exclude_games=[look[3].task_id])
    kept = rl_mod.train_tasks(cfg)  # the main job's development games are never trained on
    assert kept == look[:3] + look[4:]
    cfg.games = [look[5].task_id, look[1].task_id]  # the main job's screened games: only these, in split order
    assert rl_mod.train_tasks(cfg) == [look[1], look[5]]
    other = next(t for t in tasks if t.task_type != "look_at_obj_in_light")
    for bad in ([look[3].task_id], [other.task_id], ["no-such-game"]):  # excluded, other type, unknown
        cfg.games = bad
        with pytest.raises(ValueError, match="not trainable games"):
            rl_mod.train_tasks(cfg)


def test_unconstrained_rl_trains_and_reports_the_invalid_term(model_dir, tmp_path):
    """constrained=false: free decoding on a random model mostly fails the format, so the reward's
    invalid-action term is exercised, logged and reported; turns carry no constraint."""
    cfg = _cfg(model_dir, tmp_path / "u", 1)
    cfg.constrained = False
    train_rl(cfg, progress=False)
    rec = json.loads((tmp_path / "u" / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["constrained"] is False and rec["invalid_per_episode"] > 0
    assert rec["reward/invalid"] == pytest.approx(-cfg.grpo.reward.lambda_inv * rec["invalid_per_episode"])
    assert rec["train/n_tokens"] > 0 and rec["train/forced_fraction"] == 0.0
    report = (tmp_path / "u" / "report.md").read_text()
    assert "decoding unconstrained" in report and "invalid/ep" in report


def test_gigpo_run_logs_and_reports_the_step_level_std_floor(model_dir, tmp_path):
    """GiGPO in the real loop: the step-level floor counts reach metrics.jsonl and report.md."""
    cfg = _cfg(model_dir, tmp_path / "g", 1)
    cfg.grpo.advantage.estimator = "gigpo"
    train_rl(cfg, progress=False)
    rec = json.loads((tmp_path / "g" / "metrics.jsonl").read_text().splitlines()[0])
    assert rec["adv/step_groups"] >= 1 and 0 <= rec["adv/step_floor_groups"] <= rec["adv/step_groups"]
    report = (tmp_path / "g" / "report.md").read_text()
    assert f"acted in {rec['adv/step_floor_groups']} of {rec['adv/step_groups']} anchor-state groups" in report


def test_rl_and_its_evaluation_play_the_configured_wording(model_dir, tmp_path, monkeypatch):
    """Fault 6's kind (review): the main job's `env.wording` reaches RL (it played native wording
    while collect, SFT and eval used the configured one); rollouts and the periodic evaluation
    play real games in that wording."""
    from evoharness.pipeline import RunConfig, rl_config

    assert rl_config(RunConfig(env={"wording": "move"}), tmp_path).wording == "move"
    played, real_make_env = [], rl_mod.make_env

    def make_env(task, **kw):  # the real env; note the wording it plays
        env = real_make_env(task, **kw)
        played.append(env.wording)
        return env

    monkeypatch.setattr(rl_mod, "make_env", make_env)  # rollouts and the periodic evaluation
    cfg = _cfg(model_dir, tmp_path / "w", 1)
    cfg.wording, cfg.eval_every, cfg.eval_limit = "move", 1, 2
    train_rl(cfg, progress=False)
    n = cfg.grpo.group_size * cfg.grpo.prompts_per_step
    assert played == ["move"] * (n + 2)


def test_periodic_evaluation_changes_no_training_state(model_dir, tmp_path):
    """Issue 10 fault 3: the same run with an evaluation after every step trains exactly like the
    run without: same metrics, weights, and experience store (the evaluation's own notes,
    pickups and use counts are buffered in a copy and dropped)."""
    plain = train_rl(_cfg(model_dir, tmp_path / "plain", 2), progress=False)
    cfg = _cfg(model_dir, tmp_path / "eval", 2)
    cfg.eval_every, cfg.eval_limit, cfg.eval_split = 1, 3, "valid_seen"
    evald = train_rl(cfg, progress=False)

    def metrics(run):
        return [json.loads(ln) for ln in (tmp_path / run / "metrics.jsonl").read_text().splitlines()]

    with_eval = metrics("eval")
    assert all(m["eval/n"] == 3 for m in with_eval)
    assert sum(m["eval/experience_writes_dropped"] for m in with_eval) > 0  # the evaluation did write: to its copy
    strip = lambda ms: [{k: v for k, v in _strip(m).items() if not k.startswith("eval/")} for m in ms]  # noqa: E731
    assert strip(with_eval) == strip(metrics("plain"))
    wa, wb = load_file(str(plain / "model.safetensors")), load_file(str(evald / "model.safetensors"))
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert json.loads((plain / "experience.json").read_text()) == json.loads((evald / "experience.json").read_text())
