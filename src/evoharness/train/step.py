"""One RL step, the same for every schedule and backend (EvoHarness-RL §4; QwenGyre §3).

    rollout   P GRPO groups x G executions, finished
    reward    an ALFWorld trajectory's Eq. 5-6 (`train.rewards.trajectory_reward`), or a
              repository execution's partial score (None when its scoring was dropped)
    advantage group-relative (GRPO), optionally GiGPO step-level (`train.advantages`); a member an
              environment error ended (or whose scoring was dropped) takes no part in its group's
              baseline and trains nothing
    rows      the trainable turns (`train.grpo.TurnSample`): an ALFWorld turn, or a run of generated
              tokens on a sampled root-to-leaf path of a repository execution's trajectory tree
    updates   ``epochs`` passes over ``mini_batches`` slices of whole groups (`plan_updates`); per
              update the token weights 1/(M·N_j) over the slice, forward/backward per micro-batch
              (turn rows or tree-packed, the same objective: `train.trainer.Trainer.accumulate`), the
              SFT anchor's gradient, clip, AdamW at the step's lr (`lr_at`)
    metrics   one record per step (`rollout_metrics`, `group_metrics`, `update_metrics`)

Where the pieces run is the runtime's business: a workload (driver side) scores groups and turns
them into rows with this module, a `train.trainer.Trainer` in each train cell runs the updates
(`run_updates`). In-process is the one-cell case of the same code.

Streaming: with one update per step (``mini_batches = epochs = 1``) a micro-batch can train while
other executions still roll out (QwenGyre's streaming training): its rows carry the weight
1/(N·N_j) of all N executions of the step (`streamed_rows`), and the update scales the summed
gradient by N/M once M, the executions with trainable rows, is known (`stream_scale`).
Statistics of parts of an update (micro-batches, ranks) add up (`sum_stats`), updates average
(`step_stats`). With
more updates the later ones need the earlier ones' weights, so the whole batch trains at the
weight sync.
"""

from __future__ import annotations

import random
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from evoharness.config.rl import GRPOConfig
from evoharness.rollout.records import CallRecord, Trajectory
from evoharness.rollout.tree import TrajectoryTree, has_tokens, select_paths
from evoharness.train.advantages import grpo_advantages, std_floor_active, turn_advantages
from evoharness.train.grpo import TurnSample
from evoharness.train.rewards import RewardBreakdown, trajectory_reward
from evoharness.train.schedule import lr_lambda


@dataclass
class GroupScore:
    """One GRPO group, scored.

    Attributes:
        rewards: per member (0.0 for an invalid one).
        valid: per member: False when an environment error ended it (or its scoring was dropped).
        advantages: per member, one advantage per turn (ALFWorld) or per execution (``[a]``).
        breakdowns: per member, the reward's terms (ALFWorld; None for repository executions).
        stats: GiGPO's step-group counters.
    """

    rewards: list[float]
    valid: list[bool]
    advantages: list[list[float]]
    breakdowns: list[RewardBreakdown] | None = None
    stats: dict[str, int] = field(default_factory=dict)

    @property
    def has_signal(self) -> bool:
        """Its valid members' rewards differ (a GRPO signal)."""
        return len({r for r, v in zip(self.rewards, self.valid) if v}) > 1


def score_group(
    trajectories: Sequence[Trajectory], step: int, cfg: GRPOConfig, positive_only: bool = False
) -> GroupScore:
    """Rewards (Eq. 5-6 at RL epoch `step`) and per-turn advantages of one ALFWorld group.

    Args:
        positive_only: negative advantages are set to 0 (a branch group that reinforces its escapes only).
    """
    trajs = list(trajectories)
    breakdowns = [trajectory_reward(t, step, cfg.reward) for t in trajs]
    rewards = torch.tensor([[b.total for b in breakdowns]], dtype=torch.float32)
    stats: dict[str, int] = {}
    adv = turn_advantages([trajs], rewards, cfg.advantage, stats=stats)[0]
    if positive_only:
        adv = [[max(a, 0.0) for a in turns] for turns in adv]
    return GroupScore([float(x) for x in rewards[0]], [t.stop_reason != "error" for t in trajs], adv, breakdowns, stats)


