"""The fixed-panel evaluator end to end on real games."""

import json
import subprocess
import sys

import pytest

from evoharness.config.eval import EvalConfig
from evoharness.eval.evaluate import chunk_sizes, evaluate, evaluate_many
from evoharness.eval.panel import build_episodes
from evoharness.files import read_jsonl


def _cfg(tmp_path, name, **kw):
    base = dict(
        split="valid_seen",
        limit=4,
        batch_size=2,
        out_dir=str(tmp_path / name),
        harness={"kind": "react"},
        policy={"kind": "noisy_expert", "epsilon": 0.3, "seed": 7},
    )
    base.update(kw)
    return EvalConfig.model_validate(base)


def _per_game(out):
    return {d["episode_id"]: (d["won"], [t["action"] for t in d["turns"]]) for d in read_jsonl(out / "episodes.jsonl")}


def test_same_results_with_one_and_two_workers(tmp_path):
    s1 = evaluate(_cfg(tmp_path, "w1", workers=1), progress=False)
    s2 = evaluate(_cfg(tmp_path, "w2", workers=2, batch_size=1), progress=False)
    g1, g2 = _per_game(tmp_path / "w1"), _per_game(tmp_path / "w2")
    assert g1 == g2 and len(g1) == 4
    assert s1["overall"] == s2["overall"]
    # episodes.jsonl is in panel order whatever order workers finished in
    ids = [d["episode_id"] for d in read_jsonl(tmp_path / "w2" / "episodes.jsonl")]
    assert ids == sorted(ids)
    for f in ("report.md", "summary.json", "success.png"):
        assert (tmp_path / "w2" / f).stat().st_size > 0
    assert "| **all** | 4 |" in (tmp_path / "w2" / "report.md").read_text()


def test_panels_played_together_give_what_each_gives_alone(tmp_path):
    """One system on valid_seen and on training games in one pool of mixed lock-step batches
    (the main job's valid_seen + development evaluation): each panel's episodes and summary are
    those of its own evaluation, in its own directory."""
    from evoharness.envs.alfworld.games import discover_games

    train = dict(split="train", limit=None, games=[t.task_id for t in discover_games("train", None)][:2])
    alone = [evaluate(_cfg(tmp_path, "vs"), progress=False), evaluate(_cfg(tmp_path, "tr", **train), progress=False)]
    # 6 episodes in chunks of 3: the second batch holds the last valid_seen game and both train games
    both = evaluate_many(
        [_cfg(tmp_path, "vs2", workers=2, batch_size=3), _cfg(tmp_path, "tr2", workers=2, batch_size=3, **train)],
        progress=False,
    )
    assert _per_game(tmp_path / "vs2") == _per_game(tmp_path / "vs") and len(_per_game(tmp_path / "vs")) == 4
    assert _per_game(tmp_path / "tr2") == _per_game(tmp_path / "tr") and len(_per_game(tmp_path / "tr")) == 2
    assert [s["overall"] for s in both] == [s["overall"] for s in alone]
    assert both[1]["split"] == "train" and "| **all** | 2 |" in (tmp_path / "tr2" / "report.md").read_text()
    with pytest.raises(ValueError, match="share the system"):
        evaluate_many([_cfg(tmp_path, "a"), _cfg(tmp_path, "b", policy={"kind": "expert"})])
    with pytest.raises(ValueError, match="different seeds"):
        evaluate_many([_cfg(tmp_path, "c", limit=1), _cfg(tmp_path, "d", limit=1, seed=1)])
    assert not (tmp_path / "c").exists()  # refused before anything was written


def test_an_episode_in_two_panels_is_played_once(tmp_path):
    """A panel that contains another's episodes (the first 2 games of 3) takes them from it,
    also from an earlier run's directory: the very records (their wall time too), not a replay."""
    first = evaluate(_cfg(tmp_path, "two", limit=2), progress=False)
    old = {d["episode_id"]: d for d in read_jsonl(tmp_path / "two" / "episodes.jsonl")}
    s2, s3 = evaluate_many([_cfg(tmp_path, "two", limit=2), _cfg(tmp_path, "three", limit=3)], progress=False)
    three = read_jsonl(tmp_path / "three" / "episodes.jsonl")
    assert [d for d in three if d["episode_id"] in old] == list(old.values()) and len(three) == 3
    assert s2["overall"] == first["overall"] and s3["overall"]["n"] == 3


