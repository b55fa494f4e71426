"""RL on repository tasks (`recipes.repo.RepoWorkload` on the runtime's cells): real pack tasks,
real bubblewrap sandboxes and scoring, a real (micro) Qwen3 model in bare-engine cells, the
schedulers driving them, in-process and on cell processes. An execution is one repository
episode on a thread of the driver process; its calls are recorded, turned into a trajectory
tree and trained by the train cells."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from rl_cells import metrics
from safetensors.torch import load_file
from typer.testing import CliRunner

import evoharness.recipes.repo as repo_mod
from evoharness.cli import app
from evoharness.config.rl import RLConfig
from evoharness.envs.repo import sandbox as sandbox_mod
from evoharness.envs.repo.policies import ReferencePolicy
from evoharness.envs.repo.scaffold import RepoEpisode
from evoharness.recipes.repo import RepoWorkload, repo_recipe, repo_tasks
from evoharness.rollout.records import CallRecord
from evoharness.rollout.tree import TrajectoryTree, all_paths
from evoharness.train.step import call_rows

TASKS = ["rle_codec", "roman_numerals"]  # two easy pack tasks


@pytest.fixture(scope="module")
def repo_model(tmp_path_factory):
    from micro_model import build_micro_model_dir

    sandbox_mod.require_bwrap()
    # 4096 positions: a task's first prompt is ~1,400 tokens with this tokenizer
    return build_micro_model_dir(
        tmp_path_factory.mktemp("repo_micro"), initializer_range=0.3, max_position_embeddings=4096
    )


def repo_config(model_dir: Path, out: Path, steps: int = 2, **runtime) -> RLConfig:
    """2 steps x 2 tasks x 2 samples, calls of 12 tokens, an episode ends after 2 replies without a
    tool call; `runtime` sets ``cfg.runtime`` (none: one cell in process; ``cells`` > 1: processes)."""
    cfg = RLConfig(model_path=str(model_dir), out_dir=str(out), steps=steps, max_new_tokens=12, seed=0, env="repo")
    cfg.repo.task_ids, cfg.repo.agent.max_no_tool_replies = TASKS, 2
    cfg.grpo.group_size, cfg.grpo.prompts_per_step, cfg.grpo.lr, cfg.grpo.temperature = 2, 2, 1e-3, 1.0
    if runtime.get("cells", 1) > 1:
        runtime.setdefault("backend", "local")
    cfg.runtime = cfg.runtime.model_validate({**cfg.runtime.model_dump(), **runtime})
    return cfg


@pytest.fixture(scope="module")
def inprocess(repo_model, tmp_path_factory):
    """`train_rl` with ``env = "repo"`` on the default runtime: one cell in this process."""
    from evoharness.recipes.rl import train_rl

    out = tmp_path_factory.mktemp("inprocess") / "rl"
    train_rl(repo_config(repo_model, out), progress=False)
    return out


def _episodes_left_clean(out: Path) -> None:
    """Every execution left its transcript and record, and no workspace (tmpfs) behind."""
    eps = sorted((out / "runtime" / "episodes").glob("e*"))
    assert [p.name for p in eps] == sorted(f"e{e}" for e in range(8))
    for p in eps:
        assert (p / "transcript.json").is_file() and (p / "episode.json").is_file()
        assert not (p / "workspace").exists() and not os.path.ismount(p / "workspace")


def test_in_process_plays_each_execution_once(repo_model, inprocess):
    """The random model emits no tool call, so every episode ends by ``no_tool_call`` on an
    empty workspace (placeholder 0): every advantage is 0, which is recorded (and the update is
    exactly zero), not a crash. Each execution runs once; the trace replays."""
    out = inprocess
    got = metrics(out)
    assert [m["step"] for m in got] == [1, 2]
    for m in got:
        assert m["score/placeholder"] == 4 and m["score/scored"] == m["score/dropped"] == m["score/errors"] == 0
        assert m["score/abnormal"] == m["score/tampered"] == 0
        assert m["stop/no_tool_call"] == 4 and m["steps_per_episode"] == 2.0
        assert m["adv/nonzero"] == 0 and m["adv/signal_groups"] == 0 and m["rollout/env_errors"] == 0
        assert m["rollout/restarted_executions"] == 0
        assert m["tree/calls"] == 8 and 0 < m["tree/selected"] == m["train/n_tokens"] <= m["tree/trainable"]
        assert m["tree/tokens"] < sum(1400 for _ in range(8))  # the calls share their prefixes
        assert m["train/grad_norm"] == 0.0
    trace = [json.loads(ln) for ln in (out / "runtime" / "trace.jsonl").read_text().splitlines()]
    ids = [t["episode_id"] for t in trace]
    assert sorted(ids) == sorted(f"{t}#u{u}g{k}" for u in (0, 1) for t in TASKS for k in (0, 1))
    assert all(
        len(t["turns"]) == 2 and all(x["end"] >= x["start"] and x["role"] == "main" for x in t["turns"]) for t in trace
    )
    rt = json.loads((out / "runtime.json").read_text())
    assert rt["backend"] == "inprocess" and rt["runtime/aborted_turns"] == 0 and rt["runtime/micro_batches"] >= 2
    assert (out / "runtime" / "sim.toml").exists()
    _episodes_left_clean(out)
    w0, w = load_file(str(repo_model / "model.safetensors")), load_file(str(out / "final" / "model.safetensors"))
    assert all(torch.equal(w0[k], w[k]) for k in w0)  # zero advantages, zero update


SAME = (
    "score/placeholder",
    "stop/no_tool_call",
    "steps_per_episode",
    "completion_tokens_per_episode",
    "tree/calls",
    "tree/tokens",
    "tree/trainable",
    "tree/selected",
    "tree/rows",
    "train/n_tokens",
    "policy_version",
)


def _same_as(out: Path, ref: Path) -> None:
    for a, b in zip(metrics(out), metrics(ref), strict=True):
        assert {k: a[k] for k in SAME} == {k: b[k] for k in SAME}
        assert a["train/entropy"] == pytest.approx(b["train/entropy"], rel=1e-4)


def test_two_local_cells_play_the_same_executions(repo_model, inprocess, tmp_path):
    """The same run on 2 local cell processes (colocate, an all-reduce pair): the same
    executions, calls, completions and trees as in process, since a call's sample depends on
    (seed, execution, call index) only, not on the cell that served it nor on its batch."""
    from evoharness.recipes.rl import train_rl

    out = tmp_path / "rl"
    train_rl(repo_config(repo_model, out, cells=2), progress=False)
    _same_as(out, inprocess)
    rt = json.loads((out / "runtime.json").read_text())
    assert rt["backend"] == "local" and rt["cells"] == 2 and rt["runtime/aborted_turns"] == 0
    _episodes_left_clean(out)


def test_ray_actors_play_the_same_executions(repo_model, inprocess, ray_head, tmp_path):
    """The same run from the CLI on 2 Ray actors: the same executions as in process."""
    out = tmp_path / "rl"
    res = CliRunner().invoke(
        app,
        [
            "rl",
            "--env",
            "repo",
            "--tasks",
            "pack",
            "--model-path",
            str(repo_model),
            "--out",
            str(out),
            "--set",
            "steps=2",
            "--set",
            "max_new_tokens=12",
            "--set",
            f"repo.task_ids={json.dumps(TASKS)}",
            "--set",
            "repo.agent.max_no_tool_replies=2",
            "--set",
            "grpo.group_size=2",
            "--set",
            "grpo.prompts_per_step=2",
            "--set",
            "grpo.lr=1e-3",
            "--set",
            "grpo.temperature=1.0",
            "--schedule",
            "colocate",
            "--cells",
            "2",
            "--backend",
            "ray",
        ],
    )
    assert res.exit_code == 0, res.output
    _same_as(out, inprocess)


class ScriptedFirstSample(RepoWorkload):
    """Sample 0 of every group acts by the scripted reference replay (it writes the reference
    solution: reward 1.0); sample 1 acts on the model's own reply (reward 0). The model is still
    called and its tokens recorded and trained for both: this is only to get a nonzero advantage,
    which a random micro model never earns on its own. ``played``: starts per execution."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.played: Counter = Counter()

    def start(self, e):
        self.played[e] += 1
        super().start(e)

    def answer(self, e, ask, reply):
        if (e % self.N) % self.G:
            return reply
        task, xid = self.spec(e)
        return ReferencePolicy().complete(ask.messages, None, execution_id=xid, role=ask.role, task=task)