def score_rewards(rewards: Sequence[float | None], cfg: GRPOConfig) -> GroupScore:
    """Group-relative advantages of one group of scalar rewards; None marks a member whose
    scoring was dropped (left out of the baseline, advantage 0)."""
    valid = [r is not None for r in rewards]
    r = torch.tensor([[0.0 if x is None else float(x) for x in rewards]], dtype=torch.float32)
    a = cfg.advantage
    adv = grpo_advantages(r, a.normalize_std, a.eps, a.std_floor, torch.tensor([valid]))[0].tolist()
    return GroupScore([float(x) for x in r[0]], valid, [[x] for x in adv])


def turn_rows(
    traj: Trajectory, advantages: Sequence[float], cfg: GRPOConfig, step: int, group: int | None = None
) -> list[TurnSample]:
    """The trainable turns of one ALFWorld trajectory.

    Skipped: an episode an environment error ended (its reward measures nothing), a branch's
    replayed prefix (not sampled), turns without token ids or with an empty completion. With
    ``cfg.max_train_turns`` at most that many turns are drawn, uniformly without replacement
    (seeded by `step` and the episode id): the token mean within a trajectory over the drawn turns
    estimates the full one, so the loss keeps its scale at a bounded cost. With ``cfg.j_max`` the
    turns are those whose calls end at the leaves QwenGyre's dedup sampling draws from the
    episode's trajectory tree (`rollout.tree.select_paths`; seeded likewise).

    Raises:
        ValueError: a turn whose log-probs and completion differ in length.
    """
    if traj.stop_reason == "error":
        return []
    pairs = list(zip(traj.turns, advantages, strict=True))[traj.info.get("replayed_turns", 0) :]
    if cfg.max_train_turns is not None and len(pairs) > cfg.max_train_turns:
        keep = sorted(random.Random(f"{step}:{traj.episode_id}").sample(range(len(pairs)), cfg.max_train_turns))
        pairs = [pairs[i] for i in keep]
    if cfg.j_max is not None:
        pairs = [pairs[i] for i in sampled_turns([t for t, _ in pairs], traj.episode_id, cfg.j_max, step)]
    out = []
    for turn, a in pairs:
        if not turn.completion_token_ids or not turn.prompt_token_ids or turn.logprobs is None:
            continue
        if len(turn.logprobs) != len(turn.completion_token_ids):
            raise ValueError(f"{traj.episode_id} turn {turn.turn}: logprobs/completion length mismatch")
        out.append(
            TurnSample(
                list(turn.prompt_token_ids),
                list(turn.completion_token_ids),
                list(turn.logprobs),
                float(a),
                traj.episode_id,
                constraint=turn.constraint,
                group=group,
            )
        )
    return out


def sampled_turns(turns: Sequence[Any], episode_id: str, j_max: int, step: int) -> list[int]:
    """Indices of the `turns` whose calls end at the leaves `select_paths` draws (at most `j_max`)
    from their trajectory tree."""
    tree, index = TrajectoryTree(episode_id), []
    for i, t in enumerate(turns):
        if has_tokens(t):
            tree.add_call(t.prompt_token_ids, t.completion_token_ids, t.logprobs)
            index.append(i)
    sel = select_paths(tree, j_max, seed=step)
    return sorted(index[c] for leaf in sel.leaves for c in tree.nodes[leaf].ends)


