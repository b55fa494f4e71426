"""GRPO levers from a finished main job's SFT model, each arm's final model paired against SFT on
the development set.

Usage: python -m experiments.rl_levers.rl_levers --run runs/main [runs/main_seed1 ...] [--out runs/rl_levers]
       [--results benchmarks/results/student/rl_levers] [--arms default screened gigpo] [--threads 2]
       [--valid-seen] [--unseen] [--note TEXT]

Every arm starts from ``--run``'s SFT model with the run's RL stage (`pipeline.rl_config`: T_max 30,
the teacher's experience store; the SFT anchor only where the arm sets one), sets its steps and games per
step (x 8 samples, unless it sets its own) and changes one thing against ``screened`` (16 steps of 2 games):

- ``default``: every training game, T = 0.6 (the main job's first RL recipe);
- ``screened``: the games the SFT model lost among 160 screened training games, mixed 1:1 with
  ones it won (`pipeline.screen_rl_games`), sampled at T = 1.0 (the main job's RL until T = 1.5);
- ``gigpo``: ``screened`` with GiGPO's step-level advantages (`train.advantages`);
- ``steps32``: ``screened`` for 32 steps (its first 16 are ``screened``'s: same seed and games);
- ``games4``: ``screened`` with 4 games x 8 samples per step (twice the episodes per update);
- ``screened_seed1``: ``screened`` with RL seed 1 instead of the run's (other samples, same games):
  how much of an arm's gain is its draw;
- ``screened8``: ``screened`` for 8 steps (the main job's RL budget); ``t15_8``: it at T = 1.5
  (more exploration from a near-deterministic SFT policy: the main job's RL today); ``lr3e4_8``:
  it at lr 3e-4 (1e-4); ``t15_8_seed1``: ``t15_8`` with RL seed 1; ``t15_lr2e4_8``: ``t15_8`` at lr 2e-4;
  ``t20_8``: ``t15_8`` at T = 2.0; ``t15_g4x4_8``: ``t15_8`` with 4 games x 4 samples per step (the same episodes);
- stronger updates held near SFT: ``t15_lr3e4_8`` (``t15_8`` at lr 3e-4), and it with a 10x KL weight
  (``t15_lr3e4_kl01_8``, β 0.1) or the SFT anchor (``t15_lr3e4_anchor_8``: every update also descends the
  teacher rows' NLL, weight 1, `train.sft_anchor`), both (``t15_lr3e4_kl01_anchor_8``) or the anchor at
  weight 4 (``t15_lr3e4_anchor4_8``); ``t15_anchor_8``: ``t15_8`` with the anchor, ``t15_anchor_8_seed1``
  it with RL seed 1, ``t15_lr2e4_anchor_8`` at lr 2e-4; ``t15_lost_lr3e4_anchor_8``:
  ``t15_lr3e4_anchor_8`` on the lost screened games only; ``t15_ep2_8``: ``t15_8`` with two passes (PPO
  epochs) over each step batch;
- the signal: ``t15_all_8`` trains every turn of each episode (``grpo.max_train_turns`` None, not 8
  sampled), ``t15_s400_8`` screens 400 training games (more lost ones to learn from), ``t15_s400_all_8``
  both; ``t15_gigpo_8`` uses GiGPO's step-level advantage at T = 1.5, ``t15_gigpo_all_8`` on every turn;
  ``t15_branch_8``: ``t15_8`` where every other group branches from a state at which a lost screened
  game began to loop (its first repeated action, `pipeline.screened_games`), so all 8 samples start at
  the decision SFT gets wrong; ``t15_branch_all_8`` trains every turn of those groups as well,
  ``t15_branch_8_seed1`` is it with RL seed 1, ``t15_branch_g4_8`` with 4 groups per step (2 games and
  2 branches), ``t15_branch_16`` for 16 steps, ``t15_branch_gigpo_8`` with GiGPO's step-level advantage
  (a branch group's samples all share its first state, GiGPO's anchor), ``t15_branch_lr2e4_8`` at lr 2e-4;
  ``t15_branch400_8`` (and with RL seed 1) takes its branches from 400 screened games (16 instead of 6),
  its games still from the 160; ``branch8`` is ``t15_branch_8`` at T = 1.0 (a sample that stays in the
  loop fails more often, so a branch group's spread is in success);
- short branches (`RLConfig.branch_turns`): ``bt4_8`` is ``t15_branch_8`` with each branch episode ended
  after 4 turns of its own (a sample that does not leave the loop at once fails, and a branch group costs
  a fraction of a game's), ``bt4_g4_8`` it with 4 groups per step (2 games, 2 branches), ``bt4_g4_16``
  that for 16 steps, ``bt4_g4_8_seed1`` with RL seed 1, ``bt4_g4_kl01_8`` with KL β 0.1 (0.01),
  ``bt4_400_g4_8`` ``bt4_g4_8`` with the 400-game screening's branches; ``bt4_g4_anchor_8`` is ``bt4_g4_8``
  with the SFT anchor (the branches' states all have the lamp in view, and the KL term holds only the
  sampled states, so "do not re-track the lamp" can spread to states where tracking is right; the anchor
  keeps the teacher's rows), ``bt4_g4_anchor_16`` it for 16 steps, ``bt4_g4_anchor_8_seed1`` with RL seed 1;
  ``bt4_g4_pos_8`` is ``bt4_g4_8`` with a branch group's negative advantages dropped
  (`RLConfig.branch_advantage`), ``bt4_g4_pos_16`` it for 16 steps, ``bt4_g4_pos_anchor_8`` it with the anchor
  (``bt4_g4_pos_anchor_8_seed1``: with RL seed 1); ``bt4_400_g4_anchor_8`` (and with RL seed 1) is
  ``bt4_g4_anchor_8`` with the 400-game screening's branches;
- seed soups (`recipes.soup`, ``soup``: N): the arm run under RL seeds 0 .. N-1 from the same SFT model,
  the policy their uniform weight average: ``bt4_g4_soup2_8``, ``bt4_g4_anchor_soup2_8``,
  ``bt4_g4_pos_anchor_soup2_8``, ``bt4_400_g4_anchor_soup2_8``. A soup's seed runs are ordinary runs of
  its single-seed arms (the same settings and seed), so they may be copied from those arms' ``rl``
  directories into ``<arm>/rl/seed<s>`` and are then not redone (the soup resumes from them);
- cycles (``cycles``): branches also where a lost screened episode cycles through states
  (`pipeline.screened_games` ``cycles``, `RunConfig.rl_branch_cycles`), e.g. a pick game walking
  shelf 7, shelf 8, shelf 7: ``bt4_cyc_g4_anchor_soup2_8`` (and its runs ``bt4_cyc_g4_anchor_8``,
  ``..._seed1``), ``bt4_400cyc_g4_anchor_soup2_8`` with the 400-game screening's;
- ``bt4_g4_anchor_soup3_8``: the anchor soup over RL seeds 0, 1 and 2;
- on-policy teacher labels (``relabel``: weight, ``relabel_filter``; experiments/on_policy_anchor/): the
  scripted teacher labels the step's own rollout states where the policy acted otherwise, and the anchor
  also fits those labels (`relabel_states`): every such state at weight 1
  (``bt4_g4_anchor_relall_soup2_8``), lost episodes' states where the teacher would act in the world at
  weight 1 (``bt4_g4_anchor_rel_soup2_8``) or 0.25 (``bt4_g4_anchor_rel025_soup2_8``). The lever lost and
  left the product; today's RL loop hands the anchor no rollout states, so these arms run only at a commit
  that still has it (experiments/on_policy_anchor/JOURNAL.md);
- GRPO lr decay (`GRPOConfig.lr_schedule` cosine from lr towards 0.1 x lr over the run's steps):
  the anchor soup with it over its 8 steps (``bt4_g4_anchor_cos_soup2_8``) or over 16
  (``bt4_g4_anchor_cos_soup2_16``: about the 8 constant-lr steps' summed lr, twice the rollouts,
  the last steps moving the policy least).
- cost (issue 50): ``cost_won_8`` trains only on screened games the SFT model won, with λ_eff 5 and the std
  floor 0.1, so the groups' spread is what an episode costs (``cost_won_t15_8`` at T = 1.5,
  ``cost_won_soup2_8`` its two-seed soup); ``eff5_8`` is ``bt4_g4_anchor_8`` with λ_eff 5. Their cost
  table pairs each arm with SFT on the games both won (`eval.cost`: steps, environment steps, harness calls).
  ``mix_cost_soup2_8``: the main job's RL (two branch groups a step, the anchor, the two-seed soup) with
  its two game groups on won screened games, λ_eff 5 and the std floor 0.1: the branch groups' success
  signal and the won groups' cost signal in one step. ``cost_after_rl_8``: ``cost_won_8`` started from
  the run's RL model (``rl/final``: the main job's GRPO soup) instead of its SFT model: the cost
  stage after the success stage. ``cost_won_anchor4_8``: ``cost_won_8`` with the SFT anchor at weight 4.

Each arm's final model plays the 60 development games (greedy, cap 50, early stopping, as the main
job); wins / losses are the games only it / only SFT won (``--run``'s ``eval/dev_sft``), p the exact
sign test. ``--valid-seen`` also plays the run's eval split (paired against ``eval/sft``) and
``--unseen`` its unseen-room panel (``unseen_split``, against ``eval/unseen_sft``): reported, never
chosen on. Selection happens on these games, never on valid_seen. An arm whose ``rl/final`` (or
evaluation) exists under ``--out`` is not redone. Several ``--run`` (main jobs of different seeds, each
its own SFT model) run every arm from each (in ``<out>/seed<S>``) and add a table of each arm's wins and
losses summed over them, and its cost on the games both won pooled over them (dev and valid_seen).
Writes ``<results>.md`` and ``<results>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

_SCREENED = {"screen": 160, "temperature": 1.0, "estimator": "grpo", "steps": 16, "games_per_step": 2}
# 2 screened games and 2 short branches per step at T = 1.5 (the main job's RL today)
_BT4_G4 = {**_SCREENED, "steps": 8, "temperature": 1.5, "branches": True, "branch_turns": 4, "games_per_step": 4}
# issue 50's cost arms: 4 groups per step, all on screened games the SFT model won, λ_eff 5, std floor 0.1
_COST_WON = {
    **_SCREENED,
    **{"steps": 8, "games_per_step": 4, "won_only": True, "lambda_eff": 5.0, "std_floor": 0.1, "anchor": 1.0},
}
ARMS = {
    "default": {**_SCREENED, "screen": 0, "temperature": 0.6},
    "screened": _SCREENED,
    "gigpo": {**_SCREENED, "estimator": "gigpo"},
    "steps32": {**_SCREENED, "steps": 32},
    "games4": {**_SCREENED, "games_per_step": 4},
    "screened_seed1": {**_SCREENED, "seed": 1},
    # the main job's RL budget today (8 steps): the same RL time, one setting changed
    "screened8": {**_SCREENED, "steps": 8},
    "t15_8": {**_SCREENED, "steps": 8, "temperature": 1.5},
    "lr3e4_8": {**_SCREENED, "steps": 8, "lr": 3e-4},
    "t15_8_seed1": {**_SCREENED, "steps": 8, "temperature": 1.5, "seed": 1},
    "t15_lr2e4_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "lr": 2e-4},
    "t20_8": {**_SCREENED, "steps": 8, "temperature": 2.0},
    "t15_g4x4_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "games_per_step": 4, "samples": 4},
    # stronger updates held near SFT: the step size (lr 3e-4 at T = 1.5), a 10x KL weight, the SFT anchor
    # (PPO-ptx on the teacher rows, train.sft_anchor), a second pass over each step batch (PPO epochs)
    "t15_lr3e4_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "lr": 3e-4},
    "t15_lr3e4_kl01_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "lr": 3e-4, "kl_beta": 0.1},
    "t15_lr3e4_anchor_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "lr": 3e-4, "anchor": 1.0},
    "t15_ep2_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "epochs": 2},
    "t15_anchor_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "anchor": 1.0},
    "t15_anchor_8_seed1": {**_SCREENED, "steps": 8, "temperature": 1.5, "anchor": 1.0, "seed": 1},
    "t15_lr2e4_anchor_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "lr": 2e-4, "anchor": 1.0},
    "t15_lr3e4_anchor4_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "lr": 3e-4, "anchor": 4.0},
    "t15_lr3e4_kl01_anchor_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "lr": 3e-4, "kl_beta": 0.1, "anchor": 1.0},
    "t15_lost_lr3e4_anchor_8": {
        **_SCREENED,
        "steps": 8,
        "temperature": 1.5,
        "lr": 3e-4,
        "anchor": 1.0,
        "lost_only": True,
    },
    # where the signal is: every turn of each episode trained (the decisive turn is one of ~24; 8 sampled
    # turns miss it two times in three), more screened games (400: more lost ones)
    "t15_all_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "train_turns": None},
    "t15_s400_8": {**_SCREENED, "screen": 400, "steps": 8, "temperature": 1.5},
    "t15_s400_all_8": {**_SCREENED, "screen": 400, "steps": 8, "temperature": 1.5, "train_turns": None},
    # GiGPO's step-level advantage singles out the turn where the same state led to different returns
    "t15_gigpo_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "estimator": "gigpo"},
    "t15_gigpo_all_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "estimator": "gigpo", "train_turns": None},
    # every other group branches from a state where a lost screened game began to loop (train.rl.Branch)
    "t15_branch_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "branches": True},
    "t15_branch_all_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "branches": True, "train_turns": None},
    "t15_branch_8_seed1": {**_SCREENED, "steps": 8, "temperature": 1.5, "branches": True, "seed": 1},
    "t15_branch_g4_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "branches": True, "games_per_step": 4},
    "t15_branch_16": {**_SCREENED, "steps": 16, "temperature": 1.5, "branches": True},
    "t15_branch_gigpo_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "branches": True, "estimator": "gigpo"},
    "t15_branch_lr2e4_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "branches": True, "lr": 2e-4},
    "t15_branch400_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "branches": 400},
    "t15_branch400_8_seed1": {**_SCREENED, "steps": 8, "temperature": 1.5, "branches": 400, "seed": 1},
    "branch8": {**_SCREENED, "steps": 8, "branches": True},
    # branch episodes end after 4 turns of their own (`RLConfig.branch_turns`)
    "bt4_8": {**_SCREENED, "steps": 8, "temperature": 1.5, "branches": True, "branch_turns": 4},
    "bt4_g4_8": _BT4_G4,
    "bt4_g4_8_seed1": {**_BT4_G4, "seed": 1},
    "bt4_g4_kl01_8": {**_BT4_G4, "kl_beta": 0.1},
    "bt4_g4_16": {**_BT4_G4, "steps": 16},
    "bt4_400_g4_8": {**_BT4_G4, "branches": 400},
    # branches teach "do not re-track the lamp" in states where it is in view; the SFT anchor keeps the
    # teacher's tracking where it is not (the KL term only holds the sampled states)
    "bt4_g4_anchor_8": {**_BT4_G4, "anchor": 1.0},
    "bt4_g4_anchor_16": {**_BT4_G4, "anchor": 1.0, "steps": 16},
    "bt4_g4_anchor_8_seed1": {**_BT4_G4, "anchor": 1.0, "seed": 1},
    "bt4_g4_pos_8": {**_BT4_G4, "branch_advantage": "positive"},
    "bt4_g4_pos_16": {**_BT4_G4, "branch_advantage": "positive", "steps": 16},
    "bt4_g4_pos_anchor_8": {**_BT4_G4, "branch_advantage": "positive", "anchor": 1.0},
    "bt4_g4_pos_anchor_8_seed1": {**_BT4_G4, "branch_advantage": "positive", "anchor": 1.0, "seed": 1},
    "bt4_400_g4_anchor_8": {**_BT4_G4, "branches": 400, "anchor": 1.0},
    "bt4_400_g4_anchor_8_seed1": {**_BT4_G4, "branches": 400, "anchor": 1.0, "seed": 1},
    # seed soups (`recipes.soup`): the arm under RL seeds 0 and 1, the policy their weight average
    "bt4_g4_soup2_8": {**_BT4_G4, "soup": 2},
    "bt4_g4_anchor_soup2_8": {**_BT4_G4, "anchor": 1.0, "soup": 2},
    "bt4_g4_anchor_soup3_8": {**_BT4_G4, "anchor": 1.0, "soup": 3},
    "bt4_g4_pos_anchor_soup2_8": {**_BT4_G4, "branch_advantage": "positive", "anchor": 1.0, "soup": 2},
    "bt4_400_g4_anchor_soup2_8": {**_BT4_G4, "branches": 400, "anchor": 1.0, "soup": 2},
    # branches also where a lost screened game cycles through states (`pipeline.screened_games` cycles)
    "bt4_cyc_g4_anchor_8": {**_BT4_G4, "anchor": 1.0, "cycles": True},
    "bt4_cyc_g4_anchor_8_seed1": {**_BT4_G4, "anchor": 1.0, "cycles": True, "seed": 1},
    "bt4_cyc_g4_anchor_soup2_8": {**_BT4_G4, "anchor": 1.0, "cycles": True, "soup": 2},
    # the teacher also labels the step's own rollout states where the policy acted otherwise
    # (experiments/on_policy_anchor: DAgger inside the RL step): every such state, or (lost_env) only
    # lost episodes' where the teacher would act in the world
    "bt4_g4_anchor_relall_soup2_8": {**_BT4_G4, "anchor": 1.0, "relabel": 1.0, "relabel_filter": "all", "soup": 2},
    "bt4_g4_anchor_rel_soup2_8": {**_BT4_G4, "anchor": 1.0, "relabel": 1.0, "soup": 2},
    "bt4_g4_anchor_rel025_soup2_8": {**_BT4_G4, "anchor": 1.0, "relabel": 0.25, "soup": 2},
    "bt4_400cyc_g4_anchor_soup2_8": {**_BT4_G4, "branches": 400, "anchor": 1.0, "cycles": True, "soup": 2},
    # GRPO lr decay (`GRPOConfig.lr_schedule`): cosine from lr to 0.1 x lr over the run's steps
    "bt4_g4_anchor_cos_soup2_8": {**_BT4_G4, "anchor": 1.0, "soup": 2, "lr_schedule": "cosine"},
    "bt4_g4_anchor_cos_soup2_16": {**_BT4_G4, "anchor": 1.0, "soup": 2, "lr_schedule": "cosine", "steps": 16},
    # cost (issue 50): what a won episode costs. ``cost_won_8``: groups only on screened games the SFT model
    # won, so every group's reward spread is the efficiency term's; λ_eff 5 (1) makes a step worth 5/30 of
    # a point and the std floor 0.1 (1.0) lets that spread set the advantages' size; ``cost_won_t15_8`` samples
    # it at T = 1.5. ``eff5_8``: the main job's RL (branches, anchor) with λ_eff 5 alone
    "cost_won_8": _COST_WON,
    "cost_won_t15_8": {**_COST_WON, "temperature": 1.5},
    "eff5_8": {**_BT4_G4, "anchor": 1.0, "lambda_eff": 5.0},
    # ``cost_won_8`` as the main job runs RL: a soup over RL seeds 0 and 1 (seed 0's run is ``cost_won_8``'s)
    "cost_won_soup2_8": {**_COST_WON, "soup": 2},
    # the main job's RL with its game groups as ``cost_won_8``'s: success from the branches, cost from the won games
    "mix_cost_soup2_8": {**_BT4_G4, "won_only": True, "lambda_eff": 5.0, "std_floor": 0.1, "anchor": 1.0, "soup": 2},
    # the cost stage after the main job's GRPO (its soup, ``rl/final``), not from SFT
    "cost_after_rl_8": {**_COST_WON, "init": "rl"},
    # ``cost_won_8`` with the SFT anchor at weight 4: the teacher's rows (every one with its notes) held harder
    # against the cost signal, which from the Go back SFT models cut steps mostly by skipping notes
    "cost_won_anchor4_8": {**_COST_WON, "anchor": 4.0},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--run",
        nargs="+",
        default=["runs/main"],
        help="finished main jobs (their SFT models and dev evaluations); several: one per seed",
    )
    ap.add_argument("--out", default="runs/rl_levers", help="arm directories (several runs: <out>/seed<S>)")
    ap.add_argument("--results", default="benchmarks/results/student/rl_levers")
    ap.add_argument("--arms", nargs="+", default=[a for a in ARMS if not ARMS[a].get("relabel")], choices=list(ARMS))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--valid-seen", action="store_true", help="also evaluate each arm on the run's eval split")
    ap.add_argument("--unseen", action="store_true", help="also evaluate each arm on the run's unseen-room panel")
    ap.add_argument("--note", default="", help="a line for the report (how the arms ran: alone, side by side)")
    args = ap.parse_args()
    if relabel := [a for a in args.arms if ARMS[a].get("relabel")]:
        sys.exit(
            f"{', '.join(relabel)}: on-policy teacher labels left the product (no RL loop hands the anchor "
            "its rollout states); see experiments/on_policy_anchor/JOURNAL.md for how to rerun them"
        )

    import torch

    from evoharness.eval.run_report import sign_test

    torch.set_num_threads(args.threads)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    runs = [run_arms(Path(r), Path(args.out), args, len(args.run) > 1) for r in args.run]
    names = ["dev"] + ([runs[0]["eval_split"]] if args.valid_seen else []) + (["unseen"] if args.unseen else [])
    several = len(runs) > 1
    head = (
        f"# GRPO levers ({len(runs)} main jobs' SFT models, seeds {', '.join(str(r['seed']) for r in runs)})"
        if several
        else f"# GRPO levers (one main job's SFT model, seed {runs[0]['seed']})"
    )
    sft_dev = ", ".join(f"{r['sft_dev']}/{r['n_dev']}" for r in runs)
    lines = [
        head,
        "",
        f"`python -m experiments.rl_levers.rl_levers {' '.join(sys.argv[1:])}`; SFT on the development games: "
        f"{sft_dev}. Each arm: its GRPO steps, each on its games per step x its samples "
        "per game (trained turns: per episode, drawn), T_max 30, then its final model on the development games "
        "(greedy, cap 50). wins / losses: games only the arm / only SFT won; p: exact two-sided sign test.",
        "",
        "| " + ("SFT seed | " if several else "") + "arm | RL games | branches | steps | games/step | samples | "
        "trained turns | T | lr | KL β | epochs | anchor | advantage | RL seed | RL s | "
        + " | ".join(f"{p} | wins | losses | p" for p in names)
        + " |",
        "|---" * (15 + several + 4 * len(names)) + "|",
    ] + [
        (
            "| " + (f"{run['seed']} | " if several else "") + f"{r['arm']} | {r['rl_games']} | {_branches(r)} | "
            f"{r['steps']} | {r['games_per_step']} | {r['samples']} | "
            f"{r['train_turns'] or 'all'} | {r['temperature']} | {_lr(r)} | "
            f"{r.get('kl_beta', 0.01):g} | {r.get('epochs', 1)} | {_anchor(r)} | "
            f"{r['estimator']} | {_seeds(r)} | {r['rl_seconds']} | "
            + " | ".join(f"{r[p]['won']}/{r[p]['n']} | {r[p]['wins']} | {r[p]['losses']} | {r[p]['p']}" for p in names)
            + " |"
        )
        for run in runs
        for r in run["rows"]
    ]
    lines += [
        "",
        "Cost on the games both SFT and the arm won (paired per game; p: exact sign-flip permutation test on "
        "the per-game differences, `eval.cost`):",
        "",
        "| "
        + ("SFT seed | " if several else "")
        + "arm | "
        + " | ".join(f"{p} both won | steps SFT -> arm | fewer / more | p | harness calls | p" for p in names)
        + " |",
        "|---" * (1 + several + 6 * len(names)) + "|",
    ]
    for run in runs:
        for r in run["rows"]:
            cells = []
            for p in names:
                c = r[p]["cost"]
                st, hc = c["steps"], c["harness_calls"]
                cells.append(
                    f"{c['both_won']} | {st['a']:.2f} -> {st['b']:.2f} | {st['fewer']} / {st['more']} | "
                    f"{st['p']:.3g} | {hc['a']:.2f} -> {hc['b']:.2f} | {hc['p']:.3g}"
                )
            lines.append("| " + (f"{run['seed']} | " if several else "") + f"{r['arm']} | " + " | ".join(cells) + " |")
    if several:  # each arm's wins and losses summed over the independent SFT models (a fair coin each under H0)
        lines += [
            "",
            "Pooled over the SFT models (sums; p: the exact sign test on the summed wins and losses):",
            "",
            "| arm | " + " | ".join(f"{p} | wins | losses | p" for p in names) + " |",
            "|---" * (1 + 4 * len(names)) + "|",
        ]
        for arm in args.arms:
            cells = []
            for p in names:
                got = [r[p] for run in runs for r in run["rows"] if r["arm"] == arm]
                w, lo = sum(g["wins"] for g in got), sum(g["losses"] for g in got)
                cells.append(
                    f"{sum(g['won'] for g in got)}/{sum(g['n'] for g in got)} | {w} | {lo} | "
                    f"{float(f'{sign_test(w, lo):.3g}')}"
                )
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
        lines += pooled_cost(runs, args.arms, [p for p in names if p != "unseen"])
    lines += [
        "",
        f"{os.cpu_count()} CPUs; load average (1/5/15 min) at start {load}. RL seconds are wall time "
        "at the given threads (arms may have run side by side: compare them only within one run).",
    ]
    lines += [args.note] if args.note else []
    res = Path(args.results)
    res.parent.mkdir(parents=True, exist_ok=True)
    res.with_suffix(".md").write_text("\n".join(lines) + "\n")
    res.with_suffix(".json").write_text(
        json.dumps(
            {"run": args.run[0], "rows": runs[0]["rows"]}
            if not several
            else {"runs": [{"run": r["run"], "seed": r["seed"], "rows": r["rows"]} for r in runs]},
            indent=1,
        )
    )
    print("\n".join(lines))


def pooled_cost(runs: list[dict], arms: list[str], panels: list[str]) -> list[str]:
    """Markdown lines: each arm's cost against its SFT model on the games both won, pooled over the SFT
    models and `panels` (issue 50's cost test: valid_seen and dev, paired per game, `eval.cost`)."""
    from evoharness.eval.cost import summarize_pairs

    lines = [
        "",
        f"Cost pooled over the SFT models on the games both won ({' + '.join(panels)}; paired per game; p: exact "
        "sign-flip permutation test on the per-game differences):",
        "",
        "| arm | games both won | steps SFT -> arm | fewer / more | p | harness calls | fewer / more | p |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for arm in arms:
        got = [r[p]["cost"]["pairs"] for run in runs for r in run["rows"] if r["arm"] == arm for p in panels]
        st = summarize_pairs([x for g in got for x in g["steps"]])
        hc = summarize_pairs([x for g in got for x in g["harness_calls"]])
        lines.append(
            f"| {arm} | {sum(len(g['steps']) for g in got)} | {st['a']:.2f} -> {st['b']:.2f} | {st['fewer']} / "
            f"{st['more']} | {st['p']:.3g} | {hc['a']:.2f} -> {hc['b']:.2f} | {hc['fewer']} / {hc['more']} | "
            f"{hc['p']:.3g} |"
        )
    return lines


def run_arms(run: Path, out: Path, args: argparse.Namespace, per_seed: bool) -> dict:
    """Train and evaluate ``args.arms`` from the SFT model of main job `run` (arm directories in
    `out`, or ``out/seed<S>`` when `per_seed`); returns the run's seed, SFT dev wins and rows."""
    from evoharness.config.rl import Branch
    from evoharness.config.sft import SFTAnchorConfig
    from evoharness.eval.cost import cost_pairs, paired_cost
    from evoharness.eval.evaluate import evaluate_many
    from evoharness.eval.run_report import sign_test
    from evoharness.files import read_jsonl
    from evoharness.pipeline import (
        RunConfig,
        dev_split,
        eval_config,
        model_policy,
        rl_config,
        screen_rl_games,
        screened_games,
    )
    from evoharness.recipes.alfworld import train_tasks
    from evoharness.recipes.rl import train_rl

    cfg = RunConfig.model_validate_json((run / "run_config.json").read_text())
    out = out / f"seed{cfg.seed}" if per_seed else out
    dev_file = run / "dev_games.json"  # the run's own draw (dev_split's rule may have changed since it ran)
    dev_ids = json.loads(dev_file.read_text()) if dev_file.is_file() else [t.task_id for t in dev_split(cfg)[1]]

    def sft_won(name: str) -> dict[str, bool]:
        return {e["task_id"]: e["won"] for e in read_jsonl(run / "eval" / name / "episodes.jsonl")}

    sft_dev = sft_won("dev_sft")
    panels = [("dev", dev_ids, sft_dev)] + ([(cfg.eval_split, None, sft_won("sft"))] if args.valid_seen else [])
    if args.unseen:
        if not cfg.unseen_split:
            sys.exit(f"{run}: --unseen, but the run has no unseen-room panel (unseen_split)")
        panels.append(("unseen", None, sft_won("unseen_sft")))
    baseline = {"dev": "dev_sft", "unseen": "unseen_sft"}  # the run's SFT evaluation of each panel

    def screen(n: int) -> dict:
        """`n` screened training games (each count evaluated into its own directory)."""
        path = out / f"screen{n}.json"
        if not path.exists():
            path.write_text(json.dumps(screen_rl_games(cfg, run, n, out / f"screen{n}"), indent=1))
        return json.loads(path.read_text())

    rows = []
    for name in args.arms:
        arm, d = ARMS[name], out / name
        d.mkdir(parents=True, exist_ok=True)
        arm_cfg = cfg.model_copy(deep=True)
        arm_cfg.rl.sft_anchor = SFTAnchorConfig(coef=arm["anchor"]) if arm.get("anchor") else None
        rl = rl_config(arm_cfg, run)
        rl.out_dir, rl.threads = str(d / "rl"), args.threads
        if arm.get("init") == "rl":  # from the run's GRPO model; KL and the anchor as from SFT
            rl.model_path = str(run / "rl" / "final")
        rl.grpo.temperature, rl.grpo.advantage.estimator = arm["temperature"], arm["estimator"]
        rl.steps, rl.grpo.prompts_per_step = arm["steps"], arm["games_per_step"]
        rl.grpo.group_size = arm.get("samples", rl.grpo.group_size)
        rl.seed, rl.grpo.lr = arm.get("seed", cfg.seed), arm.get("lr", rl.grpo.lr)
        rl.grpo.kl_beta, rl.grpo.epochs = arm.get("kl_beta", rl.grpo.kl_beta), arm.get("epochs", rl.grpo.epochs)
        rl.grpo.max_train_turns = arm.get("train_turns", rl.grpo.max_train_turns)
        rl.grpo.lr_schedule = arm.get("lr_schedule", rl.grpo.lr_schedule)
        rl.grpo.reward.lambda_eff = arm.get("lambda_eff", rl.grpo.reward.lambda_eff)
        rl.grpo.advantage.std_floor = arm.get("std_floor", rl.grpo.advantage.std_floor)
        if arm["screen"]:
            rl.games = screen(arm["screen"])["lost" if arm.get("lost_only") else "games"]
        if arm.get("won_only"):  # every screened game the SFT model won
            screened = read_jsonl(out / f"screen{arm['screen']}" / "eval" / "rl_screen" / "episodes.jsonl")
            rl.games = [e["task_id"] for e in screened if e["won"]]
        if branches := arm.get("branches"):  # True: the arm's own screening's; N: N screened games'
            n = arm["screen"] if branches is True else branches
            found = screen(n)["branches"]
            if arm.get("cycles"):  # the same screening's episodes, cycles too (`screened_games`)
                found = screened_games(
                    read_jsonl(out / f"screen{n}" / "eval" / "rl_screen" / "episodes.jsonl"), cycles=True
                )["branches"]
            rl.branches = [Branch(**b) for b in found]
        rl.branch_turns, rl.branch_advantage = arm.get("branch_turns"), arm.get("branch_advantage", "both")
        rl.soup_seeds = arm.get("soup", 1)
        final = d / "rl" / "final"
        if not final.exists():
            t = time.perf_counter()
            train_rl(rl)
            if rl.soup_seeds == 1:
                (d / "rl_seconds.txt").write_text(f"{time.perf_counter() - t:.0f}")
        if rl.soup_seeds > 1:  # its seeds' logged step times (seed runs copied in were timed elsewhere)
            secs = sum(r.get("timing_s/step", 0) for r in read_jsonl(d / "rl" / "metrics.jsonl"))
            (d / "rl_seconds.txt").write_text(f"{secs:.0f}")
        row = {
            "arm": name,
            "seed": rl.seed,
            "lr": rl.grpo.lr,
            "samples": rl.grpo.group_size,
            "train_turns": rl.grpo.max_train_turns,
            "kl_beta": rl.grpo.kl_beta,
            "epochs": rl.grpo.epochs,
            "anchor": arm.get("anchor", 0),
            **arm,
            "rl_games": len(rl.games) if rl.games else len(train_tasks(rl)),
            "n_branches": len(rl.branches),
            "rl_seconds": (d / "rl_seconds.txt").read_text().strip() if (d / "rl_seconds.txt").exists() else "-",
        }
        todo = [
            eval_config(
                cfg,
                d,
                f"{panel}_final",
                model_policy(cfg, final),
                final / "experience.json",
                games,
                split=cfg.unseen_split if panel == "unseen" else None,
            )
            for panel, games, _ in panels
            if not (d / "eval" / f"{panel}_final" / "summary.json").exists()
        ]
        evaluate_many(todo)  # the panels in one pool of lock-step batches
        for panel, _games, base in panels:
            ev = d / "eval" / f"{panel}_final"
            episodes = read_jsonl(ev / "episodes.jsonl")
            won = {e["task_id"]: e["won"] for e in episodes}
            sft_name = baseline.get(panel, "sft")
            sft_episodes = read_jsonl(run / "eval" / sft_name / "episodes.jsonl")
            cost = paired_cost(sft_episodes, episodes)
            # per-game (SFT, arm) costs of the games both won, for the pooled cost test over SFT models
            cost["pairs"] = {k: cost_pairs(sft_episodes, episodes, k) for k in ("steps", "harness_calls")}
            wins, losses = sum(won[g] and not base[g] for g in base), sum(base[g] and not won[g] for g in base)
            row[panel] = {
                "won": sum(won.values()),
                "n": len(won),
                "wins": wins,
                "losses": losses,
                "p": float(f"{sign_test(wins, losses):.3g}"),
                "cost": cost,
            }
        rows.append(row)
    return {
        "run": str(run),
        "seed": cfg.seed,
        "eval_split": cfg.eval_split,
        "sft_dev": sum(sft_dev.values()),
        "n_dev": len(dev_ids),
        "rows": rows,
    }


def _lr(row: dict) -> str:
    """The lr column: the peak lr, and its decay when the arm sets one (`GRPOConfig.lr_schedule`)."""
    return f"{row['lr']:g}" + (" cosine to 0.1x" if row.get("lr_schedule") == "cosine" else "")


def _seeds(row: dict) -> str:
    """The RL seed column: the seed, or a soup's seeds (`recipes.soup`)."""
    n = row.get("soup", 1)
    return str(row["seed"]) if n == 1 else f"{', '.join(str(row['seed'] + k) for k in range(n))} (average)"


def _branches(row: dict) -> str:
    """The branches column: how many start states, the own-turn cap of a branch episode, whether a
    branch group's negative advantages are dropped (`RLConfig.branch_advantage`), and whether lost
    episodes that cycle gave branches too (`pipeline.screened_games`)."""
    n = row["n_branches"]
    if not n:
        return "-"
    notes = (
        ([f"{row['branch_turns']} turns"] if row.get("branch_turns") else [])
        + (["advantage >= 0"] if row.get("branch_advantage") == "positive" else [])
        + (["cycles too"] if row.get("cycles") else [])
    )
    return f"{n} ({', '.join(notes)})" if notes else str(n)


def _anchor(r: dict) -> str:
    """The anchor column: its weight, and the on-policy teacher labels' weight and filter if any."""
    text = f"{r.get('anchor', 0):g}"
    if r.get("relabel"):
        text += f" + teacher labels {r['relabel']:g} ({r.get('relabel_filter', 'lost_env')})"
    return text


if __name__ == "__main__":
    main()
