"""Issue 10 fault 8: state that drifts between stages and within a GRPO step.

- the experience store's epoch continues from collect into RL (never back to 0);
- GRPO mini-batches keep real groups whole when a trajectory has no trainable turn;
- config fields nothing reads are rejected, not silently accepted.
"""

from __future__ import annotations

import json

import pytest

from evoharness.config.base import ConfigError, load_config
from evoharness.config.rl import GRPOConfig, RLConfig
from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import discover_games
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.policies.local import LocalHFPolicy
from evoharness.policies.scripted import ExpertPolicy
from evoharness.recipes.rl import train_rl
from evoharness.rollout.collect import collect_traces
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.train.step import mini_batch_slices, plan_updates, turn_rows


def test_experience_epoch_continues_from_collect_into_rl(model_dir, tmp_path):
    exp = tmp_path / "experience.json"
    stats = collect_traces(
        discover_games("train")[:6],
        ExpertPolicy(),
        lambda store: BPEHarness(store),
        lambda task: make_env(task, engine="fast"),
        tmp_path / "traces.jsonl",
        max_steps=30,
        batch_size=2,
        experience_path=exp,
        progress=False,
    )
    collected = json.loads(exp.read_text())["epoch"]
    assert stats.batches == 3 and collected == 3
    cfg = RLConfig(
        model_path=str(model_dir),
        out_dir=str(tmp_path / "rl"),
        steps=2,
        max_steps=3,
        max_new_tokens=12,
        max_prompt_tokens=512,
        decode_threads=1,
    )
    cfg.harness.experience_path = str(exp)
    cfg.grpo.group_size, cfg.grpo.prompts_per_step = 2, 1
    final = train_rl(cfg, progress=False)
    metrics = [json.loads(ln) for ln in (tmp_path / "rl" / "metrics.jsonl").read_text().splitlines()]
    assert [m["experience_epoch"] for m in metrics] == [collected + 1, collected + 2]
    assert json.loads((final / "experience.json").read_text())["epoch"] == collected + 2

    store = ExperienceStore.load(exp)
    with pytest.raises(ValueError, match="backwards"):
        store.consolidate(epoch=0)


def test_rl_with_consolidation_off_keeps_the_store_it_started_from(model_dir, tmp_path):
    """`consolidate_experience=False`: the rollouts' use counts (and any notes or pickups) are
    dropped at each step, so the final store's entries are the starting store's; with it on
    (the default) the same run changes them."""
    exp = tmp_path / "experience.json"
    collect_traces(
        discover_games("train")[:4],
        ExpertPolicy(),
        lambda store: BPEHarness(store),
        lambda task: make_env(task, engine="fast"),
        tmp_path / "traces.jsonl",
        max_steps=30,
        batch_size=2,
        experience_path=exp,
        progress=False,
    )
    start = json.loads(exp.read_text())["entries"]
    finals = {}
    for on in (False, True):
        cfg = RLConfig(
            model_path=str(model_dir),
            out_dir=str(tmp_path / f"rl_{on}"),
            steps=2,
            max_steps=3,
            max_new_tokens=12,
            max_prompt_tokens=512,
            decode_threads=1,
            consolidate_experience=on,
        )
        cfg.harness.experience_path = str(exp)
        cfg.grpo.group_size, cfg.grpo.prompts_per_step = 2, 1
        finals[on] = json.loads((train_rl(cfg, progress=False) / "experience.json").read_text())
        assert finals[on]["pending"] == []
    assert finals[False]["entries"] == start
    assert finals[True]["entries"] != start


def test_mini_batches_keep_groups_whole_when_a_game_fails_to_load(model_dir):
    tasks = discover_games("train")[:3]
    broken = f"{tasks[0].task_id}#1"  # the second sample of group 0 never loads

    def env_for(spec_ids):
        def make(task):
            if next(spec_ids) == broken:
                raise FileNotFoundError("game file vanished")
            return make_env(task, engine="fast")

        return make

    specs = [EpisodeSpec(t, f"{t.task_id}#{k}", 0) for t in tasks for k in range(2)]
    policy = LocalHFPolicy(
        model_dir, temperature=1.0, constrained=True, max_new_tokens=12, max_prompt_tokens=512, num_threads=1
    )
    store = ExperienceStore()
    store.freeze()
    trajs = run_episodes(
        specs, env_for(iter(s.episode_id for s in specs)), lambda: BPEHarness(store), policy, max_steps=2
    )
    assert trajs[1].stop_reason == "error" and not trajs[1].turns
    # each trajectory's rows carry its GRPO group (as `recipes.alfworld.AlfworldWorkload` deals them)
    samples = [r for i, t in enumerate(trajs) for r in turn_rows(t, [0.5] * t.steps, GRPOConfig(), 0, group=i // 2)]
    assert {s.episode_id: s.group for s in samples} == {
        specs[0].episode_id: 0,
        specs[2].episode_id: 1,
        specs[3].episode_id: 1,
        specs[4].episode_id: 2,
        specs[5].episode_id: 2,
    }
    slices = mini_batch_slices(samples, 2)
    assert [{s.group for s in sl} for sl in slices] == [{0, 2}, {1}]
    # every group sits in exactly one slice, whole
    for g in (0, 1, 2):
        owners = [i for i, sl in enumerate(slices) if any(s.group == g for s in sl)]
        assert len(owners) == 1
        assert {s.episode_id for s in slices[owners[0]] if s.group == g} == {
            s.episode_id for s in samples if s.group == g
        }
    # the step's updates: 2 epochs over those slices, token weights 1/(M·N_j) over each slice
    updates = plan_updates(samples, GRPOConfig(mini_batches=2, epochs=2))
    assert [[id(s) for s in u] for u in updates] == [[id(s) for s in sl] for sl in slices] * 2
    for u in updates:
        per_episode: dict[str, float] = {}
        for s in u:
            per_episode[s.episode_id] = per_episode.get(s.episode_id, 0.0) + s.weight * len(s.completion_ids)
        assert sum(per_episode.values()) == pytest.approx(1.0)
        assert all(w == pytest.approx(1 / len(per_episode)) for w in per_episode.values())
    # Without group ids the old rule (cut by position, group_size rows apart) would shift every later
    # group boundary past the missing trajectory: rows without their group are refused instead.
    for s in samples:
        s.group = None
    with pytest.raises(ValueError, match="GRPO group"):
        mini_batch_slices(samples, 2)
    assert mini_batch_slices(samples, 1) == [samples]  # one mini-batch needs no groups


@pytest.mark.parametrize("key", ["grpo.ppo_epochs=3", "grpo.max_prompt_tokens=1024", "grpo.max_response_tokens=64"])
def test_unread_config_fields_are_rejected(key):
    with pytest.raises(ConfigError, match=key.split("=")[0]):
        load_config(RLConfig, overrides=[key])


@pytest.mark.parametrize("name", ["rl_cpu.toml", "rl_qwen3_8b_fsdp_8gpu.toml"])
def test_shipped_rl_configs_load(name):
    from pathlib import Path

    cfg = load_config(RLConfig, Path(__file__).resolve().parents[2] / "configs" / name)
    assert cfg.max_prompt_tokens > 0 and cfg.max_new_tokens > 0
