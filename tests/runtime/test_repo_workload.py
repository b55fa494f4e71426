"""RL on repository tasks over the elastic runtime (`runtime.repo_backend`): real pack tasks,
real bubblewrap sandboxes and scoring, a real (micro) Qwen3 model in cell processes, the
schedulers driving them. An execution is one repository episode; its calls are recorded,
turned into a trajectory tree and trained by the train cells."""

from __future__ import annotations

import json

import pytest
import torch
from rl_cells import drive_with_killer, gateway_satellite_killer, job_parts, metrics
from safetensors.torch import load_file
from typer.testing import CliRunner

from evoharness.cli import app
from evoharness.envs.repo.policies import ReferencePolicy
from evoharness.envs.repo.sandbox import require_bwrap
from evoharness.rollout.records import CallRecord
from evoharness.rollout.tree import TrajectoryTree, all_paths, select_paths
from evoharness.runtime.repo_backend import RepoBackend, tree_samples
from evoharness.config.rl import RLConfig

TASKS = ["rle_codec", "roman_numerals"]     # two easy pack tasks


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from micro_model import build_micro_model_dir

    require_bwrap()
    # 4096 positions: a task's first prompt is ~1,400 tokens with this tokenizer
    return build_micro_model_dir(tmp_path_factory.mktemp("repo_micro"), initializer_range=0.3,
                                 max_position_embeddings=4096)


def _cli_args(model_dir, out, *extra):
    return ["rl", "--env", "repo", "--tasks", "pack", "--model-path", str(model_dir), "--out", str(out),
            "--set", "steps=2", "--set", "max_new_tokens=12", "--set", f"repo.task_ids={json.dumps(TASKS)}",
            "--set", "repo.agent.max_no_tool_replies=2", "--set", "grpo.group_size=2",
            "--set", "grpo.prompts_per_step=2", "--set", "grpo.lr=1e-3", "--set", "grpo.temperature=1.0", *extra]


@pytest.fixture(scope="module")
def colocate(model_dir, tmp_path_factory):
    """`evoharness rl --env repo --schedule colocate --cells 3`: 2 tasks x 2 samples x 2 steps."""
    out = tmp_path_factory.mktemp("colocate") / "rl"
    res = CliRunner().invoke(app, _cli_args(model_dir, out, "--schedule", "colocate", "--cells", "3"))
    assert res.exit_code == 0, res.output
    return out


def test_colocate_from_the_cli_plays_each_execution_once(model_dir, colocate):
    """The random model emits no tool call, so every episode ends by ``no_tool_call`` on an
    empty workspace (placeholder 0): every advantage is 0, which is recorded (and the update
    is exactly zero), not a crash. Each execution runs once; the trace replays (~15 s)."""
    out = colocate
    got = metrics(out)
    assert [m["step"] for m in got] == [1, 2]
    for m in got:
        assert m["score/placeholder"] == 4 and m["score/scored"] == m["score/dropped"] == 0
        assert m["stop/no_tool_call"] == 4 and m["steps_per_episode"] == 2.0
        assert m["adv/nonzero"] == 0 and m["adv/signal_groups"] == 0
        assert m["tree/calls"] == 8 and 0 < m["tree/selected"] == m["train/n_tokens"] <= m["tree/trainable"]
        assert m["tree/tokens"] < sum(1400 for _ in range(8))     # the calls share their prefixes
        assert m["train/grad_norm"] == 0.0
    trace = [json.loads(ln) for ln in (out / "runtime" / "trace.jsonl").read_text().splitlines()]
    ids = [t["episode_id"] for t in trace]
    assert sorted(ids) == sorted(f"{t}#u{u}g{k}" for u in (0, 1) for t in TASKS for k in (0, 1))
    assert all(len(t["turns"]) == 2 and all(x["end"] > x["start"] for x in t["turns"]) for t in trace)
    rt = json.loads((out / "runtime.json").read_text())
    assert rt["runtime/aborted_turns"] == 0 and rt["runtime/micro_batches"] >= 2
    assert (out / "runtime" / "sim.toml").exists()
    w0, w = load_file(str(model_dir / "model.safetensors")), load_file(str(out / "final" / "model.safetensors"))
    assert all(torch.equal(w0[k], w[k]) for k in w0)             # zero advantages, zero update


SAME = ("score/placeholder", "stop/no_tool_call", "steps_per_episode", "completion_tokens_per_episode", "tree/calls",
        "tree/tokens", "tree/trainable", "tree/selected", "tree/rows", "train/n_tokens", "policy_version")


def test_ray_actors_play_the_same_executions(model_dir, colocate, ray_head, tmp_path):
    """The same run on 2 Ray actors (all-reduce train replicas): the same executions, calls,
    completions and trees as 3 local cells, since a call's sample depends on (seed,
    execution, call index) only, not on the cell that served it (~12 s)."""
    out = tmp_path / "rl"
    res = CliRunner().invoke(app, _cli_args(model_dir, out, "--schedule", "colocate", "--cells", "2",
                                            "--backend", "ray"))
    assert res.exit_code == 0, res.output
    for a, b in zip(metrics(out), metrics(colocate), strict=True):
        assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}
        assert a["train/entropy"] == pytest.approx(b["train/entropy"], rel=1e-5)