def satellite_killer(be, min_calls: int, killed: list[int]):
    """SIGKILL a satellite cell (not the core) while gateway calls run on it, once `min_calls`
    calls were made (no join: the driver thread notices and reaps it)."""

    def kill() -> None:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            try:
                cells = {be._jobs[t][1] for t in list(be._gw_jobs)} - {0}
            except (KeyError, RuntimeError):  # the driver thread moved on meanwhile
                cells = set()
            if cells and be.counts["calls"] >= min_calls:
                os.kill(be.transport.pid(min(cells)), signal.SIGKILL)
                killed.append(min(cells))
                return
            time.sleep(0.002)

    return kill


def test_elastic_async_through_the_gateway_survives_a_killed_rollout_cell(repo_model, tmp_path, monkeypatch):
    """elastic-async on 2 cells, calls through the gateway; a satellite rollout cell is
    SIGKILLed mid-step: its calls are re-issued, no turn is aborted, every execution runs
    exactly once, and the records -> trees -> rows take a real gradient step."""
    from evoharness.recipes.rl import RLJob

    monkeypatch.setattr(repo_mod, "RepoWorkload", ScriptedFirstSample)
    cfg = repo_config(
        repo_model, tmp_path / "rl", schedule="elastic-async", cells=2, staleness=0, capacity=4, via_gateway=True
    )
    job = RLJob(cfg)
    be, killed = job.backend, []
    t = threading.Thread(target=satellite_killer(be, 3, killed), daemon=True)
    t.start()
    try:
        records = list(job.steps())
    finally:
        job.close()
    t.join(timeout=1)
    stats = job.driver.stats
    assert killed and stats.cells_lost == 1 == be.counts["cells_lost"]
    assert be.counts["reissued_calls"] >= 1 and stats.aborted_turns == 0 == be.counts["aborted_turns"]
    assert be.workload.played == {e: 1 for e in range(8)}
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["score/scored"] >= 2 and r["success"] == 0.5  # the scripted samples pass every hidden test
        assert r["stop/finish"] == 2 and r["score/errors"] == r["score/tampered"] == 0
        assert r["adv/signal_groups"] == 2 and r["adv/nonzero"] == 4
        assert r["train/grad_norm"] > 0 and r["train/n_tokens"] == r["tree/selected"] > 0
    w0 = load_file(str(repo_model / "model.safetensors"))
    w2 = load_file(str(tmp_path / "rl" / "runtime" / "weights" / "v2.safetensors"))
    shared = set(w0) & set(w2)  # (a tied output head is saved under one of its names)
    assert len(shared) >= len(w0) - 1 and any(not torch.equal(w0[k], w2[k]) for k in shared)
    _episodes_left_clean(tmp_path / "rl")