def test_an_interrupted_evaluation_keeps_the_episodes_that_ended(tmp_path, monkeypatch):
    """Episodes are written as each one ends, not when its lock-step batch does: an interrupt
    (Ctrl-C, a killed worker) loses only the episodes still in play, and the rerun plays only those."""
    import evoharness.eval.evaluate as ev

    full = evaluate(_cfg(tmp_path, "full", policy={"kind": "expert"}), progress=False)
    steps = {d["episode_id"]: len(d["turns"]) for d in read_jsonl(tmp_path / "full" / "episodes.jsonl")}
    longest = max(steps, key=steps.get).split("#")[0]
    assert sorted(steps.values())[0] < steps[max(steps, key=steps.get)]  # one ends while another plays on
    log = tmp_path / "cut" / "episodes.jsonl"
    real = ev.make_env

    def make_env(task, **kw):
        env = real(task, **kw)
        if task.task_id == longest:  # interrupted as soon as another episode has been written
            step = env.step

            def interrupted(action):
                if log.exists() and log.read_text().strip():
                    raise KeyboardInterrupt
                return step(action)

            env.step = interrupted
        return env

    monkeypatch.setattr(ev, "make_env", make_env)
    cfg = _cfg(tmp_path, "cut", policy={"kind": "expert"}, batch_size=4)
    with pytest.raises(KeyboardInterrupt):
        evaluate(cfg, progress=False)
    kept = {d["episode_id"]: d for d in read_jsonl(log)}
    assert 1 <= len(kept) < 4 and longest + "#0" not in kept
    monkeypatch.setattr(ev, "make_env", real)
    again = evaluate(cfg, progress=False)
    assert again["overall"] == full["overall"]
    assert all(d == kept[d["episode_id"]] for d in read_jsonl(log) if d["episode_id"] in kept)


def test_chunks_keep_every_worker_busy():
    assert chunk_sizes(140, 2, 70) == [70, 70]
    assert chunk_sizes(60, 2, 70) == [30, 30]  # not one chunk of 60 and an idle worker
    assert chunk_sizes(160, 2, 70) == [40, 40, 40, 40]
    assert chunk_sizes(5, 1, 2) == [2, 2, 1] and chunk_sizes(1, 4, 8) == [1] and chunk_sizes(0, 2, 8) == []
    for n, w, b in [(200, 2, 100), (7, 3, 2), (999, 2, 70)]:
        sizes = chunk_sizes(n, w, b)
        assert sum(sizes) == n and max(sizes) <= b and max(sizes) - min(sizes) <= 1 and len(sizes) % w == 0


def test_resume_skips_finished_episodes(tmp_path):
    cfg = _cfg(tmp_path, "r", limit=2, policy={"kind": "expert"})
    evaluate(cfg, progress=False)
    path = tmp_path / "r" / "episodes.jsonl"
    lines = path.read_text().splitlines()
    path.write_text(lines[0] + "\n" + lines[1][: len(lines[1]) // 2])  # killed mid-write
    first = json.loads(lines[0])
    summary = evaluate(cfg, progress=False)
    again = read_jsonl(path)
    assert [d["episode_id"] for d in again] == [first["episode_id"], json.loads(lines[1])["episode_id"]]
    assert again[0] == first  # kept, not replayed
    assert summary["overall"]["n"] == 2


def test_resume_refuses_another_evaluations_episodes(tmp_path):
    """Fault 7's kind (review): the same --out with another policy reported the old policy's
    episodes as its own (a random policy scored the expert's 100%). A resume that changes only
    how the work is run goes on; one that changes what an episode records is refused."""
    import pytest

    expert = _cfg(tmp_path, "r", limit=2, policy={"kind": "expert"})
    assert evaluate(expert, progress=False)["overall"]["won"] == 2
    with pytest.raises(ValueError, match=r"policy.kind: 'expert' -> 'random'"):
        evaluate(_cfg(tmp_path, "r", limit=2, policy={"kind": "random"}), progress=False)
    with pytest.raises(ValueError, match=r"harness.history_window"):
        evaluate(
            _cfg(tmp_path, "r", limit=2, policy={"kind": "expert"}, harness={"kind": "react", "history_window": 2}),
            progress=False,
        )
    same = evaluate(_cfg(tmp_path, "r", limit=2, workers=2, batch_size=1, policy={"kind": "expert"}), progress=False)
    assert same["overall"]["won"] == 2
    fresh = evaluate(_cfg(tmp_path, "r", limit=2, policy={"kind": "random"}, resume=False), progress=False)
    assert fresh["overall"]["won"] == 0 and fresh["overall"]["n"] == 2


def test_a_worker_that_cannot_load_its_policy_raises_the_cause(tmp_path):
    """A worker's start-up error reaches the caller as itself (multiprocessing.Pool restarted
    such workers forever: the evaluation hung)."""
    import pytest

    with pytest.raises(FileNotFoundError, match="not a local model directory"):
        evaluate(
            _cfg(tmp_path, "bad", workers=2, batch_size=1, policy={"kind": "hf", "model_path": str(tmp_path / "none")}),
            progress=False,
        )


def test_a_dead_worker_is_an_error_not_a_hang(tmp_path):
    """Workers are spawned and import the caller's script: one without a __main__ guard calls
    evaluate() again inside each worker, which dies starting its own. The caller gets an error
    naming the cause, within the timeout, and the workers are gone."""
    script = tmp_path / "no_guard.py"
    script.write_text(
        "import sys\n"
        "from evoharness.eval.evaluate import EvalConfig, evaluate\n"
        "evaluate(EvalConfig.model_validate(dict(split='valid_seen', limit=2, batch_size=1, workers=2,\n"
        "    out_dir=sys.argv[1], harness={'kind': 'react'}, policy={'kind': 'expert'})), progress=False)\n"
    )
    r = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "out")], capture_output=True, text=True, timeout=180
    )
    assert r.returncode != 0
    assert "an evaluation worker process died" in r.stderr and 'needs `if __name__ == "__main__":`' in r.stderr


