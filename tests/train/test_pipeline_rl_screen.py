"""The main job's RL screening: the SFT model plays training games, RL trains on those it lost."""

import json

from evoharness.config.base import load_config
from evoharness.config.run import RunConfig
from evoharness.files import read_jsonl
from evoharness.pipeline import dev_split, run_pipeline, screened_games
from evoharness.rollout.episode import first_repeated_pair
from evoharness.rollout.records import Trajectory

RUN = [
    "train_games=6",
    "dev_games=2",
    "max_steps=8",
    "eval_limit=1",
    "dev_eval_limit=1",
    "curve_games=0",
    "sft.max_steps=2",
    "sft.ckpt_every=0",
    "sft.progress=false",
    "vocab_size=300",
    "model_overrides.head_dim=16",
    "rl_screen_games=9",
    "rl.steps=1",
    "rl.max_steps=4",
    "rl.grpo.reward.t_max=4",
    "rl.grpo.group_size=2",
    "rl.grpo.prompts_per_step=1",
    "rl.grpo.mini_batches=1",
    "eval_workers=1",
]


def test_rl_trains_on_the_screened_games_the_sft_model_lost(tmp_path):
    out = tmp_path / "run"
    cfg = load_config(RunConfig, overrides=[*RUN, f'out_dir="{out}"', "rl_branches=true"])
    lines: list[str] = []
    run_pipeline(cfg, log=lines.append)
    episodes = read_jsonl(out / "eval" / "rl_screen" / "episodes.jsonl")
    train_ids = {t.task_id for t in dev_split(cfg)[0]}
    # 9 asked, 6 training games: each plays once, never a development game
    assert len(episodes) == 6 and {e["task_id"] for e in episodes} == train_ids
    assert any(" of 6 screened training games" in m for m in lines)
    games = json.loads((out / "rl_games.json").read_text())
    assert games == screened_games(episodes)
    rl_config = json.loads((out / "rl" / "rl_config.json").read_text())
    assert rl_config["games"] == games["games"] and rl_config["branches"] == games["branches"]
    assert (out / ".rl_screen.done").exists() and (out / "rl" / "final").is_dir()
    assert "rl_screen" in (out / "report.md").read_text()  # its wall time is in the stage table


def test_screened_games_mix_the_lost_with_as_many_won():
    eps = [{"task_id": f"g{i}", "won": w} for i, w in enumerate([True, False, True, True, True, False, True])]
    # the won ones spread over the (type-sorted) panel, not its head
    assert screened_games(eps) == {
        "games": ["g1", "g5", "g0", "g3"],
        "lost": ["g1", "g5"],
        "screened": 7,
        "branches": [],
    }
    assert screened_games(eps[:1]) == {
        "games": ["g0"],
        "lost": [],
        "screened": 1,  # nothing lost: every screened game
        "branches": [],
    }
    assert screened_games([{"task_id": "g", "won": False}]) == {
        "games": ["g"],
        "lost": ["g"],
        "screened": 1,
        "branches": [],
    }


def test_a_lost_episode_that_loops_gives_a_branch_at_its_first_repeat():
    def episode(task_id, actions, won=False, stop_reason="max_steps"):
        turns = [
            {
                "turn": i,
                "messages": [],
                "completion": f"<action>{a}</action>#{i}",
                "kind": k,
                "action": a,
                "feedback": "",
            }
            for i, (k, a) in enumerate(actions)
        ]
        return {
            "episode_id": f"{task_id}#0",
            "task_id": task_id,
            "task_type": "look_at_obj_in_light",
            "split": "train",
            "harness": "bpe",
            "policy": "hf",
            "turns": turns,
            "won": won,
            "stop_reason": stop_reason,
        }

    loop = [
        ("meta", "commit plan"),
        ("env", "go to desk 1"),
        ("env", "take cd 1 from desk 1"),
        ("meta", "track desklamp"),
        ("meta", "track desklamp"),
        ("meta", "track desklamp"),
    ]
    walk = [("env", "go to desk 1"), ("env", "go to shelf 1"), ("env", "go to desk 1")]  # moves: no repeat
    eps = [
        episode("a", loop),
        episode("b", walk),
        episode("c", loop, won=True, stop_reason="won"),
        episode("d", loop, stop_reason="error"),
        episode("e", [("env", "look"), ("env", "look")]),
    ]
    got = screened_games(eps)
    assert got["lost"] == ["a", "b", "d", "e"]
    # the prefix ends just before the first repeated action: the state where the loop began
    assert got["branches"] == [
        {"task_id": "a", "prefix": [f"<action>{a}</action>#{i}" for i, (_, a) in enumerate(loop[:4])]},
        {"task_id": "e", "prefix": ["<action>look</action>#0"]},
    ]


def test_with_cycles_a_lost_episode_that_revisits_a_state_gives_a_branch_there():
    def turn(i, action, prompt):
        return {
            "turn": i,
            "messages": [{"role": "user", "content": prompt}],
            "completion": f"<action>{action}</action>",
            "kind": "env",
            "action": action,
            "feedback": "",
        }

    # a 2-cycle: no action repeats at once (no spam turn), but turn 3 meets turn 1's state and answers the same
    walk = [
        ("go to shelf 7", "at start"),
        ("go to shelf 8", "at shelf 7"),
        ("go to shelf 7", "at shelf 8"),
        ("go to shelf 8", "at shelf 7"),
    ]
    spin = [("look", "a"), ("look", "a")]  # a spam turn first: the earlier of the two repeats starts the branch
    eps = [
        {
            "episode_id": f"{g}#0",
            "task_id": g,
            "task_type": "pick_and_place_simple",
            "split": "train",
            "harness": "bpe",
            "policy": "hf",
            "turns": [turn(i, *t) for i, t in enumerate(ts)],
            "won": False,
            "stop_reason": "hopeless",
        }
        for g, ts in (("cyc", walk), ("spin", spin))
    ]
    assert first_repeated_pair(Trajectory.from_dict(eps[0])) == 3
    assert [b["task_id"] for b in screened_games(eps)["branches"]] == ["spin"]  # off: the cycle gives none
    got = screened_games(eps, cycles=True)["branches"]
    assert got == [
        {
            "task_id": "cyc",
            "prefix": [
                "<action>go to shelf 7</action>",
                "<action>go to shelf 8</action>",
                "<action>go to shelf 7</action>",
            ],
        },
        {"task_id": "spin", "prefix": ["<action>look</action>"]},
    ]


def test_branches_run_on_every_schedule():
    """Every runtime schedule honours branches: the main job no longer refuses them off the
    in-process loop."""
    for schedule in ("colocate", "async", "elastic", "elastic-async"):
        cfg = load_config(RunConfig, overrides=[f'rl.runtime.schedule="{schedule}"'])
        assert cfg.rl.runtime.schedule == schedule and cfg.rl_branches
