"""The main job's RL screening: the SFT model plays training games, RL trains on those it lost."""

import json

from evoharness.config import load_config
from evoharness.jsonl import read_jsonl
from evoharness.pipeline import RunConfig, dev_split, run_pipeline, screened_games

RUN = ["train_games=6", "dev_games=2", "max_steps=8", "eval_limit=1", "dev_eval_limit=1", "curve_games=0",
       "sft.max_steps=2", "sft.ckpt_every=0", "sft.progress=false", "vocab_size=300", "model_overrides.head_dim=16",
       "rl_screen_games=9", "rl.steps=1", "rl.max_steps=4", "rl.grpo.group_size=2", "rl.grpo.prompts_per_step=1",
       "rl.grpo.mini_batches=1", "eval_workers=1"]


def test_rl_trains_on_the_screened_games_the_sft_model_lost(tmp_path):
    out = tmp_path / "run"
    cfg = load_config(RunConfig, overrides=[*RUN, f'out_dir="{out}"'])
    lines: list[str] = []
    run_pipeline(cfg, log=lines.append)
    episodes = read_jsonl(out / "eval" / "rl_screen" / "episodes.jsonl")
    train_ids = {t.task_id for t in dev_split(cfg)[0]}
    # 9 asked, 6 training games: each plays once, never a development game
    assert len(episodes) == 6 and {e["task_id"] for e in episodes} == train_ids
    assert any(" of 6 screened training games" in m for m in lines)
    games = json.loads((out / "rl_games.json").read_text())
    assert games == screened_games(episodes)
    assert json.loads((out / "rl" / "rl_config.json").read_text())["games"] == games["games"]
    assert (out / ".rl_screen.done").exists() and (out / "rl" / "final").is_dir()
    assert "rl_screen" in (out / "report.md").read_text()  # its wall time is in the stage table


def test_screened_games_mix_the_lost_with_as_many_won():
    eps = [{"task_id": f"g{i}", "won": w} for i, w in enumerate([True, False, True, True, True, False, True])]
    # the won ones spread over the (type-sorted) panel, not its head
    assert screened_games(eps) == {"games": ["g1", "g5", "g0", "g3"], "lost": ["g1", "g5"],
                                   "screened": 7}
    assert screened_games(eps[:1]) == {"games": ["g0"], "lost": [], "screened": 1}  # nothing lost: every screened game
    assert screened_games([{"task_id": "g", "won": False}]) == {"games": ["g"], "lost": ["g"], "screened": 1}