class ScriptedFirstSample(RepoBackend):
    """Sample 0 of every group acts by the scripted reference replay (it writes the reference
    solution: reward 1.0); sample 1 acts on the model's own reply (reward 0). The model is
    still called and its tokens recorded and trained for both: this is only to get a nonzero
    advantage, which a random micro model never earns on its own."""

    def _answer(self, e, ask, reply):
        if (e % self.N) % self.gs:
            return reply
        task, xid, _ = self._spec(e)
        return ReferencePolicy().complete(ask.messages, None, execution_id=xid, role=ask.role, task=task)


def test_elastic_async_through_the_gateway_survives_a_killed_rollout_cell(model_dir, tmp_path):
    """elastic-async on 2 cells, calls through the gateway; a satellite rollout cell is
    SIGKILLed mid-step: its calls are re-issued, no turn is aborted, every execution runs
    exactly once, and the records -> trees -> samples take a real gradient step (~20 s)."""
    from evoharness.runtime.rl_job import repo_tasks

    cfg = RLConfig(model_path=str(model_dir), out_dir=str(tmp_path), steps=2, max_new_tokens=12, seed=0, env="repo")
    cfg.repo.task_ids, cfg.repo.agent.max_no_tool_replies = TASKS, 2
    cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.grpo.lr, cfg.grpo.temperature = 2, 2, 1e-3, 1.0
    cfg.runtime.schedule, cfg.runtime.cells, cfg.runtime.staleness, cfg.runtime.capacity = "elastic-async", 2, 0, 4
    sim, sched, tasks, order = job_parts(cfg, repo_tasks(cfg))
    be = ScriptedFirstSample(sim, sched.initial_roles(), cfg, tasks, order, None, str(tmp_path / "rt"),
                             via_gateway=True)
    killed = []
    stats = drive_with_killer(sched, be, gateway_satellite_killer(be, 3, killed))
    assert killed and stats.cells_lost == 1 == be.counts["cells_lost"]
    assert be.counts["reissued_calls"] >= 1 and stats.aborted_turns == 0 == be.counts["aborted_turns"]
    assert be.started == {e: 1 for e in range(8)} and sorted(be.outcome) == list(range(8))
    assert [r["step"] for r in be.records] == [1, 2]
    for r in be.records:
        assert r["score/scored"] >= 2 and r["success"] == 0.5        # the scripted samples pass every hidden test
        assert r["adv/signal_groups"] == 2 and r["adv/nonzero"] == 4
        assert r["train/grad_norm"] > 0 and r["train/n_tokens"] == r["tree/selected"] > 0
    for e in range(0, 8, 2):
        assert be.outcome[e]["reward"] == 1.0 and be.outcome[e]["stop_reason"] == "finish"
    w0 = load_file(str(model_dir / "model.safetensors"))
    w2 = load_file(str(tmp_path / "rt" / "weights" / "v2.safetensors"))
    shared = set(w0) & set(w2)          # (a tied output head is saved under one of its names)
    assert len(shared) >= len(w0) - 1 and any(not torch.equal(w0[k], w2[k]) for k in shared)


def test_tree_samples_train_each_generated_token_once():
    """Two calls of one execution (the second's prompt extends the first call) and a summary
    branch: rows cover exactly the selected trainable tokens, each once, with the recorded
    log-probs, and context is never trained."""
    def rec(i, prompt, comp, role="main"):
        return CallRecord("x", f"c{i}", role, "m", prompt, comp, [-0.1 * (j + 1) for j in range(len(comp))], 0, "stop",
                          float(i), float(i) + 0.5)

    recs = [rec(0, [1, 2, 3], [10, 11]), rec(1, [1, 2, 3, 10, 11, 4, 5], [12, 13, 14]),
            rec(2, [1, 2, 3, 10, 11, 6], [20], role="summary")]
    tree = TrajectoryTree.from_records(recs)
    rows = tree_samples(tree, all_paths(tree), 0.5, group=3)
    trained = [(tuple(r.prompt_ids), tuple(r.completion_ids), tuple(r.logprobs)) for r in rows]
    assert sorted(trained) == sorted([((1, 2, 3), (10, 11), (-0.1, -0.2)),
                                      ((1, 2, 3, 10, 11, 4, 5), (12, 13, 14), (-0.1, -0.2, -0.30000000000000004)),
                                      ((1, 2, 3, 10, 11, 6), (20,), (-0.1,))])
    assert sum(len(r.completion_ids) for r in rows) == tree.n_trainable == 6
    assert all(r.advantage == 0.5 and r.group == 3 and r.episode_id == "x" for r in rows)
    one = select_paths(tree, j_max=1, seed=0)           # main outranks summary: the main leaf only
    assert sum(len(r.completion_ids) for r in tree_samples(tree, one, 1.0)) == one.n_tokens == 5


@pytest.mark.parametrize("args, message", [
    (["--tasks", "pack"], "--tasks applies to --env repo only"),
    (["--env", "repo"], "env = 'repo' runs on the runtime cells"),
    (["--env", "repo", "--schedule", "colocate", "--set", 'repo.task_ids=["nope"]'], "repo.task_ids ['nope']"),
    (["--env", "repo", "--schedule", "colocate", "--set", "eval_every=1"], "no periodic evaluation"),
])
def test_cli_refuses_what_the_repo_workload_cannot_do(model_dir, tmp_path, args, message):
    res = CliRunner().invoke(app, ["rl", "--model-path", str(model_dir), "--out", str(tmp_path / "x"), *args])
    assert res.exit_code != 0 and message in res.output