def test_in_process_planned_updates_train_real_rewards(repo_model, tmp_path, monkeypatch):
    """In process, two updates per step (``grpo.mini_batches = 2``: the whole batch's updates at
    the sync, one GRPO group each) on real rewards: the scripted samples score 1.0 on the hidden
    tests, the model's own 0, and the weights move."""
    from evoharness.recipes.rl import train_rl

    monkeypatch.setattr(repo_mod, "RepoWorkload", ScriptedFirstSample)
    cfg = repo_config(repo_model, tmp_path / "rl", steps=1)
    cfg.grpo.mini_batches = 2
    final = train_rl(cfg, progress=False)
    [m] = metrics(tmp_path / "rl")
    assert m["train/updates"] == 2 and m["train/grad_norm"] > 0
    assert m["success"] == 0.5 and m["score/scored"] >= 2 and m["adv/nonzero"] == 4
    assert m["train/n_tokens"] == m["tree/selected"] > 0
    w0, w = load_file(str(repo_model / "model.safetensors")), load_file(str(final / "model.safetensors"))
    assert any(not torch.equal(w0[k], w[k]) for k in w0)


# ---- the workload alone (no cell: the test answers the calls) --------------------------------------


def _drive(wl: RepoWorkload, executions: range, timeout_s: float = 120.0) -> None:
    """Start `executions` and answer each model call with three tokens, until all finished."""
    for e in executions:
        wl.start(e)
    deadline = time.monotonic() + timeout_s
    while not all(wl.finished(e) for e in executions):
        assert time.monotonic() < deadline, "the agents did not finish"
        for e in executions:
            if wl.request(e) is not None:
                wl.reply(e, {"result": ([5, 6, 7], [-0.5, -0.25, -0.125], 0), "seconds": 0.01, "version": 0})
        wl.woken()
        time.sleep(0.01)


