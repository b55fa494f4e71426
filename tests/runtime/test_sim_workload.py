"""Workload configs, distributions, the timeout cap and JSONL traces."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from evoharness.config.base import ConfigError
from evoharness.config.sim import Dist, WorkloadConfig
from evoharness.runtime.sim import simulate
from evoharness.runtime.workload import Workload, load_sim_config, load_trace

CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "workloads"


@pytest.mark.parametrize("name", ["smoke", "qwengyre_nl2repo", "qwengyre_122b"])
def test_shipped_workloads_load(name):
    cfg, _ = load_sim_config(CONFIGS / f"{name}.toml")
    b = Workload(cfg.workload, cfg.seed).sample_step(0)
    assert len(b.n_turns) == cfg.workload.groups_per_step * cfg.workload.group_size
    if name != "smoke":  # QwenGyre's description: hours-long, ~700K tokens, tail at the timeout
        assert 5e5 < b.tokens.mean() < 9e5
        nominal = np.add.reduceat(b.completion / cfg.workload.timeout_ref_tps + b.tool_s, b.offsets[:-1])
        assert np.median(nominal) > 3600
        assert np.mean(nominal > 0.9 * cfg.workload.timeout_s) > 0.02


def test_distributions():
    rng = np.random.default_rng(0)
    assert (Dist.model_validate(7).sample(rng, 5) == 7).all()
    p = Dist(kind="pareto", scale=10, shape=1.5, max=1000).sample(rng, 10_000)
    assert p.min() >= 10 and p.max() <= 1000
    ln = Dist(kind="lognormal", median=100, sigma=0.5).sample(rng, 20_000)
    assert abs(np.median(ln) / 100 - 1) < 0.03
    with pytest.raises(ValueError):
        Dist.model_validate({"kind": "weibull"})


def test_timeout_caps_nominal_duration():
    cfg = WorkloadConfig(
        groups_per_step=50,
        group_size=4,
        turns=Dist(kind="pareto", scale=5, shape=1.1),
        completion_tokens=Dist(value=300),
        tool_latency_s=Dist(value=10),
        timeout_s=600,
        timeout_ref_tps=30,
    )
    b = Workload(cfg, 0).sample_step(0)
    nominal = np.add.reduceat(b.completion / 30 + b.tool_s, b.offsets[:-1])
    assert nominal.max() <= 600 + 1e-9
    assert np.mean(nominal > 540) > 0.05  # the tail piles up under the cap


def _write(p: Path, rows) -> Path:
    p.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return p


def test_trace_per_call_replay(tmp_path):
    rows = []
    for e in range(4):
        t = 0.0
        prompt = 1000
        for _k in range(3 + e):
            rows.append(
                {
                    "execution": f"x{e}",
                    "group": f"g{e // 2}",
                    "start": t,
                    "end": t + 5,
                    "prompt_tokens": prompt,
                    "completion_tokens": 100,
                }
            )
            prompt += 100 + 50  # previous completion + 50 new tool tokens
            t += 5 + 2.0 * (e + 1)
    path = _write(tmp_path / "trace.jsonl", rows)
    ex = load_trace(path)
    assert [len(x.prompt) for x in ex] == [3, 4, 5, 6]
    assert ex[0].prompt.tolist() == [1000, 50, 50] and ex[1].tool_s[:2].tolist() == [4.0, 4.0]
    cfg, base = load_sim_config(path, ["cluster.cells=2", "cluster.capacity=2"])
    assert (cfg.workload.groups_per_step, cfg.workload.group_size) == (2, 2)
    r = simulate(cfg, "elastic", base_dir=base)
    assert r.checks["finished_once"] and r.checks["model_calls"] == 18 * cfg.steps
    assert r.checks["trained_tokens"] == cfg.steps * sum(x.prompt.sum() + x.completion.sum() for x in ex)


def test_trace_trajectory_lines(tmp_path):
    traj = {
        "episode_id": "t#0",
        "task_id": "t",
        "wall_s": 30.0,
        "turns": [{"prompt_tokens": 500, "completion_tokens": 20}, {"prompt_tokens": 560, "completion_tokens": 30}],
    }
    ex = load_trace(_write(tmp_path / "t.jsonl", [traj, {**traj, "episode_id": "t#1"}]))
    assert len(ex) == 2 and ex[0].prompt.tolist() == [500, 40] and ex[0].tool_s.tolist() == [15.0, 15.0]


@pytest.mark.parametrize(
    "content, match",
    [
        ("{not json", "not valid JSON"),
        ('{"foo": 1}', "needs 'execution'"),
        ('{"execution": 1, "prompt_tokens": "x", "completion_tokens": 2}', "numeric"),
        ("", "no executions"),
    ],
)
def test_malformed_trace(tmp_path, content, match):
    p = tmp_path / "bad.jsonl"
    p.write_text(content)
    with pytest.raises(ConfigError, match=match):
        load_sim_config(p)


def test_missing_or_wrong_workload_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_sim_config(tmp_path / "none.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[workload]\ngroups_per_step = 'many'\n")
    with pytest.raises(ConfigError, match="groups_per_step"):
        load_sim_config(bad)
    typo = tmp_path / "typo.toml"
    typo.write_text("[cluster]\ncels = 3\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_sim_config(typo)
    other = tmp_path / "w.yaml"
    other.write_text("x: 1")
    with pytest.raises(ConfigError, match=".toml"):
        load_sim_config(other)


def test_a_runs_trace_replays_step_by_step(tmp_path):
    """A runtime run's trace (`runtime/trace.jsonl`: each execution names its RL step) replays
    each step's own executions in that step, not the whole run in every step."""
    lines = []
    for step, turns in ((1, 2), (2, 5)):
        for k in range(2):
            calls = [
                {"prompt_tokens": 100, "completion_tokens": 10 * step, "start": 2.0 * t, "end": 2.0 * t + 1}
                for t in range(turns)
            ]
            lines.append(
                json.dumps({"step": step, "task_id": f"g#u{step - 1}", "episode_id": f"e{step}{k}", "turns": calls})
            )
    (tmp_path / "trace.jsonl").write_text("\n".join(lines) + "\n")
    wl = Workload(
        WorkloadConfig(groups_per_step=1, group_size=2, trace=str(tmp_path / "trace.jsonl"), trace_replay=True)
    )
    b0, b1 = wl.sample_step(0), wl.sample_step(1)
    assert b0.n_turns.tolist() == [2, 2] and b1.n_turns.tolist() == [5, 5]
    assert set(b0.completion) == {10.0} and set(b1.completion) == {20.0}
    assert b1.tool_s.tolist() == [1.0, 1.0, 1.0, 1.0, 0.0] * 2  # the gaps between its calls
    with pytest.raises(ConfigError, match="per recorded step"):
        Workload(
            WorkloadConfig(groups_per_step=1, group_size=3, trace=str(tmp_path / "trace.jsonl"), trace_replay=True)
        )
