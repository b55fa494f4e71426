"""The EvoHarness-RL trajectory reward (stage 2, cost-aware GRPO; paper Eq. 5-6).

    R(τ) = S·1[solved]
         + λ_eff · 1[solved] · max(0, 1 − |τ|/T_max)          (efficiency)
         + λ_div(u) · R_div                                   (diversity)
         − λ_spam · min(R_spam, cap)                          (spam)
         − λ_inv · R_inv                                      (invalid actions)
         [+ token term: EXTENSION, not in the paper, off by default]

    λ_div(u) = (λ_div_max / 2) · (1 + cos(π · u / U))         (Eq. 6; u = RL epoch)

Defaults (reference.md §1): S = 10, λ_eff = 1.0, T_max = 70, λ_div_max = 0.5,
U = 150, λ_spam = 0.1 with R_spam capped at 10, λ_inv = 0.1.

The paper names the terms but not every counting rule; this module's reading:

- |τ| is ``traj.steps``: every turn (environment action, meta-action or
  invalid action) costs one step of the same budget.
- **Verb** = the first word of the action of a *valid* turn (kind ``env`` or
  ``meta``), lower-cased: ``go`` (``go to X``), ``take``, ``put``, ``open``,
  ``close``, ``toggle``, ``clean``, ``heat``, ``cool``, ``slice``, ``use``,
  ``examine``, ``look``, ``inventory``, and the meta verbs ``track``,
  ``commit``, ``recall``, ``note``. ALFWorld 0.4's ``move X to Y`` is the same
  verb as ``put X in/on Y`` and counts as ``put``. Invalid turns contribute no
  verb (gibberish must not earn diversity) but do count in |τ|.
  R_div = |distinct verbs| / |τ| (0 for an empty trajectory).
- **Spam** R_spam = number of valid turns that repeat an action with nothing
  changed in between:
    * an environment action identical to the previous environment action
      (meta and invalid turns in between change no world state). In ALFWorld an
      immediate repeat is always a no-op or a step back: a second ``open`` /
      ``take`` / ``go to`` gives "Nothing happens.", ``look`` / ``examine`` /
      ``inventory`` return the same text, ``toggle`` undoes itself;
    * a meta-action (verb and argument) identical to one already issued since
      the last environment action: the harness state it reads has not changed,
      so ``track`` / ``recall`` return the same text and a repeated ``commit`` /
      ``note`` writes nothing new.
  Invalid turns are never spam (they are penalised by R_inv; no double count).
  The penalty uses min(R_spam, cap), so it is at most λ_spam·cap = 1.0.
- **Invalid** R_inv = number of turns of kind ``invalid`` (unparseable output,
  non-admissible command, policy error). Not capped.

Token-budget term (EXTENSION, clearly not the paper's: its budget is the step
budget). With n = completion tokens the policy generated in the episode and a
per-episode budget B:
    ``lcpo`` (LCPO/L1-style hinge, Aggarwal & Welleck 2025): −α · max(0, n − B) / B
    ``dapo`` (DAPO soft overlong punishment, Yu et al. 2025, Eq. 13, with
            L_max = B and L_cache = f·B):
            0 if n ≤ B − L_cache;  α·((B − L_cache) − n)/L_cache if n ≤ B;  −α otherwise.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from evoharness.config.rl import RewardConfig
from evoharness.rollout.records import Trajectory

# Verbs that are the same action in different engine wordings.
VERB_ALIASES = {"move": "put"}


@dataclass
class RewardBreakdown:
    """Every term of R(τ). The first six fields are signed contributions
    (penalties negative) and sum to ``total``; the rest are the raw counts."""

    success: float
    efficiency: float
    diversity: float
    spam: float
    invalid: float
    token_penalty: float
    total: float
    solved: bool
    steps: int
    r_div: float
    n_spam: int
    n_invalid: int
    lambda_div: float
    completion_tokens: int

    def as_dict(self) -> dict[str, float | int | bool]:
        return asdict(self)


PAPER_DIV_EPOCHS = 150  # U of Table 4 (150 RL epochs)


def diversity_weight(epoch: float, cfg: RewardConfig) -> float:
    """λ_div(u) = (λ_div_max/2)(1 + cos(π u/U)), u clamped to [0, U] (Eq. 6); U = ``div_epochs``
    (unset: the paper's 150)."""
    big_u = float(cfg.div_epochs or PAPER_DIV_EPOCHS)
    u = min(max(float(epoch), 0.0), big_u)
    return cfg.lambda_div_max / 2.0 * (1.0 + math.cos(math.pi * u / big_u))


def _norm(action: str) -> str:
    return " ".join(action.lower().split())


def action_verb(action: str) -> str:
    """First word of an action, lower-cased, aliases folded (``move`` -> ``put``)."""
    words = action.lower().split()
    return VERB_ALIASES.get(words[0], words[0]) if words else ""


def distinct_verbs(traj: Trajectory) -> set[str]:
    """Verbs of the valid (env/meta) turns; invalid turns contribute none."""
    return {v for t in traj.turns if t.kind in ("env", "meta") and (v := action_verb(t.action))}


def spam_turns(traj: Trajectory) -> list[int]:
    """Indices of the turns that repeat an action with nothing changed in between (the R_spam
    rule of the module docstring)."""
    out: list[int] = []
    last_env: str | None = None
    metas_since_env: set[str] = set()
    for i, t in enumerate(traj.turns):
        a = _norm(t.action)
        if t.kind == "env":
            if a == last_env:
                out.append(i)
            last_env = a
            metas_since_env.clear()
        elif t.kind == "meta":
            if a in metas_since_env:
                out.append(i)
            metas_since_env.add(a)
    return out


def count_spam(traj: Trajectory) -> int:
    """Uncapped R_spam (see the module docstring for the rule)."""
    return len(spam_turns(traj))


def completion_token_count(traj: Trajectory) -> int:
    """Tokens the policy generated in the episode: the TITO ids where recorded,
    else the usage count."""
    return sum(
        len(t.completion_token_ids) if t.completion_token_ids is not None else t.completion_tokens for t in traj.turns
    )


def token_penalty(n_tokens: int, cfg: RewardConfig) -> float:
    """EXTENSION: the (≤ 0) token-budget term for an episode of ``n_tokens``."""
    b = float(cfg.token_budget)
    if cfg.token_penalty == "lcpo":
        return -cfg.token_alpha * max(0.0, n_tokens - b) / b
    if cfg.token_penalty == "dapo":
        cache = cfg.token_cache_frac * b
        if n_tokens <= b - cache:
            return 0.0
        if n_tokens <= b:
            return cfg.token_alpha * ((b - cache) - n_tokens) / cache
        return -cfg.token_alpha
    return 0.0


def trajectory_reward(traj: Trajectory, epoch: float, cfg: RewardConfig | None = None) -> RewardBreakdown:
    """R(τ) of one episode at RL epoch ``epoch`` (u in Eq. 6), every term separately. T_max of the
    efficiency term is ``cfg.t_max`` (an RL run's step cap), or unset the episode's own cap.

    Raises:
        ValueError: no T_max (``cfg.t_max`` unset and the trajectory records no cap)."""
    cfg = cfg or RewardConfig()
    t_max = cfg.t_max or traj.max_steps
    if not t_max:
        raise ValueError(f"{traj.episode_id}: no step budget T_max for the efficiency term (set reward.t_max)")
    solved = bool(traj.won)
    steps = traj.steps
    r_div = len(distinct_verbs(traj)) / steps if steps else 0.0
    n_spam = count_spam(traj)
    n_inv = traj.invalid_actions
    lam_div = diversity_weight(epoch, cfg)
    n_tok = completion_token_count(traj)

    success = cfg.success_reward * solved
    efficiency = cfg.lambda_eff * solved * max(0.0, 1.0 - steps / t_max)
    diversity = lam_div * r_div
    spam = -cfg.lambda_spam * min(n_spam, cfg.spam_cap)
    invalid = -cfg.lambda_inv * n_inv
    tok = token_penalty(n_tok, cfg)
    total = success + efficiency + diversity + spam + invalid + tok
    return RewardBreakdown(
        success=success,
        efficiency=efficiency,
        diversity=diversity,
        spam=spam,
        invalid=invalid,
        token_penalty=tok,
        total=total,
        solved=solved,
        steps=steps,
        r_div=r_div,
        n_spam=n_spam,
        n_invalid=n_inv,
        lambda_div=lam_div,
        completion_tokens=n_tok,
    )
