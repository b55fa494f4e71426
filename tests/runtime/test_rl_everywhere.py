"""The main job's RL recipe runs unchanged in process, on 3 cell processes and on 3 Ray actors, and
trains the same weights: mini-batches (two updates per step), the SFT anchor, branch groups, a
sampled subset of turns, T = 1.5, checkpoints every 2 steps, a resume (real games, the micro model)."""

from __future__ import annotations

import json

import pytest
from engines import pick_engine
from rl_cells import EXACT, metrics, rl_config
from safetensors.torch import load_file

from evoharness.config.rl import Branch
from evoharness.config.sft import SFTAnchorConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.factory import make_harness
from evoharness.policies.teacher import TeacherPolicy
from evoharness.recipes.rl import train_rl
from evoharness.rollout.episode import EpisodeSpec, run_episodes

# weights agree to this share of each tensor's move over the run: the cells batch other calls
# together and sum gradients in another order (float noise, amplified by AdamW's 1/sqrt(v))
WEIGHT_TOL = 1e-2
CLOSE = ("train/loss", "train/kl", "train/entropy", "train/grad_norm", "train/anchor_nll")


@pytest.fixture(scope="module")
def main_job_rl(model_dir, teacher_examples, tmp_path_factory):
    """`config(out, **runtime)`: the main job's RL settings (configs/main_job.toml) at test scale."""
    d = tmp_path_factory.mktemp("anchor")
    (d / "sft.jsonl").write_text("".join(json.dumps(x) + "\n" for x in teacher_examples))
    task, game = discover_games("train")[:2]
    (teacher,) = run_episodes(
        [EpisodeSpec(task, "t")],
        lambda t: make_env(t, engine=pick_engine(t)),
        lambda: make_harness(rl_config(model_dir, d).harness),
        TeacherPolicy(),
        max_steps=4,
    )

    def config(out, **runtime):
        cfg = rl_config(model_dir, out, steps=3, **runtime)
        cfg.ckpt_every, cfg.branch_turns, cfg.games = 2, 2, [game.task_id]
        cfg.branches = [Branch(task_id=task.task_id, prefix=[t.completion for t in teacher.turns[:2]])]
        cfg.sft_anchor = SFTAnchorConfig(data_path=str(d / "sft.jsonl"), coef=1.0, batch_tokens=512)
        g = cfg.grpo
        g.mini_batches, g.max_train_turns, g.temperature, g.micro_batch_size = 2, 3, 1.5, 4
        g.reward.div_epochs = 3  # as the main job sets it (unset: the run's steps, 2 before the resume)
        return cfg

    return config


def _check_same(out, final, ref_out, ref_final, model_dir):
    got, want = metrics(out), metrics(ref_out)
    assert [m["step"] for m in got] == [1, 2, 3]
    for a, b in zip(got, want):
        assert {k: a[k] for k in EXACT} == {k: b[k] for k in EXACT}
        assert a["train/updates"] == 2 and a["train/anchor_tokens"] > 0
        for k in CLOSE:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-7), k
    w0, w, ref = (load_file(str(p / "model.safetensors")) for p in (model_dir, final, ref_final))
    for k in ref:
        moved = float((ref[k] - w0[k]).abs().max())
        assert float((w[k] - ref[k]).abs().max()) <= WEIGHT_TOL * moved + 1e-7, k
    assert sorted(p.name for p in (out / "checkpoints").glob("step_*")) == ["step_0000002", "step_0000003"]


@pytest.fixture(scope="module")
def inprocess_run(main_job_rl, tmp_path_factory):
    out = tmp_path_factory.mktemp("inprocess")
    return out, train_rl(main_job_rl(out), progress=False)


def test_three_cell_processes_train_the_inprocess_weights(main_job_rl, inprocess_run, model_dir, tmp_path):
    """3 local cells (colocate, an all-reduce group of 3 replicas) and a resume from step 2."""
    ref_out, ref_final = inprocess_run
    out = tmp_path / "local"
    cfg = main_job_rl(out, schedule="colocate", cells=3, backend="local")
    cfg.steps = 2
    train_rl(cfg, progress=False)
    cfg.steps = 3  # the same run given one more step resumes from its checkpoint
    final = train_rl(cfg, progress=False)
    _check_same(out, final, ref_out, ref_final, model_dir)
    rt = json.loads((out / "runtime.json").read_text())
    assert rt["cells"] == 3 and rt["runtime/aborted_turns"] == 0


def test_three_ray_actors_train_the_inprocess_weights(main_job_rl, inprocess_run, model_dir, tmp_path, ray_head):
    ref_out, ref_final = inprocess_run
    out = tmp_path / "ray"
    final = train_rl(main_job_rl(out, schedule="colocate", cells=3, backend="ray"), progress=False)
    _check_same(out, final, ref_out, ref_final, model_dir)