def test_a_runner_error_is_a_harness_error_and_score_evidence_is_counted(repo_model, tmp_path, monkeypatch):
    """An exception from the episode runner ends that execution as a harness error
    (``score/errors``, no reward, out of its group's baseline, no rows), not the run; the
    scorer's ``abnormal`` / ``tampered`` evidence is counted per step."""

    def run(task, policy, workdir, cfg, execution_id):
        reply = policy.complete(
            [{"role": "user", "content": "spec"}], None, execution_id=execution_id, role="main", task=task
        )
        assert reply.completion_tokens == 3
        if execution_id.endswith("g0"):
            raise OSError("tmpfs mount failed")
        return RepoEpisode(
            task.task_id,
            execution_id,
            "runtime",
            task.difficulty,
            "finish",
            0.5,
            "scored",
            1,
            2,
            1,
            1,
            0,
            {},
            1,
            0,
            10,
            3,
            1.0,
            0.1,
            0.2,
            0.3,
            score_detail={"abnormal": "killed (wall_time)", "tampered": ["test replaced"]},
        )

    monkeypatch.setattr(repo_mod, "run_repo_episode", run)
    cfg = repo_config(repo_model, tmp_path / "rl")
    wl = RepoWorkload(cfg, repo_tasks(cfg), [0, 1], tmp_path / "rt")
    try:
        _drive(wl, range(4))
        assert wl.outcome[0]["error"] == "OSError: tmpfs mount failed"
        rows = {e: wl.rows(e) for e in range(4)}
        rec = wl.step_done(1, list(range(4)), {"micro": [], "ranks": [[]], "scale": 1.0}, {"train": 0.5})
    finally:
        wl.close()
    assert rec["score/errors"] == rec["rollout/env_errors"] == rec["stop/error"] == 2
    assert rec["score/scored"] == 2 and rec["score/dropped"] == rec["score/placeholder"] == 0
    assert rec["score/abnormal"] == rec["score/tampered"] == 2
    assert rec["reward"] == 0.5 and rec["success"] == 0.0 and rec["adv/signal_groups"] == 0
    assert rec["tree/calls"] == 4 and rows[0] == rows[2] == [] and len(rows[1]) == len(rows[3]) == 1
    assert rows[1][0].completion_ids == [5, 6, 7] and rows[1][0].advantage == 0.0
    assert rec["timing_s/gen"] == pytest.approx(0.04) and rec["timing_s/train"] == 0.5
    assert not wl.outcome and not wl.records and not wl._scores  # the step's books are dropped


