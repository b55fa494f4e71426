"""Issue 12 item 6: ALFWorld through the gateway plays the same trajectories as in-process."""

from __future__ import annotations

import pytest
import torch

from evoharness.config.policy import PolicyConfig
from evoharness.envs.alfworld import make_env
from evoharness.harness.bpe import BPEHarness, ExperienceStore
from evoharness.policies.factory import make_policy
from evoharness.rollout.episode import EpisodeSpec, run_episodes
from evoharness.runtime.backends import LocalBackend
from evoharness.runtime.gateway import Gateway


def play(policy, tasks, seed):
    specs = [EpisodeSpec(t, f"{t.task_id}#0", seed) for t in tasks]
    return run_episodes(
        specs, lambda task: make_env(task, engine="fast"), lambda: BPEHarness(ExperienceStore()), policy, max_steps=4
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_same_trajectories_in_process_and_through_gateway(gw_model_dir, serve, one_per_type, temperature):
    tasks = one_per_type[:3]
    common = dict(temperature=temperature, max_tokens=32, constrained=True, seed=7, max_prompt_tokens=2048)
    local = make_policy(PolicyConfig(kind="hf", model_path=str(gw_model_dir), num_threads=1, **common))
    srv = serve(Gateway([LocalBackend.from_model_path(gw_model_dir, name="engine")], served_model="micro"))
    remote = make_policy(PolicyConfig(kind="openai", base_url=srv.url, model="micro", **common))
    try:
        ref, got = play(local, tasks, 7), play(remote, tasks, 7)
    finally:
        remote.close()
    kinds = set()
    for a, b in zip(ref, got):
        assert (a.episode_id, a.won, a.stop_reason, a.steps) == (b.episode_id, b.won, b.stop_reason, b.steps)
        for ta, tb in zip(a.turns, b.turns):
            assert (ta.completion, ta.kind, ta.action, ta.feedback) == (tb.completion, tb.kind, tb.action, tb.feedback)
            assert ta.prompt_token_ids == tb.prompt_token_ids and ta.completion_token_ids == tb.completion_token_ids
            assert torch.allclose(torch.tensor(ta.logprobs), torch.tensor(tb.logprobs), atol=1e-4)
            assert ta.policy_version == tb.policy_version == 0 and tb.error is None
            assert tb.constraint == ta.constraint and tb.constraint["commands"] == ta.admissible_commands
            kinds.add(ta.kind)
    assert kinds - {"invalid"}  # the grammar made the random model act
    # the gateway recorded each turn under its episode id, tokens as the trajectory has them
    for traj in got:
        recs = srv.gateway.records.read(traj.episode_id)
        assert [r.completion_token_ids for r in recs] == [t.completion_token_ids for t in traj.turns]
        assert [r.prompt_token_ids for r in recs] == [t.prompt_token_ids for t in traj.turns]


def test_rl_rollouts_through_the_gateway_follow_live_weights(gw_model_dir, one_per_type):
    """The RL pattern: sample through the gateway, update the weights in place, sample again."""
    from evoharness.policies.local import LocalHFPolicy
    from evoharness.runtime.gateway import served_policy

    tasks = one_per_type[3:5]
    policy = LocalHFPolicy(
        gw_model_dir,
        temperature=1.0,
        max_new_tokens=24,
        max_prompt_tokens=1024,
        constrained=True,
        seed=3,
        num_threads=1,
    )
    with served_policy(policy) as remote:
        for version in (0, 1):
            ref, got = play(policy, tasks, 3), play(remote, tasks, 3)
            for a, b in zip(ref, got):
                assert [t.completion_token_ids for t in a.turns] == [t.completion_token_ids for t in b.turns]
                assert [t.policy_version for t in b.turns] == [version] * b.steps
            if version == 0:  # a trainer's in-place update
                sd = {
                    k: v + 0.3 * torch.randn(v.shape, generator=torch.Generator().manual_seed(1)) if v.ndim == 2 else v
                    for k, v in policy.model.state_dict().items()
                    if k != "lm_head.weight"
                }
                assert policy.update_weights(sd) == 1
                before = [t.completion_token_ids for tr in got for t in tr.turns]
    assert before != [t.completion_token_ids for tr in got for t in tr.turns]  # the new weights were used


def test_rl_steps_through_the_gateway_equal_in_process(gw_model_dir, tmp_path):
    """`evoharness rl` with ``runtime.via_gateway`` (one cell in process, every model call routed
    by the gateway): the same metrics and weights as the direct calls, and the gateway's records
    carry each step's policy version."""
    import json

    from safetensors.torch import load_file

    from evoharness.config.rl import RLConfig
    from evoharness.recipes.rl import train_rl

    def run(out, via):
        cfg = RLConfig(
            model_path=str(gw_model_dir),
            out_dir=str(out),
            steps=2,
            max_steps=3,
            max_new_tokens=12,
            max_prompt_tokens=512,
            decode_threads=1,
            seed=3,
        )
        cfg.runtime.via_gateway = via
        cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.grpo.lr = 2, 2, 1e-3
        cfg.grpo.temperature, cfg.grpo.micro_batch_size = 1.0, 8
        final = train_rl(cfg, progress=False)
        metrics = [
            {k: v for k, v in json.loads(ln).items() if not k.startswith("timing_s")}
            for ln in (out / "metrics.jsonl").read_text().splitlines()
        ]
        return metrics, load_file(str(final / "model.safetensors"))

    ref_m, ref_w = run(tmp_path / "local", False)
    got_m, got_w = run(tmp_path / "served", True)
    assert len(ref_m) == len(got_m) == 2
    for a, b in zip(ref_m, got_m):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), k
    # Served batches form by arrival, so log-probs differ from in-process ones in the 7th digit; Adam turns
    # that into sub-lr noise on near-zero gradients. The weights must agree far below the update size.
    init = load_file(str(gw_model_dir / "model.safetensors"))
    diff = sum(float((ref_w[k].float() - got_w[k].float()).norm() ** 2) for k in ref_w) ** 0.5
    update = sum(float((ref_w[k].float() - init[k].float()).norm() ** 2) for k in ref_w) ** 0.5
    assert update > 0 and diff < 1e-3 * update, (diff, update)  # measured: 0 to 1.1e-4
    recs = [
        json.loads(ln) for f in (tmp_path / "served" / "gateway").glob("*.jsonl") for ln in f.read_text().splitlines()
    ]
    assert {r["policy_version"] for r in recs} == {0, 1}
    assert len(recs) == sum(m["steps_per_episode"] * 4 for m in got_m)  # one record per turn