def call_rows(
    records: Sequence[CallRecord], advantage: float, cfg: GRPOConfig, step: int, group: int | None = None
) -> tuple[list[TurnSample], dict[str, int]]:
    """The trainable rows of one repository execution: its calls folded into a prefix-shared
    `TrajectoryTree`, up to ``cfg.j_max`` root-to-leaf paths sampled by role-priority dedup
    sampling (None: every path), and each maximal run of generated tokens on a selected path one
    row whose prompt is the path before it; a node on several selected paths trains on the first
    (QwenGyre §3: a shared prefix trains once). Returns the rows and the tree's sizes
    (``calls``, ``tokens``, ``trainable``, ``selected``)."""
    if not records:
        return [], {"calls": 0, "tokens": 0, "trainable": 0, "selected": 0}
    tree = TrajectoryTree.from_records(records)
    sel = select_paths(tree, cfg.j_max, seed=step)
    seen: set[int] = set()
    rows: list[TurnSample] = []
    for leaf in sel.leaves:
        seq: list[int] = []
        lps: list[float] = []
        train: list[bool] = []
        for n in tree.path(leaf):
            node, fresh = tree.nodes[n], n not in seen
            seen.add(n)
            seq += node.tokens
            lps += node.logprobs
            train += [fresh and g >= 0 for g in node.gen_call]
        i = 0
        while i < len(seq):
            if not train[i]:
                i += 1
                continue
            j = i
            while j < len(seq) and train[j]:
                j += 1
            rows.append(TurnSample(seq[:i], seq[i:j], lps[i:j], float(advantage), tree.execution_id, group=group))
            i = j
    return rows, {
        "calls": len(records),
        "tokens": tree.n_tokens,
        "trainable": tree.n_trainable,
        "selected": sel.n_tokens,
    }


def set_token_weights(rows: Sequence[TurnSample], m: int | None = None) -> None:
    """Set every row's per-token weight to 1/(M·N_j): N_j the completion tokens of its
    execution among `rows`, M the executions with any (or `m`, e.g. all of a step's executions
    when their rows stream in before M is known). QwenGyre: averaged over tokens within an
    execution, then across executions."""
    n_tok: dict[str, int] = defaultdict(int)
    for s in rows:
        n_tok[s.episode_id] += len(s.completion_ids)
    m = m if m is not None else sum(1 for n in n_tok.values() if n > 0)
    for s in rows:
        s.weight = 1.0 / (m * n_tok[s.episode_id]) if n_tok[s.episode_id] else 0.0


def streams(cfg: GRPOConfig) -> bool:
    """Whether micro-batches of a step can train as executions finish (one update per step)."""
    return cfg.mini_batches == 1 and cfg.epochs == 1


def streamed_rows(rows: Sequence[TurnSample], n_executions: int) -> list[TurnSample]:
    """`rows` (whole executions) weighted 1/(N·N_j), N the step's executions (module docstring)."""
    rows = list(rows)
    set_token_weights(rows, m=n_executions)
    return rows


def stream_scale(n_executions: int, trained: int) -> float:
    """N/M: what turns streamed rows' summed gradient into the step's loss gradient."""
    return n_executions / trained if trained else 1.0


def mini_batch_slices(rows: Sequence[TurnSample], mini_batches: int) -> list[list[TurnSample]]:
    """At most `mini_batches` slices of whole GRPO groups (the rows' ``group``), dealt
    round-robin in order of first appearance. One mini-batch: all `rows`, groups or not.

    Raises:
        ValueError: ``mini_batches > 1`` and a row without its group.
    """
    if mini_batches <= 1:
        return [list(rows)]
    if any(s.group is None for s in rows):
        raise ValueError("every row needs its GRPO group to be cut into mini-batches")
    groups = list(dict.fromkeys(s.group for s in rows))
    n = max(1, min(mini_batches, len(groups)))
    slot = {g: j % n for j, g in enumerate(groups)}
    return [[s for s in rows if slot[s.group] == j] for j in range(n)]


def plan_updates(rows: Sequence[TurnSample], cfg: GRPOConfig) -> list[list[TurnSample]]:
    """The step's updates: ``cfg.epochs`` passes over ``cfg.mini_batches`` slices of whole groups
    (verl's ``ppo_mini_batch_size`` / ``ppo_epochs``), token weights set over each slice. From the
    second update on the policy has moved, so ρ ≠ 1 and the PPO clip acts. [] when nothing trains."""
    if not rows:
        return []
    slices = mini_batch_slices(rows, cfg.mini_batches)
    for sl in slices:
        set_token_weights(sl)
    return [sl for _ in range(cfg.epochs) for sl in slices]