def test_protocols(valid_seen):
    panel = build_episodes(valid_seen, "panel", seed=0)
    assert [e.task.task_id for e in panel] == sorted(t.task_id for t in valid_seen)
    r1, r2 = build_episodes(valid_seen, "random128", 1), build_episodes(valid_seen, "random128", 1)
    assert len(r1) == 128 and [e.episode_id for e in r1] == [e.episode_id for e in r2]
    assert len({e.task.task_id for e in r1}) < 128  # drawn with replacement
    assert EvalConfig(protocol="evoharness").step_cap == 70 and EvalConfig().step_cap == 50


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "evoharness.cli", *args], capture_output=True, text=True, timeout=120)


def test_cli_errors_are_clear(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("split = 'valid_seen'\n[policy]\nkindd = 'expert'\n")
    r = _cli("eval", "--config", str(bad))
    assert r.returncode == 2 and "policy.kindd: unknown key" in r.stderr
    r = _cli("eval", "--split", "validation")
    assert r.returncode == 2 and "unknown split" in r.stderr
    r = _cli("eval", "--data-path", str(tmp_path / "nowhere"))
    assert r.returncode == 2 and "not found" in r.stderr
    r = _cli("eval", "--config", str(tmp_path / "missing.toml"))
    assert r.returncode == 2 and "config file not found" in r.stderr
    (tmp_path / "garbled.toml").write_text("split = [\n")
    r = _cli("eval", "--config", str(tmp_path / "garbled.toml"))
    assert r.returncode == 2 and "not valid TOML" in r.stderr


_QUEUE = None


def _keep_queue(q) -> None:
    global _QUEUE
    _QUEUE = q


def _put_episode(n_bytes: int) -> int:
    """A worker task that puts an episode bigger than a pipe holds (a random policy's 50-turn
    episode is ~90 KB): its queue's feeder thread is still writing when the task returns."""
    _QUEUE.put({"episode_id": "big", "blob": "x" * n_bytes})
    return n_bytes


def test_the_pool_shuts_down_while_workers_still_flush_their_episodes():
    """A worker exits only once its queue has been read: a shutdown that only waited for the
    workers hung forever after the random policy's evaluation in the main job."""
    import multiprocessing as mp
    import threading
    from concurrent.futures import ProcessPoolExecutor

    from evoharness.eval.evaluate import _shutdown_draining

    ctx = mp.get_context("spawn")
    finished = ctx.Queue()
    pool = ProcessPoolExecutor(2, mp_context=ctx, initializer=_keep_queue, initargs=(finished,))
    assert [f.result() for f in [pool.submit(_put_episode, 1 << 20) for _ in range(2)]] == [1 << 20] * 2
    got: list[dict] = []
    closer = threading.Thread(target=_shutdown_draining, args=(pool, finished, got.append), daemon=True)
    closer.start()
    closer.join(120)
    assert not closer.is_alive(), "the shutdown hung"
    assert [d["episode_id"] for d in got] == ["big", "big"] and len(got[0]["blob"]) == 1 << 20
