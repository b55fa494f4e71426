"""Trace collection on real games: trajectories, SFT examples, resume, shared experience."""

from __future__ import annotations

import json
import os
import re

import pytest
from engines import pick_engine

from evoharness.envs.alfworld import make_env
from evoharness.envs.alfworld.games import TASK_TYPES
from evoharness.files import read_jsonl
from evoharness.harness.bpe import ExperienceStore
from evoharness.policies.scripted import RandomPolicy
from evoharness.policies.teacher import TeacherPolicy
from evoharness.rollout.collect import bpe_harness_factory, collect_traces, traces_to_sft

FORMAT = re.compile(r"^<think>[^<]*</think><action>[^<]+</action>$")


@pytest.fixture(scope="module")
def tasks(valid_seen):
    return [next(t for t in valid_seen if t.task_type == tt) for tt in TASK_TYPES]


@pytest.fixture(scope="module")
def env_factory(tasks):
    engine = pick_engine(tasks[0])
    return lambda t: make_env(t, engine=engine)


@pytest.fixture(scope="module")
def collected(tasks, env_factory, tmp_path_factory):
    d = tmp_path_factory.mktemp("collect")
    out, exp = d / "traces.jsonl", d / "experience.json"
    stats = collect_traces(
        tasks[:4],
        TeacherPolicy(),
        bpe_harness_factory(),
        env_factory,
        out,
        batch_size=2,
        experience_path=exp,
        progress=False,
    )
    return d, out, exp, stats


def test_collect_writes_one_trajectory_per_episode_with_full_turns(collected, tasks):
    _, out, _, stats = collected
    rows = read_jsonl(out)
    assert stats.played == 4 and stats.won == 4 and stats.kept == 4 and stats.batches == 2
    assert [r["episode_id"] for r in rows] == [f"{t.task_id}#0" for t in tasks[:4]]
    for r in rows:
        assert r["won"] and r["harness"] == "bpe" and r["policy"] == "teacher"
        for turn in r["turns"]:
            assert turn["messages"][0]["role"] == "system" and turn["messages"][-1]["role"] == "user"
            assert turn["completion"] and turn["kind"] in ("env", "meta") and turn["feedback"]
            assert "PLAN" in turn["views"] and "RECALLED HINTS" in turn["views"]


def test_traces_to_sft_one_example_per_turn_written_atomically(collected):
    d, out, _, _ = collected
    sft = d / "sft.jsonl"
    examples = traces_to_sft(out, sft)
    rows = read_jsonl(out)
    assert len(examples) == sum(len(r["turns"]) for r in rows)
    assert read_jsonl(sft) == examples
    assert not [p for p in os.listdir(d) if ".tmp" in p]
    for ex, turn in zip(examples, (t for r in rows for t in r["turns"])):
        assert set(ex) >= {"messages", "completion"}
        assert ex["messages"] == turn["messages"] and FORMAT.match(ex["completion"])
        assert ex["completion"].endswith(f"<action>{turn['action']}</action>")


def test_failed_episodes_are_dropped_and_remembered(tasks, env_factory, tmp_path):
    out = tmp_path / "t.jsonl"
    st = collect_traces(
        tasks[:2], RandomPolicy(seed=1), bpe_harness_factory(), env_factory, out, max_steps=2, progress=False
    )
    assert st.played == 2 and st.kept == 0 and read_jsonl(out) == []
    assert len((tmp_path / "t.jsonl.dropped").read_text().splitlines()) == 2
    again = collect_traces(
        tasks[:2], RandomPolicy(seed=1), bpe_harness_factory(), env_factory, out, max_steps=2, progress=False
    )
    assert again.skipped == 2 and again.played == 0
    assert traces_to_sft([{"won": False, "turns": [{"kind": "env"}]}]) == []