def lr_at(cfg: GRPOConfig, step: int, steps: int) -> float:
    """The learning rate of 0-based RL step `step` (the update that makes policy version step + 1):
    ``cfg.lr``, or with ``lr_schedule = "cosine"`` linear warm-up then cosine to
    ``min_lr_ratio`` x lr at ``lr_decay_steps`` (`steps`, the run's length, when None). A function
    of the step alone, so a resumed run and every cell agree on it."""
    if cfg.lr_schedule == "constant":
        return cfg.lr
    return cfg.lr * lr_lambda(step, cfg.lr_warmup_steps, cfg.lr_decay_steps or steps, cfg.min_lr_ratio)


# ---- the updates (run where the weights are: a `train.trainer.Trainer`) -------------------------


def run_updates(
    trainer: Any, updates: Sequence[Sequence[TurnSample]], lr: float, step: int, scale: float = 1.0
) -> list[dict[str, float]]:
    """The step's updates on `trainer` (`train.trainer.Trainer`): per update, accumulate its
    rows' gradient (``accumulate``), then ``apply`` it (the SFT anchor, a data-parallel group's
    all-reduce, clip, AdamW at `lr`). No `updates` is the streamed case: the gradient is already
    accumulated and one update applies it, times `scale` (`stream_scale`).

    Returns one metrics dict per update (`step_stats` merges ranks and updates).
    """
    trainer.prepare(updates)
    runs = []
    for j, rows in enumerate(updates or [[]]):
        m = trainer.accumulate(rows) if rows else {}
        m.update(trainer.apply(lr, step=step, update=j, scale=1.0 if updates else scale))
        runs.append({**m, "lr": lr})
    return runs


def _is_count(key: str) -> bool:
    return key.startswith("n_") or key in ("ratio_sum", "packed_tokens", "rows")


def sum_stats(parts: Sequence[dict[str, float]]) -> dict[str, float]:
    """Statistics of parts of one update (micro-batches, ranks) added up (``ratio_max``: the max);
    the update-wide ones (``grad_norm``, the anchor's) are taken where they are given."""
    out: dict[str, float] = {}
    for st in parts:
        for k, v in st.items():
            if k == "ratio_max":
                out[k] = max(out.get(k, 0.0), v)
            elif k in _UPDATE_WIDE:
                out.setdefault(k, v)
            else:
                out[k] = out.get(k, 0.0) + v
    return out


_WEIGHTED = ("loss", "pg_loss", "kl", "entropy")  # Σ w_k · term: scaled with the weights
_UPDATE_WIDE = ("grad_norm", "anchor_nll", "anchor_tokens", "lr")


def scale_stats(st: dict[str, float], scale: float) -> dict[str, float]:
    """Streamed micro-batches' sums (weights 1/(N·N_j)) as the step loss's (times N/M)."""
    return {k: v * scale if k in _WEIGHTED else v for k, v in st.items()}


def step_stats(updates: Sequence[dict[str, float]]) -> dict[str, float]:
    """One step's update statistics from its updates' (each already summed over micro-batches and
    ranks): the weighted losses and ``grad_norm`` averaged over updates, counts summed,
    ``ratio_max`` the max; plus ``updates``."""
    keys = dict.fromkeys(k for u in updates for k in u)
    n = max(1, len(updates))
    out = {
        k: (sum(u.get(k, 0) for u in updates) if _is_count(k) else sum(u.get(k, 0.0) for u in updates) / n)
        for k in keys
    }
    if "ratio_max" in out:
        out["ratio_max"] = max(u.get("ratio_max", 0.0) for u in updates)
    out["updates"] = len(updates)
    return out


