"""`evoharness rl --backend ray`: the ALFWorld RL workload on Ray actors that hold a real (micro)
Qwen3 model, a local Ray head on 127.0.0.1 (runs when Ray is installed)."""

from __future__ import annotations

import json

import pytest
from micro_model import build_micro_model_dir
from safetensors.torch import load_file
from typer.testing import CliRunner

from evoharness.cli import app
from evoharness.train.rl import RLConfig, train_rl

ray = pytest.importorskip("ray")

# the in-process loop's per-step numbers a runtime run must reproduce exactly
EXACT = ("success", "reward", "steps_per_episode", "completion_tokens_per_episode", "policy_version",
         "train/n_tokens", "rollout/env_errors")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return build_micro_model_dir(tmp_path_factory.mktemp("micro"))


@pytest.fixture(scope="module")
def ray_head():
    ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", num_cpus=2, log_to_driver=False)
    yield
    ray.shutdown()


def _cfg(model_dir, out, **runtime) -> RLConfig:
    cfg = RLConfig(model_path=str(model_dir), out_dir=str(out), steps=2, max_steps=3, max_new_tokens=12,
                   max_prompt_tokens=512, decode_threads=1, seed=3)
    cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.grpo.lr = 2, 2, 1e-3
    cfg.grpo.temperature, cfg.grpo.micro_batch_size = 1.0, 8
    for k, v in runtime.items():
        setattr(cfg.runtime, k, v)
    return cfg


def _metrics(out):
    return [json.loads(ln) for ln in (out / "metrics.jsonl").read_text().splitlines()]


def test_rl_on_ray_actors_trains_each_episode_once_as_the_inprocess_loop(model_dir, ray_head, tmp_path):
    """elastic on 3 Ray cell actors, 2 steps x 2 games x 2 samples, via the CLI: every
    episode is played and trained once, the weights move, and the steps equal the
    in-process loop's (same episodes, same update) (~40 s, mostly 3 actors importing torch)."""
    ref = tmp_path / "inprocess"
    train_rl(_cfg(model_dir, ref), progress=False)
    out = tmp_path / "ray"
    cfg = _cfg(model_dir, out)
    res = CliRunner().invoke(app, ["rl", "--model-path", str(model_dir), "--out", str(out), "--schedule", "elastic",
                                   "--cells", "3", "--backend", "ray",
                                   *[f"--set={k}={v}" for k, v in (
                                       ("steps", cfg.steps), ("max_steps", cfg.max_steps),
                                       ("max_new_tokens", cfg.max_new_tokens), ("max_prompt_tokens", 512),
                                       ("decode_threads", 1), ("seed", cfg.seed), ("grpo.group_size", 2),
                                       ("grpo.prompts_per_step", 2), ("grpo.lr", 1e-3), ("grpo.temperature", 1.0),
                                       ("grpo.micro_batch_size", 8))]])
    assert res.exit_code == 0, res.output
    rt = json.loads((out / "runtime.json").read_text())
    assert rt["runtime/micro_batches"] == 8 and rt["runtime/aborted_turns"] == 0 and rt["runtime/cells_lost"] == 0
    assert rt["runtime/switches"] > 0                                  # cells changed roles mid-run
    trace = [json.loads(ln) for ln in (out / "runtime" / "trace.jsonl").read_text().splitlines()]
    eids = [t["episode_id"] for t in trace]
    assert len(eids) == 8 == len(set(eids))                           # 2 steps x 4 episodes, each once
    got, want = _metrics(out), _metrics(ref)
    assert [m["step"] for m in got] == [1, 2]
    for a, b in zip(got, want):
        assert {k: a[k] for k in EXACT} == {k: b[k] for k in EXACT}
        assert a["train/grad_norm"] == pytest.approx(b["train/grad_norm"], rel=1e-4)
    w0 = load_file(str(model_dir / "model.safetensors"))
    w, w_ref = load_file(str(out / "final" / "model.safetensors")), load_file(str(ref / "final" / "model.safetensors"))
    moved = max(float((w[k] - w0[k]).abs().max()) for k in w0)
    assert moved > 0                                                    # the two updates changed the weights
    assert all(float((w[k] - w_ref[k]).abs().max()) <= 1e-3 * moved + 1e-7 for k in w_ref)