def test_stale_workspaces_are_removed_at_start_and_close(repo_model, tmp_path, monkeypatch):
    """Workspaces a killed run left go when the workload starts; an execution live when the
    workload closes ends unscored (its call fails) and its workspace goes too; nothing of the
    kind with ``repo.agent.keep_workspace``."""
    rt = tmp_path / "rt"
    for name in ("e3/workspace/pkg", "e5/.workspace.kept"):
        (rt / "episodes" / name).mkdir(parents=True)
    (rt / "episodes" / "e3" / "workspace" / "pkg" / "a.py").write_text("x = 1\n")
    (rt / "episodes" / "e3" / "transcript.json").write_text("{}")
    cfg = repo_config(repo_model, tmp_path / "rl")
    cfg.repo.agent.keep_workspace = True
    RepoWorkload(cfg, repo_tasks(cfg), [0, 1], rt).close()
    assert (rt / "episodes" / "e3" / "workspace" / "pkg" / "a.py").is_file()  # kept

    ended = []

    def run(task, policy, workdir, cfg, execution_id):
        (Path(workdir) / "workspace").mkdir()
        try:
            policy.complete(
                [{"role": "user", "content": "spec"}], None, execution_id=execution_id, role="main", task=task
            )
        except repo_mod.WorkloadClosed:
            ended.append(execution_id)
            raise

    monkeypatch.setattr(repo_mod, "run_repo_episode", run)
    cfg.repo.agent.keep_workspace = False
    wl = RepoWorkload(cfg, repo_tasks(cfg), [0, 1], rt)
    ep = rt / "episodes"
    assert not (ep / "e3" / "workspace").exists() and not (ep / "e5" / ".workspace.kept").exists()
    assert (rt / "episodes" / "e3" / "transcript.json").is_file()
    wl.start(0)
    deadline = time.monotonic() + 60
    while wl.request(0) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert (rt / "episodes" / "e0" / "workspace").is_dir()
    wl.close()
    assert ended == [f"{TASKS[0]}#u0g0"] and not wl.finished(0)
    assert not (rt / "episodes" / "e0" / "workspace").exists()


def test_a_live_execution_restarts_on_resume(repo_model, tmp_path, monkeypatch):
    """A job checkpoint keeps the finished executions' books; an execution live then starts again
    from its beginning in the resumed workload (counted as ``rollout/restarted_executions``)."""
    gate = threading.Event()

    def run(task, policy, workdir, cfg, execution_id):
        policy.complete([{"role": "user", "content": "spec"}], None, execution_id=execution_id, role="main", task=task)
        if execution_id.endswith("g1"):
            gate.wait(60)
        return RepoEpisode(
            task.task_id,
            execution_id,
            "runtime",
            task.difficulty,
            "finish",
            1.0,
            "scored",
            2,
            2,
            1,
            1,
            0,
            {},
            1,
            0,
            10,
            3,
            1.0,
            0.1,
            0.2,
            0.3,
        )

    monkeypatch.setattr(repo_mod, "run_repo_episode", run)
    cfg = repo_config(repo_model, tmp_path / "rl")
    wl = RepoWorkload(cfg, repo_tasks(cfg), [0, 1], tmp_path / "rt")
    _drive(wl, range(0, 1))
    wl.start(1)
    deadline = time.monotonic() + 60
    while wl.request(1) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    st = wl.state()
    assert st["live"] == [1] and sorted(st["outcome"]) == [0] and 1 not in st["records"]
    wl.close()  # its call fails: the live execution ends unscored
    gate.set()  # the restarted execution runs straight through
    wl2 = RepoWorkload(cfg, repo_tasks(cfg), [0, 1], tmp_path / "rt")
    try:
        wl2.restore(st)
        assert wl2.started == {0: 1, 1: 2} and wl2.finished(0) and not wl2.finished(1)
        deadline = time.monotonic() + 60
        while not wl2.finished(1):
            assert time.monotonic() < deadline
            if wl2.request(1) is not None:
                wl2.reply(1, {"result": ([5], [-0.5], 0), "seconds": 0.0, "version": 0})
            time.sleep(0.01)
        rec = wl2.step_done(1, [0, 1], {"micro": [], "ranks": [[]], "scale": 1.0}, {})
    finally:
        wl2.close()
    assert rec["rollout/restarted_executions"] == 1 and rec["tree/calls"] == 2 and rec["success"] == 1.0