def merged_update_metrics(
    micro: Sequence[dict[str, float]], ranks: Sequence[Sequence[dict[str, float]]], scale: float = 1.0
) -> dict[str, float]:
    """A step's `update_metrics` from where its statistics were made: the streamed
    micro-batches' (times the stream's `scale`, `stream_scale`) and each train rank's per-update
    ones (`run_updates`' results); ranks add up within an update, updates average."""
    n = max((len(r) for r in ranks), default=0)
    per_update = [sum_stats([r[j] for r in ranks if j < len(r)]) for j in range(n)]
    if micro:
        streamed = scale_stats(sum_stats(micro), scale)
        per_update = [sum_stats([streamed, per_update[0]] if per_update else [streamed])] + per_update[1:]
    return update_metrics(step_stats(per_update))


# ---- metrics -------------------------------------------------------------------------------


def rollout_metrics(trajs: Sequence[Trajectory], breakdowns: Sequence[RewardBreakdown]) -> dict[str, float]:
    """An ALFWorld step's rollout metrics: success, reward and its terms, steps, tokens, invalid
    actions, prompt fitting and harness calls per episode."""
    n = max(1, len(trajs))
    flat = [b.as_dict() for b in breakdowns]
    return {
        "success": sum(t.won for t in trajs) / n,
        # a float32 mean, as the group tensors are
        "reward": float(torch.tensor([b["total"] for b in flat], dtype=torch.float32).mean()) if flat else 0.0,
        **{f"reward/{k}": sum(float(b[k]) for b in flat) / n for k in (flat[0] if flat else {}) if k != "solved"},
        "steps_per_episode": sum(t.steps for t in trajs) / n,
        "completion_tokens_per_episode": sum(t.completion_tokens for t in trajs) / n,
        "invalid_per_episode": sum(t.invalid_actions for t in trajs) / n,
        # prompts over max_prompt_tokens: oldest history dropped (harness.prompt), counted per step
        "prompt/fitted_turns": sum(t.info.get("prompt_fit", {}).get("turns", 0) for t in trajs),
        "prompt/cut_tokens": sum(t.info.get("prompt_fit", {}).get("tokens_cut", 0) for t in trajs),
        **{
            f"harness/{v}_per_episode": sum(t.meta_calls[v] for t in trajs) / n
            for v in ("track", "commit", "recall", "note")
        },
    }


def group_metrics(scores: Sequence[GroupScore], cfg: GRPOConfig) -> dict[str, float]:
    """The step's advantage signal: groups with a reward spread, groups whose scale the std
    floor set, invalid members, GiGPO's counters."""
    stats: dict[str, int] = defaultdict(int)
    for s in scores:
        for k, v in s.stats.items():
            stats[k] += v
    floor = [
        bool(std_floor_active(torch.tensor([s.rewards]), cfg.advantage, torch.tensor([s.valid]))[0]) for s in scores
    ]
    return {
        "adv/signal_groups": sum(s.has_signal for s in scores),
        "adv/std_floor_groups": sum(floor),
        "rollout/env_errors": sum(not v for s in scores for v in s.valid),
        **{f"adv/{k}": v for k, v in stats.items()},
    }


def update_metrics(stats: dict[str, float]) -> dict[str, float]:
    """A step's update metrics under ``train/*`` names (`step_stats`' result): the losses,
    ``grad_norm``, the shares of tokens the PPO clip acted on (``clip_fraction``), whose
    behaviour importance weight hit its cap (``behaviour_capped_fraction``, decoupled PPO) and the
    grammar forced (``forced_fraction``), the mean and max ratio to the behaviour policy."""
    n = max(stats.get("n_tokens", 0), 1)
    out = {f"train/{k}": v for k, v in stats.items() if not _is_count(k)}
    out.update(
        {
            "train/n_tokens": int(stats.get("n_tokens", 0)),
            "train/clip_fraction": stats.get("n_clipped", 0) / n,
            "train/behaviour_capped_fraction": stats.get("n_capped", 0) / n,
            "train/ratio_mean": stats.get("ratio_sum", 0.0) / n,
            "train/forced_fraction": stats.get("n_forced", 0) / n,
        }
    )
    for k in ("packed_tokens", "rows"):
        if k in stats:
            out[f"train/{k}"] = int(stats[k])
    return out
