"""Advantages for stage 2: GRPO group baseline, optional GiGPO step level.

Shapes: ``_N`` groups (one task each), ``_G`` trajectories per group,
``_T`` turns of one trajectory.

GRPO (Shao et al. 2024, DeepSeekMath Eq. 3 "outcome supervision"): one scalar
reward per trajectory, baselined by its group:

    A_i = (R_i − mean_j R_j) / (std_j R_j + ε)        (normalize_std=True)
    A_i =  R_i − mean_j R_j                           (normalize_std=False; Dr. GRPO,
                                                       Liu et al. 2025, "mean_norm" in verl-agent)

std is the unbiased (Bessel) sample std, as ``torch.std`` in verl. A group whose
rewards are all equal (or that has one member) carries no signal: every
advantage in it is exactly 0.

Std floor (an addition to the paper's rule, on by default): the divisor is
``max(std_j R_j, σ_min) + ε``. In an all-failure group the rewards differ only
by the shaping terms (efficiency, diversity, spam, invalid: tenths of a point),
and dividing by their tiny std turns those differences into advantages as
large as success vs failure (±1 and more). With σ_min = 1.0 (a tenth of the
success reward) such a group keeps its raw, small differences, while any group
with a success (std ≥ 3.3 for one success in 8) is normalised exactly as in the
paper. ``std_floor = 0`` is the paper's rule. `std_floor_active` says per
group whether the floor changed anything (logged as ``adv/std_floor_groups``).
At GiGPO's step level the floor is scaled like the returns (see below).

GiGPO (Feng et al. 2025, arXiv 2505.10978, verl-agent ``gigpo/core_gigpo.py``):

- episode level (paper Eq. 3): A^E(τ_i) = the GRPO advantage above;
- anchor states (Eq. 6): within one group, steps of different trajectories
  (or repeated steps of one) that act from the *same environment state* s̃ form
  a step group G^S(s̃). verl-agent keys it by exact equality of the text
  observation; here `anchor_key` hashes the observation the turn acted on
  together with the sorted admissible commands;
- step returns (Eq. 5): R_t = Σ_{k≥t} γ^{k−t} r_k. Our reward is per episode, so
  r_k = 0 except r_{T−1} = R(τ) (`terminal_step_rewards`), R_t = γ^{T−1−t} R(τ):
  from the same state, a step that leads to success sooner scores higher;
- step level (Eq. 7): A^S_t = (R_t − mean_{G^S} R) / (std_{G^S} R + ε), or
  without the std; a singleton step group gets 0 (as verl-agent). The std
  floor is in reward units and R_t = γ^k R(τ) (k = T−1−t), so a step group's
  floor is σ_min · max over its members of γ^k: an all-failure step group is
  floored as at the episode level, while a step group with a success late in
  a long episode (γ^k R small in absolute terms, but a success-vs-failure
  spread) keeps the paper's normalisation. `turn_advantages` counts the step
  groups with a spread and those where the floor acted (``adv/step_groups``,
  ``adv/step_floor_groups``);
- combined (Eq. 8): A_t = A^E(τ_i) + ω · A^S_t (paper: ω = 1, γ = 0.95).

Difference from verl-agent: its episode-level mean/std is taken over steps
(``compute_mean_std_cross_steps=True``, long trajectories weigh more); here it
is over trajectories, as the paper's Eq. 3.

Per-turn assignment: every completion token of turn t of trajectory i takes
A_{i,t} (= A_i for GRPO). `turn_advantages` returns them as [N][G][T] lists.

An episode that an environment error ended (``stop_reason == "error"``: a
game that failed to load, a hung step) is left out of its group's baseline
(`valid_members`) and gets advantage 0: its reward measures the
infrastructure, and counting it as a failure would push every valid member of
the group up.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence

import torch

from evoharness.config.rl import AdvantageConfig
from evoharness.rollout.records import Trajectory


def grpo_advantages(
    rewards_NG: torch.Tensor,
    normalize_std: bool = True,
    eps: float = 1e-6,
    std_floor: float = 0.0,
    valid_NG: torch.Tensor | None = None,
) -> torch.Tensor:
    """Group-relative advantages.

    Args:
        rewards_NG: [N, G] trajectory rewards, row = one group (same task).
        normalize_std: divide by the group's (unbiased) std.
        eps: added to the std.
        std_floor: σ_min, the std is clamped to at least this (0: the paper's rule).
        valid_NG: [N, G] bool, False for members whose reward measures nothing
            (an episode ended by an environment error): they are left out of
            their group's mean and std and get advantage 0. None: all valid.

    Returns:
        [N, G] float32 advantages; exactly 0 in all-equal or single-member groups
        (counting valid members only) and for invalid members.
    """
    r = rewards_NG.float()
    if r.dim() != 2:
        raise ValueError(f"rewards must be [n_groups, group_size], got {tuple(r.shape)}")
    if valid_NG is not None and not bool(valid_NG.all()):
        return _masked_grpo_advantages(r, valid_NG.bool(), normalize_std, eps, std_floor)
    flat = (r == r[:, :1]).all(dim=1, keepdim=True)  # [N, 1]
    adv = r - r.mean(dim=1, keepdim=True)
    if normalize_std and r.shape[1] > 1:
        adv = adv / (r.std(dim=1, keepdim=True).clamp(min=std_floor) + eps)
    return torch.where(flat, torch.zeros_like(adv), adv)


def _masked_grpo_advantages(
    r: torch.Tensor, valid: torch.Tensor, normalize_std: bool, eps: float, std_floor: float
) -> torch.Tensor:
    """`grpo_advantages` over the valid members of each group only."""
    n = valid.sum(dim=1, keepdim=True)
    mean = (r * valid).sum(dim=1, keepdim=True) / n.clamp(min=1)
    adv = (r - mean) * valid
    hi = r.masked_fill(~valid, float("-inf")).amax(dim=1, keepdim=True)
    lo = r.masked_fill(~valid, float("inf")).amin(dim=1, keepdim=True)
    flat = (n < 2) | (hi == lo)
    if normalize_std:
        std = ((adv**2).sum(dim=1, keepdim=True) / (n - 1).clamp(min=1)).sqrt()
        adv = adv / (std.clamp(min=std_floor) + eps)
    return torch.where(flat | ~valid, torch.zeros_like(adv), adv)


def std_floor_active(
    rewards_NG: torch.Tensor, cfg: AdvantageConfig, valid_NG: torch.Tensor | None = None
) -> torch.Tensor:
    """[N] bool: groups with a reward spread whose std is below ``cfg.std_floor``,
    i.e. where the floor (not the paper's rule) set the advantage scale
    (over the `valid_NG` members only, as `grpo_advantages`)."""
    r = rewards_NG.float()
    if not cfg.normalize_std or r.shape[1] < 2:
        return torch.zeros(r.shape[0], dtype=torch.bool)
    if valid_NG is not None:
        return torch.stack(
            [
                std_floor_active(row[v].unsqueeze(0), cfg)[0] if int(v.sum()) > 1 else torch.tensor(False)
                for row, v in zip(r, valid_NG.bool())
            ]
        )
    flat = (r == r[:, :1]).all(dim=1)
    return ~flat & (r.std(dim=1) < cfg.std_floor)


def valid_members(groups: Sequence[Sequence[Trajectory]]) -> torch.Tensor:
    """[N, G] bool: False for an episode an environment error ended (``stop_reason ==
    "error"``: a game that failed to load, a hung step). Its reward measures the
    infrastructure, not the policy, so it takes no part in its group's baseline."""
    return torch.tensor([[t.stop_reason != "error" for t in grp] for grp in groups], dtype=torch.bool)


def discounted_returns(rewards_T: Sequence[float], gamma: float) -> list[float]:
    """R_t = Σ_{k≥t} γ^{k−t} r_k (GiGPO Eq. 5)."""
    out = [0.0] * len(rewards_T)
    running = 0.0
    for t in reversed(range(len(rewards_T))):
        running = float(rewards_T[t]) + gamma * running
        out[t] = running
    return out


def terminal_step_rewards(reward: float, n_turns: int) -> list[float]:
    """Per-step rewards of an episode-level reward: all of it on the last step."""
    return [0.0] * (n_turns - 1) + [float(reward)] if n_turns else []


def anchor_key(traj: Trajectory, t: int) -> str:
    """The environment state turn ``t`` acted from: the text it last saw (the
    initial observation, or turn t−1's feedback: observation, meta result or
    invalid-action message) plus the set of admissible commands, hashed."""
    seen = traj.initial_observation if t == 0 else traj.turns[t - 1].feedback
    adm = "\n".join(sorted(traj.turns[t].admissible_commands))
    return hashlib.sha1(f"{seen}\x00{adm}".encode()).hexdigest()


def step_advantages(
    returns_GT: Sequence[Sequence[float]],
    keys_GT: Sequence[Sequence[Hashable]],
    normalize_std: bool = True,
    eps: float = 1e-6,
    std_floor: float = 0.0,
    floor_scale_GT: Sequence[Sequence[float]] | None = None,
    stats: dict[str, int] | None = None,
) -> list[list[float]]:
    """GiGPO step-level advantages A^S for ONE group (Eq. 6-7).

    Args:
        returns_GT: per trajectory, the discounted return of each step.
        keys_GT: per trajectory, each step's anchor-state key (same shape).
        std_floor: σ_min in reward units (0: the paper's rule).
        floor_scale_GT: per step, the discount weight γ^k of its return (same
            shape); a step group's floor is ``std_floor * max`` of its members'
            weights. None: weight 1 (the floor as given).
        stats: if given, ``step_groups`` (step groups with a spread) and
            ``step_floor_groups`` (those the floor changed) are added to it.

    Returns:
        A^S with the same [G][T] shape; 0 for steps whose anchor state occurs once
        or whose step group has all-equal returns.
    """
    groups: dict[Hashable, list[tuple[int, int]]] = defaultdict(list)
    for i, keys in enumerate(keys_GT):
        if len(keys) != len(returns_GT[i]):
            raise ValueError(f"trajectory {i}: {len(keys)} keys for {len(returns_GT[i])} returns")
        for t, k in enumerate(keys):
            groups[k].append((i, t))
    out = [[0.0] * len(r) for r in returns_GT]
    if stats is not None:
        stats.setdefault("step_groups", 0)
        stats.setdefault("step_floor_groups", 0)
    for members in groups.values():
        if len(members) < 2:
            continue
        vals = torch.tensor([[returns_GT[i][t] for i, t in members]], dtype=torch.float64)
        floor = std_floor * (max(floor_scale_GT[i][t] for i, t in members) if floor_scale_GT is not None else 1.0)
        adv = grpo_advantages(vals, normalize_std, eps, floor)[0]
        if stats is not None and bool((vals != vals[:, :1]).any()):
            stats["step_groups"] += 1
            stats["step_floor_groups"] += int(normalize_std and float(vals.std()) < floor)
        for (i, t), a in zip(members, adv.tolist()):
            out[i][t] = a
    return out


def turn_advantages(
    groups: Sequence[Sequence[Trajectory]],
    rewards_NG: torch.Tensor,
    cfg: AdvantageConfig | None = None,
    key_fn: Callable[[Trajectory, int], Hashable] = anchor_key,
    stats: dict[str, int] | None = None,
) -> list[list[list[float]]]:
    """Advantage of every turn: [N][G][T] nested lists (T varies per trajectory).

    Args:
        groups: N groups of G trajectories each (a group = one task, G samples).
        rewards_NG: [N, G] trajectory rewards (`rewards.trajectory_reward(...).total`).
        cfg: estimator (``grpo`` or ``gigpo``) and its knobs.
        key_fn: anchor-state key of (trajectory, turn index), GiGPO only.
        stats: GiGPO only: receives the step-level floor counts (`step_advantages`).
    """
    cfg = cfg or AdvantageConfig()
    if tuple(rewards_NG.shape) != (len(groups), len(groups[0]) if groups else 0):
        raise ValueError(f"rewards {tuple(rewards_NG.shape)} do not match {len(groups)} groups")
    valid = valid_members(groups) if groups else None
    ep_NG = grpo_advantages(rewards_NG, cfg.normalize_std, cfg.eps, cfg.std_floor, valid).tolist()
    out: list[list[list[float]]] = []
    for n, group in enumerate(groups):
        per_traj = [[ep_NG[n][i]] * tr.steps for i, tr in enumerate(group)]
        if cfg.estimator == "gigpo":
            returns = [
                discounted_returns(terminal_step_rewards(float(rewards_NG[n, i]), tr.steps), cfg.gigpo_gamma)
                for i, tr in enumerate(group)
            ]
            # an errored episode's steps join no step group (each gets a key of its own: A^S = 0)
            keys = [
                [key_fn(tr, t) if bool(valid[n, i]) else ("error", i, t) for t in range(tr.steps)]
                for i, tr in enumerate(group)
            ]
            weights = [[cfg.gigpo_gamma ** (tr.steps - 1 - t) for t in range(tr.steps)] for tr in group]
            step = step_advantages(returns, keys, cfg.normalize_std, cfg.eps, cfg.std_floor, weights, stats)
            per_traj = [[a + cfg.gigpo_omega * s for a, s in zip(ep, st)] for ep, st in zip(per_traj, step)]
        out.append(per_traj)
    return out