def test_the_sandbox_hooks_fail_fast(repo_model, tmp_path, monkeypatch):
    """No bwrap, or no seccomp filter: the recipe refuses before any cell or agent starts."""
    cfg = repo_config(repo_model, tmp_path / "rl")
    monkeypatch.setattr(sandbox_mod.shutil, "which", lambda name: None)
    with pytest.raises(sandbox_mod.SandboxUnavailable, match="env = 'repo' .*apt-get install -y bubblewrap"):
        repo_recipe(cfg)
    monkeypatch.undo()
    monkeypatch.setattr(sandbox_mod, "_SECCOMP", None)
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import fails as if not installed
    with pytest.raises(sandbox_mod.SandboxUnavailable, match="env = 'repo' .*seccomp"):
        repo_recipe(cfg)
    assert not (tmp_path / "rl" / "runtime" / "episodes").exists()


def test_call_rows_train_each_generated_token_once():
    """Two calls of one execution (the second's prompt extends the first call) and a summary
    branch: rows cover exactly the selected trainable tokens, each once, with the recorded
    log-probs, and context is never trained."""

    def rec(i, prompt, comp, role="main"):
        return CallRecord(
            "x",
            f"c{i}",
            role,
            "m",
            prompt,
            comp,
            [-0.1 * (j + 1) for j in range(len(comp))],
            0,
            "stop",
            float(i),
            float(i) + 0.5,
        )

    recs = [
        rec(0, [1, 2, 3], [10, 11]),
        rec(1, [1, 2, 3, 10, 11, 4, 5], [12, 13, 14]),
        rec(2, [1, 2, 3, 10, 11, 6], [20], role="summary"),
    ]
    tree = TrajectoryTree.from_records(recs)
    g = RLConfig().grpo
    rows, sizes = call_rows(recs, 0.5, g, step=0, group=3)
    trained = [(tuple(r.prompt_ids), tuple(r.completion_ids), tuple(r.logprobs)) for r in rows]
    assert sorted(trained) == sorted(
        [
            ((1, 2, 3), (10, 11), (-0.1, -0.2)),
            ((1, 2, 3, 10, 11, 4, 5), (12, 13, 14), (-0.1, -0.2, -0.30000000000000004)),
            ((1, 2, 3, 10, 11, 6), (20,), (-0.1,)),
        ]
    )
    assert sum(len(r.completion_ids) for r in rows) == tree.n_trainable == sizes["trainable"] == 6
    assert sizes["selected"] == all_paths(tree).n_tokens and sizes["calls"] == 3
    assert all(r.advantage == 0.5 and r.group == 3 and r.episode_id == "x" for r in rows)
    one, sizes = call_rows(recs, 1.0, g.model_copy(update={"j_max": 1}), step=0)  # main outranks summary
    assert sum(len(r.completion_ids) for r in one) == sizes["selected"] == 5


@pytest.mark.parametrize(
    "args, message",
    [
        (["--tasks", "pack"], "--tasks applies to --env repo only"),
        (["--env", "repo", "--set", 'repo.task_ids=["nope"]'], "repo.task_ids ['nope']"),
        (["--env", "repo", "--set", "eval_every=1"], "no periodic evaluation"),
    ],
)
def test_cli_refuses_what_the_repo_workload_cannot_do(repo_model, tmp_path, args, message):
    res = CliRunner().invoke(app, ["rl", "--model-path", str(repo_model), "--out", str(tmp_path / "x"), *args])
    assert res.exit_code != 0 and message in res.output