def test_resume_skips_done_episodes_and_repairs_a_torn_line(collected, tasks, env_factory):
    d, out, exp, _ = collected
    good = out.read_text().splitlines()
    out.write_text("\n".join(good[:3]) + "\n" + good[3][: len(good[3]) // 2])  # killed mid-write
    st = collect_traces(
        tasks,
        TeacherPolicy(),
        bpe_harness_factory(),
        env_factory,
        out,
        batch_size=2,
        experience_path=exp,
        progress=False,
    )
    assert st.skipped == 3 and st.played == 3 and st.won == 3
    rows = read_jsonl(out)
    ids = [r["episode_id"] for r in rows]
    assert len(ids) == len(set(ids)) == 6
    assert all(json.loads(line) for line in out.read_text().splitlines())
    assert ids[3] == json.loads(good[3])["episode_id"] and rows[3]["won"]  # the torn episode, played again


def test_store_is_frozen_per_batch_and_consolidated_after(collected, tasks, env_factory, tmp_path):
    _, out, exp, _ = collected
    saved = ExperienceStore.load(exp)
    assert saved.epoch >= 2 and saved.pending == [] and not saved.frozen
    learnt = [e for e in saved.entries("locations") if e.source != "seed" or e.hits > 2]
    assert learnt  # pickups and notes of the episodes reached the store
    # a batch reads the store as it was when the batch started
    store = ExperienceStore()
    seen = []

    def factory(s):
        seen.append((s.frozen, s.epoch))
        return bpe_harness_factory()(s)

    collect_traces(
        tasks[:3],
        TeacherPolicy(),
        factory,
        env_factory,
        tmp_path / "x.jsonl",
        batch_size=2,
        experience=store,
        progress=False,
    )
    epochs = [e for frozen, e in seen[1:] if frozen]
    assert all(frozen for frozen, _ in seen) and sorted(set(epochs)) == [0, 1] and store.epoch == 2
    assert [t["info"]["experience_epoch"] for t in read_jsonl(tmp_path / "x.jsonl")] == [0, 0, 1]


def test_collect_in_move_wording_records_it_and_keeps_every_win(tasks, tmp_path):
    """issue 10 fault 6: the teacher collects on `move X to Y` games (alfworld >= 0.4 wording) as on
    `put X in/on Y` ones; the trajectories record the wording and every won episode becomes SFT data."""
    out, sft = tmp_path / "traces.jsonl", tmp_path / "sft.jsonl"
    engine = pick_engine(tasks[0])
    stats = collect_traces(
        tasks,
        TeacherPolicy(),
        bpe_harness_factory(),
        lambda t: make_env(t, engine=engine, wording="move"),
        out,
        batch_size=3,
        progress=False,
        wording="move",
    )
    rows = read_jsonl(out)
    assert stats.won == stats.kept == len(rows) == len(tasks)
    assert all(r["info"]["wording"] == "move" for r in rows)
    examples = traces_to_sft(out, sft)
    placed = [ex["completion"] for ex in examples if "<action>move " in ex["completion"]]
    assert len(placed) >= 5 and not any("<action>put " in ex["completion"] for ex in examples)
    # the command line takes the wording too (one --set with two pairs), and writes the examples' recipe
    from typer.testing import CliRunner

    from evoharness.cli import app
    from evoharness.config.recipe import read_examples_recipe

    args = ["collect", "--split", "valid_seen", "--per-type", "1", "--engine", engine, "--out"]
    args += [str(tmp_path / "cli.jsonl"), "--sft", str(tmp_path / "cli_sft.jsonl")]
    res = CliRunner().invoke(app, [*args, "--set", "env.wording=move", "batch_size=6", "harness.history_window=3"])
    assert res.exit_code == 0, res.output
    recipe = read_examples_recipe(tmp_path / "cli_sft.jsonl")
    assert recipe.wording == "move" and recipe.harness.history_window == 3
    cli = read_jsonl(tmp_path / "cli.jsonl")
    assert len(cli) == len(tasks) and all(r["won"] and r["info"]["wording"] == "move" for r in cli)
    assert any(t["action"].startswith("move ") for r in cli for t in r["turns"])
